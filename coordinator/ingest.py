"""MQTT ingest: reports arrive from a receiver process, are validated and committed durably in batches, and only
then acknowledged.

The MQTT client lives in its own process (:mod:`coordinator.mqtt_receiver`: paho-mqtt, QoS 1, a persistent session,
manual acknowledgements), so that paho's pure-Python receive path and this process's validate-and-commit run on two
cores at once. It hands over batches of ``(topic, payload)``; each batch is validated
(:meth:`coordinator.validate.Validator.check_batch`), committed in one transaction
(:meth:`coordinator.store.Store.commit_batch`), and only then does the receiver send the PUBACKs of the whole batch —
accepted, duplicate and rejected alike. A crash before the commit loses nothing (the broker redelivers the
unacknowledged messages); a crash between commit and PUBACK makes the redelivered copies ``duplicate``
(acknowledged, not stored again). Batches are committed one at a time, in arrival order; the receiver keeps at most
a few of them in flight, then the broker holds the rest.

The receiver dies with this process (end of file on its pipe; it exits without acknowledging anything in flight).
If it dies alone, it is restarted; the batches it handed over and that commit afterwards are acknowledged by
nobody, so the broker redelivers them and they count as ``duplicate``.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

from coordinator.metrics import Metrics
from coordinator.mqtt_receiver import MAX_BATCHES_IN_FLIGHT, IngestSettings, subscription_topic
from coordinator.store import Store, StoredReport
from coordinator.validate import DUPLICATE, Validator
from protocols import wire

__all__ = ["IngestSettings", "IngestWorker", "subscription_topic", "MAX_BATCHES_IN_FLIGHT"]

log = logging.getLogger(__name__)

#: Back-off between attempts at a batch that failed (the store unavailable): first wait, and the cap.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0
#: Wait before restarting a receiver process that died.
RESTART_DELAY_S = 1.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


class IngestWorker:
    """One MQTT ingest worker: a receiver process (the MQTT client) and, here, a thread that validates, commits and
    answers ``done``."""

    def __init__(self, settings: IngestSettings, store: Store, validator: Validator, metrics: Metrics | None = None) -> None:
        settings.check()
        self.settings = settings
        self.store = store
        self.validator = validator
        self.metrics = metrics or Metrics()
        self.topic = subscription_topic(settings.shared_group)
        #: the MQTT protocol version in use (4 = 3.1.1, 5), as the receiver reports it
        self.protocol = 4 if settings.protocol == "3.1.1" else 5
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()
        self._requests: dict[int, list] = {}  # publish request id → [Event, error]
        self._request_ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: float = 10.0) -> None:
        """Start the receiver process and the commit thread; wait until the receiver is subscribed."""
        self._stop.clear()
        self._subscribed.clear()
        self._spawn()
        self._thread = threading.Thread(target=self._run, name="haarvest-ingest", daemon=True)
        self._thread.start()
        if wait and not self._subscribed.wait(wait):
            self.stop(drain=False)
            raise TimeoutError(f"could not subscribe on {self.settings.host}:{self.settings.port} in {wait}s")

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        self._proc = subprocess.Popen([sys.executable, "-m", "coordinator.mqtt_receiver", str(theirs.fileno())],
                                      pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        with self._send_lock:
            self._conn = Connection(ours.detach())
        self._send(("settings", asdict(self.settings)))

    def stop(self, drain: bool = True) -> None:
        """Stop: with ``drain``, commit and acknowledge what was received first; then the receiver disconnects."""
        if not drain:
            self._stop.set()  # a failing batch is abandoned, nothing more is committed
        if self._thread is not None:
            try:
                self._send(("stop", drain))
            except RuntimeError:  # the receiver is being restarted
                self._stop.set()
            self._thread.join(30)
            if self._thread.is_alive():  # still retrying a batch the store refuses: abandon it
                self._stop.set()
                self._thread.join(30)
            self._thread = None
        self._stop.set()
        self._reap()
        self.metrics.connected = False

    def abort(self) -> None:
        """Kill the receiver without acknowledging anything in flight (tests: simulate a crash)."""
        self._stop.set()
        if self._proc is not None:
            self._proc.kill()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None
        with self._send_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def publish(self, topic: str, payload: bytes, retain: bool = False, qos: int = 1, timeout: float = 10.0) -> None:
        """Publish through the receiver's connection; waits for the PUBACK (at most ``timeout``)."""
        request = next(self._request_ids)
        waiter: list = [threading.Event(), None]
        self._requests[request] = waiter
        try:
            self._send(("publish", request, topic, payload, retain, qos, timeout))
            if not waiter[0].wait(timeout + 5):
                raise TimeoutError(f"publish to {topic} not confirmed in {timeout}s")
        finally:
            self._requests.pop(request, None)
        if waiter[1] is not None:
            raise RuntimeError(f"publish to {topic} failed: {waiter[1]}")

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            conn = self._conn
            if conn is None:
                raise RuntimeError("the ingest worker is not running")
            try:
                conn.send(msg)
            except OSError as exc:
                log.warning("the MQTT receiver is gone (%s)", exc)

    # ------------------------------------------------------------------ the commit thread
    def _run(self) -> None:
        """Take the receiver's messages in order: commit batches (answering ``done``), note its status; restart it
        if it dies."""
        while True:
            conn = self._conn
            if conn is None:
                return
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                if self._stop.is_set():
                    return
                code = self._proc.poll() if self._proc is not None else None
                log.error("the MQTT receiver process died (exit code %s); restarting it", code)
                self.metrics.connected = False
                self._reap()
                if self._stop.wait(RESTART_DELAY_S):
                    return
                self._spawn()
                continue
            kind = msg[0]
            if kind == "batch":
                if self._process(msg[2]):
                    self._send(("done", msg[1]))
            elif kind == "status":
                self.metrics.connected, self.protocol = msg[1], msg[2]
            elif kind == "subscribed":
                self._subscribed.set()
            elif kind == "published":
                waiter = self._requests.get(msg[1])
                if waiter is not None:
                    waiter[1] = msg[2]
                    waiter[0].set()
            elif kind == "stopped":
                return

    def _process(self, batch: list[tuple[str, bytes]]) -> bool:
        """Validate, commit and acknowledge ``batch`` — retried until it commits (or the worker stops).

        A batch is never dropped: MQTT redelivers an unacknowledged message only when the session reconnects, so a
        dropped batch would stay unacknowledged in the broker's in-flight window (which then fills: delivery stops)
        while later reports of the same devices commit and raise their high-water marks past it — the redelivered
        copies would be rejected as replays. So while the store fails (a full disk, a PostgreSQL outage), the
        batch is retried with back-off under the batch lock: nothing later is processed or acknowledged, the
        broker holds the rest, ``/healthz`` says ``stalled``. Each retry starts from the store's state
        (:meth:`Validator.reload`). On :meth:`stop` a failing batch is abandoned unacknowledged: the persistent
        session redelivers it to the next run. True once committed."""
        delay = RETRY_FIRST_S
        while True:
            try:
                self._process_once(batch)
                return True
            except Exception:  # noqa: BLE001 - logged; the batch is retried, never lost
                log.exception("ingest of a batch of %d messages failed; nothing of it is acknowledged, retrying",
                              len(batch))
                self.metrics.record_failure()
            while True:  # the next attempt starts from the store's state: the failed one's reservations are void
                if self._stop.wait(delay):
                    log.warning("stopping with a batch of %d uncommitted messages: not acknowledged, the broker "
                                "redelivers them", len(batch))
                    return False
                delay = min(2 * delay, RETRY_MAX_S)
                try:
                    self.validator.reload()
                    break
                except Exception:  # noqa: BLE001 - the store is still down
                    log.warning("validator reload failed (store unavailable?); retrying in %.1f s", delay)
                    self.metrics.record_failure()

    def _process_once(self, batch: list[tuple[str, bytes]]) -> None:
        t0 = time.perf_counter()
        accepted: list[StoredReport] = []
        rejected: Counter[str] = Counter()
        duplicates = 0
        results = self.validator.check_batch(batch)
        for result in results:
            if not isinstance(result, wire.WireError):
                accepted.append(result)
            elif result.reason == DUPLICATE:
                duplicates += 1
            else:
                rejected[result.reason] += 1
        counters = dict(rejected)
        if duplicates:
            counters[DUPLICATE] = duplicates
        inserted = self.store.commit_batch(accepted, counters)
        self.validator.batch_committed()
        self.metrics.record_batch(len(batch), inserted, duplicates + (len(accepted) - inserted), rejected,
                                  time.perf_counter() - t0)
