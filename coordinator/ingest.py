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
import queue
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
from coordinator.mqtt_receiver import (DRAIN_TIMEOUT, MAX_BATCHES_IN_FLIGHT, IngestSettings, new_client,
                                      subscription_topic)
from coordinator.store import Store, StoredReport
from coordinator.validate import DUPLICATE, Validator
from protocols import wire

__all__ = ["IngestSettings", "IngestWorker", "subscription_topic", "MAX_BATCHES_IN_FLIGHT"]

log = logging.getLogger(__name__)

#: Back-off between attempts at a batch that failed (the store unavailable): first wait, and the cap.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0
#: Wait before restarting a receiver process that died: first wait, and the cap.
RESTART_FIRST_S, RESTART_MAX_S = 1.0, 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


class _Link:
    """One receiver process and our end of its pipe. Replies to a batch go back on the link it came from: a batch
    of a receiver that has since died is committed but acknowledged by nobody (the broker redelivers it)."""

    def __init__(self, settings: IngestSettings) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "coordinator.mqtt_receiver", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._lock = threading.Lock()
        self.alive = True
        self.send(("settings", asdict(settings)))

    def send(self, msg: tuple) -> bool:
        """Send ``msg``; False if the receiver is gone."""
        with self._lock:
            if not self.alive:
                return False
            try:
                self.conn.send(msg)
                return True
            except OSError:
                self.alive = False
                return False

    def exit_code(self) -> int | None:
        try:
            return self.proc.wait(1)
        except subprocess.TimeoutExpired:
            return None

    def close(self, grace: float = 10.0) -> None:
        with self._lock:
            self.alive = False
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.conn.close()


class IngestWorker:
    """One MQTT ingest worker: a receiver process (the MQTT client) and, here, a reader thread (the receiver's
    messages: batches, status, publish confirmations) and a commit thread (validate, commit, answer ``done``)."""

    def __init__(self, settings: IngestSettings, store: Store, validator: Validator, metrics: Metrics | None = None) -> None:
        settings.check()
        self.settings = settings
        self.store = store
        self.validator = validator
        self.metrics = metrics or Metrics()
        self.topic = subscription_topic(settings.shared_group)
        #: the MQTT protocol version in use (4 = 3.1.1, 5), as the receiver reports it
        self.protocol = 4 if settings.protocol == "3.1.1" else 5
        self._stop = threading.Event()  # abandon: commit nothing more
        self._stopping = False  # no restart of the receiver from now on
        self._subscribed = threading.Event()
        self._link: _Link | None = None
        self._batches: queue.Queue = queue.Queue()  # (link, batch id, batch) or None: the reader has finished
        self._reader: threading.Thread | None = None
        self._committer: threading.Thread | None = None
        self._requests: dict[int, list] = {}  # publish request id → [Event, error]
        self._request_ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: float = 10.0) -> None:
        """Start the receiver process and the threads; wait until the receiver is subscribed. A bad TLS file or
        option raises here; a receiver that exits before it subscribes raises RuntimeError."""
        new_client(self.settings, 4 if self.settings.protocol == "3.1.1" else 5)  # raises on bad TLS settings
        self._stop.clear()
        self._stopping = False
        self._subscribed.clear()
        self._batches = queue.Queue()
        self._link = _Link(self.settings)
        self._reader = threading.Thread(target=self._read, name="haarvest-ingest-read", daemon=True)
        self._committer = threading.Thread(target=self._commit, name="haarvest-ingest-commit", daemon=True)
        self._reader.start()
        self._committer.start()
        if not wait:
            return
        deadline = time.monotonic() + wait
        while not self._subscribed.wait(0.05):
            link = self._link
            if link is not None and link.proc.poll() is not None:
                code = link.proc.returncode
                self.stop(drain=False)
                raise RuntimeError(f"the MQTT receiver process exited (code {code}) before it subscribed; see its "
                                   "messages above")
            if time.monotonic() > deadline:
                self.stop(drain=False)
                raise TimeoutError(f"could not subscribe on {self.settings.host}:{self.settings.port} in {wait}s")

    def stop(self, drain: bool = True) -> None:
        """Stop: with ``drain``, commit and acknowledge what was received first; then the receiver disconnects."""
        self._stopping = True
        if not drain:
            self._stop.set()  # a failing batch is abandoned, nothing more is committed
        link = self._link
        if link is not None and not link.send(("stop", drain)):
            self._stop.set()  # the receiver is gone: nothing it handed over can be acknowledged any more
        for thread in (self._reader, self._committer):
            if thread is not None:
                thread.join(DRAIN_TIMEOUT + 10)
                if thread.is_alive():  # still retrying a batch the store refuses: abandon it
                    self._stop.set()
                    thread.join(30)
        self._reader = self._committer = None
        self._stop.set()
        if self._link is not None:
            self._link.close()
            self._link = None
        self.metrics.connected = False

    def abort(self) -> None:
        """Kill the receiver without acknowledging anything in flight (tests: simulate a crash)."""
        self._stopping = True
        self._stop.set()
        if self._link is not None:
            self._link.proc.kill()
        self.stop(drain=False)

    def publish(self, topic: str, payload: bytes, retain: bool = False, qos: int = 1, timeout: float = 10.0) -> None:
        """Publish through the receiver's connection; waits for the PUBACK (at most ``timeout``)."""
        request = next(self._request_ids)
        waiter: list = [threading.Event(), None]
        self._requests[request] = waiter
        try:
            link = self._link
            if link is None or not link.send(("publish", request, topic, payload, retain, qos, timeout)):
                raise RuntimeError(f"publish to {topic} failed: the MQTT receiver is not running (restarting?)")
            if not waiter[0].wait(timeout + 5):
                raise TimeoutError(f"publish to {topic} not confirmed in {timeout}s")
        finally:
            self._requests.pop(request, None)
        if waiter[1] is not None:
            raise RuntimeError(f"publish to {topic} failed: {waiter[1]}")

    # ------------------------------------------------------------------ threads
    def _read(self) -> None:
        """The receiver's messages, in order: batches go to the commit thread, the rest is handled here (so that a
        publish confirmation never waits behind a commit). A receiver that dies is restarted (back-off 1 s doubling
        to 30 s) unless stopping."""
        delay = RESTART_FIRST_S
        link = self._link
        while link is not None:
            try:
                msg = link.conn.recv()
            except (EOFError, OSError):
                link.alive = False
                if self._stopping:
                    break
                self.metrics.connected = False
                log.error("the MQTT receiver process died (exit code %s); restarting it in %.0f s",
                          link.exit_code(), delay)
                while not self._stop.wait(delay):
                    delay = min(2 * delay, RESTART_MAX_S)
                    if self._stopping:
                        break
                    try:
                        link = self._link = _Link(self.settings)
                        if self._stopping:  # stop() may have looked at the dead link just before
                            link.send(("stop", False))
                        break
                    except Exception:  # noqa: BLE001 - out of processes/fds: keep trying
                        log.exception("could not restart the MQTT receiver; retrying in %.0f s", delay)
                else:
                    break
                if self._stopping:
                    break
                continue
            kind = msg[0]
            if kind == "batch":
                self._batches.put((link, msg[1], msg[2]))
            elif kind == "status":
                self.metrics.connected, self.protocol = msg[1], msg[2]
            elif kind == "subscribed":
                self._subscribed.set()
                delay = RESTART_FIRST_S
            elif kind == "published":
                waiter = self._requests.get(msg[1])
                if waiter is not None:
                    waiter[1] = msg[2]
                    waiter[0].set()
            elif kind == "stopped":
                break
        self._batches.put(None)

    def _commit(self) -> None:
        """Commit the batches in arrival order and answer ``done`` on the link each came from; after an abandon
        (:meth:`stop` without drain, or a stop while a batch keeps failing) nothing more is committed."""
        while True:
            item = self._batches.get()
            if item is None:
                return
            link, batch_id, batch = item
            if self._stop.is_set():
                continue  # abandoned: later batches must not commit ahead of it (their seqs would pass it)
            if self._process(batch):
                link.send(("done", batch_id))

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
