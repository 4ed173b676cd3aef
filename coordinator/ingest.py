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
a few of them in flight, then the broker holds the rest. A validate thread checks the next batch (reserving its
reports in the validator, in arrival order) while the commit thread commits the previous one — SQLite's commit and
fsync release the GIL, so the two overlap; a batch validated ahead of a commit that fails is validated again, in
order, from the store's state.

The receiver dies with this process (end of file on its pipe; it exits without acknowledging anything in flight).
If it dies alone, it is restarted; the batches it handed over and that commit afterwards are acknowledged by
nobody, so the broker redelivers them and they count as ``duplicate``.
"""

from __future__ import annotations

import gc
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from coordinator.metrics import Metrics
from coordinator.mqtt_receiver import IngestSettings, new_client
from coordinator.quarantine import FloodGuard
from coordinator.store import Aggregate, Store, StoredReport
from coordinator.validate import DUPLICATE, Validator, per_device_counters
from protocols import wire

__all__ = ["IngestSettings", "IngestWorker", "receipts_for"]

log = logging.getLogger(__name__)

#: Back-off between attempts at a batch that failed (the store unavailable): first wait, and the cap.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0
#: Wait before restarting a receiver process that died: first wait, and the cap.
RESTART_FIRST_S, RESTART_MAX_S = 1.0, 30.0
#: gen-1 collections between two full ones (CPython's default: 10) once the worker runs. Validating and committing
#: 10⁶ reports in one process (validator and store as the worker holds them, the registry frozen) ran 165 full
#: collections at the default, 16.6 µs of the GIL per report, and 1 at 1,000 (0.14 µs); gen-0 and gen-1 collections
#: (≈ 2 and ≈ 3 µs per report) are unchanged. Cyclic garbage is rare on this path: a rejection kept as a result is
#: detached from its traceback (``coordinator.validate._detached``), which would otherwise tie its whole batch into
#: a cycle. CPython 3.14's incremental collector ignores this threshold.
GC_FULL_AFTER = 1000
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


class _Run:
    """One ``start()`` … ``stop()`` of an :class:`IngestWorker`. Its threads hold on to their run, so a thread that
    outlives a timed-out stop (a store call that hangs) cannot touch the next run's receiver or batches."""

    def __init__(self, link: _Link) -> None:
        self.link = link  # replaced when a dead receiver is restarted
        self.abandon = threading.Event()  # commit nothing more (set on every stop, once nothing can be acknowledged)
        self.stopping = threading.Event()  # no receiver restart from now on
        self.subscribed = threading.Event()
        self.batches: queue.Queue = queue.Queue()  # (link, batch id, batch), or None: the reader has finished
        #: (link, batch id, sequence number, batch, _Checked or None), or None: validated ahead of their commit
        self.validated: queue.Queue = queue.Queue(maxsize=1)
        self.epoch = 0  # bumped by a failed commit: what was validated before it is validated again
        self.validated_upto = -1  # sequence number of the last batch validated in this epoch
        self.needs_reload = False  # a validation failed midway: its reservations are void until a reload
        self.threads: list[threading.Thread] = []


def receipts_for(results: Sequence[StoredReport | wire.WireError]) -> list[tuple[str, bytes]]:
    """One receipt per device of a committed batch: ``(receipt topic, payload)`` naming every authentic report
    processed — stored now or before (duplicates), or rejected for good with its reason. Unauthenticated messages
    get none (their seq is not the device's word). :class:`protocols.wire.Receipt`."""
    stored: dict[str, list[int]] = {}
    rejected: dict[str, list[tuple[int, str]]] = {}
    for r in results:
        if isinstance(r, StoredReport):
            stored.setdefault(r.device_id, []).append(r.seq)
        elif r.device_id is not None and r.seq is not None:
            if r.reason == DUPLICATE:
                stored.setdefault(r.device_id, []).append(r.seq)
            else:
                rejected.setdefault(r.device_id, []).append((r.seq, r.reason))
    return [(wire.receipt_topic(d), wire.receipt_bytes(d, stored.get(d, ()), rejected.get(d, ())))
            for d in sorted(stored.keys() | rejected.keys())]


@dataclass
class _Checked:
    """A batch validated (its reports reserved in the validator) and ready to commit."""

    epoch: int  # the worker's validation epoch it was validated in (a failed commit starts a new one)
    t0: float
    results: list[StoredReport | wire.WireError]
    accepted: list[StoredReport]
    rejected: Counter[str]
    duplicates: int
    counters: dict[str, int]
    receipts: list[tuple[str, bytes]]
    aggregate: Aggregate


class IngestWorker:
    """One MQTT ingest worker: a receiver process (the MQTT client) and, here, a reader thread (the receiver's
    messages: batches, status, publish confirmations), a validate thread and a commit thread (commit, answer
    ``done``)."""

    def __init__(self, settings: IngestSettings, store: Store, validator: Validator, metrics: Metrics | None = None,
                 guard: FloodGuard | None = None,
                 on_flood: Callable[[list[tuple[str, str]]], None] | None = None) -> None:
        settings.check()
        self.settings = settings
        self.store = store
        self.validator = validator
        self.metrics = metrics or Metrics()
        #: per-device flood limits; devices over one are handed to ``on_flood`` after their batch committed
        self.guard = guard
        self.on_flood = on_flood
        #: the MQTT protocol version in use (4 = 3.1.1, 5), as the receiver reports it
        self.protocol = settings.first_protocol
        self._run: _Run | None = None
        self._ran = False  # started before: the validator is reloaded from the store on the next start
        #: validation happens in order, one batch at a time, under this lock: by the validate thread while the
        #: previous batch commits, or by the commit thread for a batch that must be validated again
        self._validation_lock = threading.Lock()
        self._requests: dict[int, list] = {}  # publish request id → [Event, error]
        self._request_ids = itertools.count()

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: float = 10.0) -> None:
        """Start the receiver process and the threads; wait until the receiver is subscribed. A bad TLS file or
        option raises here; a receiver that exits before it subscribes raises RuntimeError."""
        if self._run is not None:
            raise RuntimeError("the ingest worker is already running")
        new_client(self.settings, self.settings.first_protocol)  # raises on bad TLS settings
        if self._ran:  # a stop may have abandoned a batch validated ahead: its reservations are void, and its
            with self._validation_lock:  # redelivered reports must be checked against what the store holds
                self.validator.reload()
        self._ran = True
        # what is alive now — the device registry above all — lives as long as the worker: out of the cyclic
        # collector's generations, so that its full collections, triggered as the validator's state grows, do not
        # walk every device's key again (at 10⁶ devices that cost 4–8 µs of the GIL per report)
        gc.freeze()
        # and fewer full collections: CPython runs one at every tenth gen-1 collection unless fewer than a quarter
        # as many objects await it as survived the last one — frozen objects not counted, so after the freeze that
        # rule hardly ever holds back
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, GC_FULL_AFTER)
        run = self._run = _Run(_Link(self.settings))
        run.threads = [threading.Thread(target=self._read, args=(run,), name="haarvest-ingest-read", daemon=True),
                       threading.Thread(target=self._validate, args=(run,), name="haarvest-ingest-validate",
                                        daemon=True),
                       threading.Thread(target=self._commit, args=(run,), name="haarvest-ingest-commit", daemon=True)]
        for thread in run.threads:
            thread.start()
        if not wait:
            return
        deadline = time.monotonic() + wait
        while not run.subscribed.wait(0.05):
            if run.link.proc.poll() is not None:
                code = run.link.proc.returncode
                self.stop(drain=False)
                raise RuntimeError(f"the MQTT receiver process exited (code {code}) before it subscribed; see its "
                                   "messages above")
            if time.monotonic() > deadline:
                self.stop(drain=False)
                raise TimeoutError(f"could not subscribe on {self.settings.host}:{self.settings.port} in {wait}s")

    def stop(self, drain: bool = True) -> None:
        """Stop: with ``drain``, commit and acknowledge what was received first (the receiver waits for that at most
        ``settings.drain_timeout`` s); then the receiver disconnects. A batch the store keeps refusing is abandoned."""
        run, self._run = self._run, None
        if run is None:
            return
        run.stopping.set()
        sent = run.link.send(("stop", drain))
        if not drain or not sent:
            run.abandon.set()  # nothing more to commit, or the receiver is gone and can acknowledge nothing
        reader, validator, committer = run.threads
        reader.join(self.settings.drain_timeout + 10)  # "stopped" (or dead): nothing more can be acknowledged
        run.abandon.set()
        validator.join(30)
        committer.join(30)
        run.link.close()
        self.metrics.connected = False

    def publish(self, topic: str, payload: bytes, retain: bool = False, qos: int = 1, timeout: float = 10.0) -> None:
        """Publish through the receiver's connection; waits for the PUBACK (at most ``timeout``)."""
        request = next(self._request_ids)
        waiter: list = [threading.Event(), None]
        self._requests[request] = waiter
        try:
            run = self._run
            if run is None or not run.link.send(("publish", request, topic, payload, retain, qos, timeout)):
                raise RuntimeError(f"publish to {topic} failed: the MQTT receiver is not running (restarting?)")
            if not waiter[0].wait(timeout + 5):
                raise TimeoutError(f"publish to {topic} not confirmed in {timeout}s")
        finally:
            self._requests.pop(request, None)
        if waiter[1] is not None:
            raise RuntimeError(f"publish to {topic} failed: {waiter[1]}")

    # ------------------------------------------------------------------ threads
    def _read(self, run: _Run) -> None:
        """The receiver's messages, in order: batches go to the commit thread, the rest is handled here (so that a
        publish confirmation never waits behind a commit). A receiver that dies is restarted (back-off 1 s doubling
        to 30 s) unless stopping."""
        delay = RESTART_FIRST_S
        while True:
            link = run.link
            try:
                msg = link.conn.recv()
            except (EOFError, OSError):
                link.alive = False
                if run.stopping.is_set() or not self._restart(run, link, delay):
                    break
                delay = min(2 * delay, RESTART_MAX_S)
                continue
            kind = msg[0]
            if kind == "batch":
                run.batches.put((link, msg[1], msg[2]))
            elif kind == "status":
                self.metrics.connected, self.protocol = msg[1], msg[2]
            elif kind == "subscribed":
                run.subscribed.set()
                delay = RESTART_FIRST_S
            elif kind == "published":
                waiter = self._requests.get(msg[1])
                if waiter is not None:
                    waiter[1] = msg[2]
                    waiter[0].set()
            elif kind == "stopped":
                break
        run.batches.put(None)

    def _restart(self, run: _Run, dead: _Link, delay: float) -> bool:
        """Replace the dead receiver after ``delay`` (then again, with back-off, while it cannot be started); False
        if the run stops meanwhile."""
        self.metrics.connected = False
        log.error("the MQTT receiver process died (exit code %s); restarting it in %.0f s", dead.exit_code(), delay)
        while not run.stopping.wait(delay):
            try:
                run.link = _Link(self.settings)
            except Exception:  # noqa: BLE001 - out of processes or file descriptors: keep trying
                delay = min(2 * delay, RESTART_MAX_S)
                log.exception("could not restart the MQTT receiver; retrying in %.0f s", delay)
                continue
            if run.stopping.is_set():  # stop() may have sent its "stop" to the dead receiver
                run.link.send(("stop", False))
            dead.close(0)
            return True
        return False

    def _validate(self, run: _Run) -> None:
        """Validate the batches in arrival order, each while the previous one commits (SQLite's commit and fsync
        release the GIL); hand them to the commit thread. A batch is validated here only if every earlier one was
        validated in the current epoch — else (after a failed commit) it goes on unvalidated and the commit thread
        validates it in its turn, so reservations are always made in arrival order."""
        seq = itertools.count()
        while True:
            item = run.batches.get()
            if item is None:
                break
            link, batch_id, batch = item
            if run.abandon.is_set():
                continue
            number = next(seq)
            checked = None
            with self._validation_lock:
                if run.validated_upto == number - 1:
                    try:
                        checked = self._check(run, batch)
                        run.validated_upto = number
                    except Exception:  # noqa: BLE001 - a store error: the commit thread validates it (and retries)
                        log.warning("validating a batch of %d messages failed; retrying it in order", len(batch),
                                    exc_info=True)
                        run.needs_reload = True
            while not run.abandon.is_set():
                try:
                    run.validated.put((link, batch_id, number, batch, checked), timeout=0.1)
                    break
                except queue.Full:
                    continue
        while not run.abandon.is_set():
            try:
                run.validated.put(None, timeout=0.1)
                return
            except queue.Full:
                continue

    def _commit(self, run: _Run) -> None:
        """Commit the batches in arrival order and answer ``done`` on the link each came from; once the run is
        abandoned nothing more is committed (a later batch must not commit ahead of an abandoned one: its seqs
        would pass the abandoned reports', whose redelivered copies would then be rejected as replays)."""
        while True:
            try:
                item = run.validated.get(timeout=0.1)
            except queue.Empty:
                if run.abandon.is_set() and not run.threads[1].is_alive():
                    return
                continue
            if item is None:
                return
            link, batch_id, number, batch, checked = item
            if not run.abandon.is_set():
                receipts = self._process(run, batch, number, checked)
                if receipts is not None:
                    link.send(("done", batch_id, receipts))

    def _process(self, run: _Run, batch: list[tuple[str, bytes]], number: int,
                 checked: _Checked | None = None) -> list[tuple[str, bytes]] | None:
        """Validate (unless ``checked`` holds this epoch's validation), commit and acknowledge ``batch`` — retried
        until it commits (or ``abandon`` is set).

        A batch is never dropped: MQTT redelivers an unacknowledged message only when the session reconnects, so a
        dropped batch would stay unacknowledged in the broker's in-flight window (which then fills: delivery stops)
        while later reports of the same devices commit and raise their high-water marks past it — the redelivered
        copies would be rejected as replays. So while the store fails (a full disk, a PostgreSQL outage), the
        batch is retried with back-off: nothing later is processed or acknowledged, the broker holds the rest,
        ``/healthz`` says ``stalled``. Each retry starts from the store's state (:meth:`Validator.reload`), and so
        does every later batch validated before it (a new epoch). On :meth:`stop` a failing batch is abandoned
        unacknowledged: the persistent session redelivers it to the next run. Once committed: the receipts to
        publish (:func:`receipts_for`); None if abandoned."""
        delay = RETRY_FIRST_S
        while True:
            try:
                return self._process_once(run, batch, number, checked)
            except Exception:  # noqa: BLE001 - logged; the batch is retried, never lost
                log.exception("ingest of a batch of %d messages failed; nothing of it is acknowledged, retrying",
                              len(batch))
                self.metrics.record_failure()
                checked = None
            with self._validation_lock:  # what was validated after this batch is validated again, in order
                run.epoch += 1
                run.validated_upto = number - 1
            while True:  # the next attempt starts from the store's state: the failed one's reservations are void
                if run.abandon.wait(delay):
                    log.warning("stopping with a batch of %d uncommitted messages: not acknowledged, the broker "
                                "redelivers them", len(batch))
                    return None
                delay = min(2 * delay, RETRY_MAX_S)
                try:
                    with self._validation_lock:
                        self.validator.reload()
                    break
                except Exception:  # noqa: BLE001 - the store is still down
                    log.warning("validator reload failed (store unavailable?); retrying in %.1f s", delay)
                    self.metrics.record_failure()

    def _check(self, run: _Run, batch: list[tuple[str, bytes]]) -> _Checked:
        """Validate ``batch`` (the caller holds the validation lock): what its commit needs."""
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
        counters.update(per_device_counters(results))
        if duplicates:
            counters[DUPLICATE] = duplicates
        return _Checked(run.epoch, t0, results, accepted, rejected, duplicates, counters, receipts_for(results),
                        self.validator.aggregator(accepted))

    def _process_once(self, run: _Run, batch: list[tuple[str, bytes]], number: int,
                      checked: _Checked | None = None) -> list[tuple[str, bytes]]:
        if checked is None or checked.epoch != run.epoch:  # only this thread changes the epoch: no lock to read it
            with self._validation_lock:
                if run.needs_reload:
                    self.validator.reload()
                    run.needs_reload = False
                checked = self._check(run, batch)
                run.validated_upto = number
        inserted = self.store.commit_batch(checked.accepted, checked.counters, checked.aggregate)
        self.validator.batch_committed(checked.accepted)
        self.metrics.record_batch(len(batch), inserted, checked.duplicates + (len(checked.accepted) - inserted),
                                  checked.rejected, time.perf_counter() - checked.t0)
        if self.guard is not None:
            flooding = self.guard.observe(checked.results)
            if flooding and self.on_flood is not None:
                try:
                    self.on_flood(flooding)
                except Exception:  # noqa: BLE001 - the batch is committed; the guard tries again next window
                    log.exception("could not quarantine %s", [d for d, _ in flooding])
                    for device, _ in flooding:
                        self.guard.forget(device)
        return checked.receipts
