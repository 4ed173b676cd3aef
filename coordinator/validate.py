"""The ingest validation pipeline: one message in, a verified report (or a WireError with a reason code) out.

Order of the checks (cheapest and least trusting first)::

    size → decode (pydantic) → topic/device binding → enrolled → signature (Ed25519 or HMAC-SHA256, as the
    device's registry entry says) → round exists and is open →
    stream and mechanism match the round → body shape and support → replay / duplicate / second report for the stream

Reason codes (``WireError.reason``): ``too_large``, ``malformed``, ``schema`` (from :mod:`protocols.wire`),
``wrong_topic``, ``device_mismatch``, ``unknown_device``, ``revoked_device``, ``quarantined`` (the device was cut
off for flooding, :mod:`coordinator.quarantine`; checked before its signature, so it costs no verification),
``unsigned``, ``bad_signature``, ``unknown_round``, ``round_closed``, ``off_contract`` (a stream the device's
enrolment contract does not list, or a mechanism other than the one it was configured with — ``auto`` admits
any, ``distribution_auto`` any distribution mechanism: :meth:`protocols.contract.StreamSpec.admits`), ``wrong_stream``,
``wrong_mechanism``, ``off_grid`` (values that are not indices of the stream mechanism's public grid: integers
outside it, or real numbers — an older device's raw-double release, SPEC §3.0), ``bad_body`` (any other row not of
the round's stream mechanism: wrong structure or shape, or outside the mechanism's support — the oracle's integer
range — checked by :class:`coordinator.decode.StreamDecoder`, built once per round and stream), ``replay``
(a sequence number at or below the device's high-water mark that is not a copy of a stored report),
``already_reported`` (the device already has a report for this round and stream) and ``duplicate`` (an exact
copy of a stored or pending report: QoS 1 redelivery — acknowledged, never stored or counted twice).

**Every rejection is counted with its device** (``<reason>.<device_id>`` in the store's counters, beside the
per-reason totals) whenever the message can be charged to an enrolled device: the signer of an authentic report,
or else the device its topic names. Behind the shipped broker configuration a device may publish only on its own
topic, so the topic names the certificate that sent it; counting only enrolled ids keeps the counters bounded.

:meth:`Validator.check` *reserves* what it accepts (raises the in-memory high-water mark, remembers the
pending (device, seq)), so messages of one batch are checked against each other; after the batch is durably
committed the ingest calls :meth:`Validator.batch_committed`, after a failed commit :meth:`Validator.reload`.

**Rounds opened by another process** (``haarvest coordinator rounds open`` next to a running ``coordinator run``):
a report naming a round id the validator does not hold is looked up in the store *at once* (a primary-key query,
:meth:`coordinator.store.Store.round`) before it is rejected as ``unknown_round``. Every opener stores a round
before publishing it, so a device can only name a round that is already committed: the report is never rejected
for having overtaken the validator's cache. A miss is remembered for ``negative_ttl`` seconds (0.1 by default), so
a device that keeps naming a round id that does not exist costs at most one query per id and interval — it must be
enrolled and sign its reports to get that far. Rounds *closed* by another process are noticed by the periodic
re-read of the rounds table (``refresh_interval``): a report arriving up to that long after such a close is still
accepted.

**Rejections are acknowledged.** The ingest acknowledges every message it has processed, rejected ones included:
MQTT redelivers an unacknowledged message only when the session reconnects, so withholding the PUBACK of a rejected
report would not retry it soon — it would pin it in the broker's in-flight window, and every reconnect would
deliver it again to be rejected again. ``unknown_round`` is therefore final: with the immediate lookup above it
means the round does not exist in the store when the report is checked (a forged or mistyped id, or a round
deleted from the database).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.decode import StreamDecoder
from protocols.contract import RoundParams, StreamSpec, body_row, parse_round_params
from coordinator.store import STORE_ERRORS, Store, StoredReport
from protocols import wire
from protocols.catalogue import Statistics
from protocols.errors import RejectReason

__all__ = ["Validator", "DUPLICATE", "AUTHENTIC_REJECTIONS", "per_device_counters"]

log = logging.getLogger(__name__)

DUPLICATE = RejectReason.DUPLICATE
#: seq and boot are stored as signed 64-bit integers.
MAX_COUNTER = 2**63 - 1

#: rejections of a report whose signature verified: its receipt names the seq, and the device stops re-sending it
AUTHENTIC_REJECTIONS = (RejectReason.UNKNOWN_ROUND, RejectReason.ROUND_CLOSED, RejectReason.OFF_CONTRACT,
                        RejectReason.WRONG_STREAM, RejectReason.WRONG_MECHANISM, RejectReason.BAD_BODY,
                        RejectReason.OFF_GRID,
                        RejectReason.SEQ_REGRESSION, RejectReason.ALREADY_REPORTED)


#: a report whose row this validator does not hold (:meth:`Validator.statistics`)
_UNKNOWN = object()


def per_device_counters(results: Sequence[Any]) -> dict[str, int]:
    """``<reason>.<device_id>`` counts of the rejections among ``check_batch`` results that name a device
    (duplicates are not rejections: a redelivered copy of a stored report)."""
    out: dict[str, int] = {}
    for r in results:
        if isinstance(r, wire.WireError) and r.device_id and r.reason != DUPLICATE:
            key = f"{r.reason}.{r.device_id}"
            out[key] = out.get(key, 0) + 1
    return out


def _detached(exc: wire.WireError) -> wire.WireError:
    """``exc`` without its traceback and chained exceptions, to be kept as a result. A caught exception's traceback
    holds the frame that caught it — :meth:`Validator.check_batch`'s, whose locals hold the whole batch and the
    results, ``exc`` among them — and every deeper frame holds its caller: a reference cycle that only a full
    garbage collection frees, which the ingest worker runs rarely (``coordinator.ingest.GC_FULL_AFTER``)."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    return exc


class _Round:
    __slots__ = ("config", "params", "status")

    def __init__(self, config: wire.RoundConfig, params: RoundParams, status: str) -> None:
        self.config, self.params, self.status = config, params, status


def _round_from_row(row: dict[str, Any]) -> _Round:
    config = wire.RoundConfig.model_validate(json.loads(row["config"]))
    return _Round(config, parse_round_params(config.params), row["status"])


def _rounds_from_rows(rows: Sequence[dict[str, Any]]) -> dict[str, _Round]:
    return {row["round_id"]: _round_from_row(row) for row in rows}


class Validator:
    """Validates report messages against the device registry, the rounds and the replay state of a store.

    Args:
        store: where devices, rounds and high-water marks are loaded from. Devices are re-read when an unknown
            device shows up, at most every ``refresh_interval`` seconds (other processes may enroll); the table of
            rounds at most as often while the round is open (other processes may close it). An unknown round id is
            looked up in the store at once (other processes may open rounds).
        replay_window: None (default) accepts any authentic ``seq`` not yet stored, however far below the
            device's high-water mark: a device re-sends every report the coordinator has not receipted (a report
            the broker lost arrives after later ones), so a late report is the normal recovery path. ``w >= 0``
            (strict) accepts only ``seq > hwm - w``. A seq stored with another signature is ``seq_regression``
            (a reset or restored device ledger) and the same one ``duplicate`` (``UNIQUE(device_id, seq)``).
        max_payload: size limit in bytes (at most :data:`protocols.wire.MAX_PAYLOAD`).
        refresh_interval: seconds between re-reads of the devices and rounds tables (see ``store``).
        negative_ttl: seconds a round id not found in the store is remembered as unknown (0: look it up every
            time). Keep it short: it only bounds the store queries of reports naming non-existent rounds.
    """

    def __init__(self, store: Store, replay_window: int | None = None, max_payload: int = wire.MAX_PAYLOAD,
                 refresh_interval: float = 1.0, negative_ttl: float = 0.1) -> None:
        if replay_window is not None and replay_window < 0:
            raise ValueError("replay_window must be >= 0")
        if refresh_interval < 0 or negative_ttl < 0:
            raise ValueError("refresh_interval and negative_ttl must be >= 0")
        if not 0 < max_payload <= wire.MAX_PAYLOAD:
            raise ValueError(f"max_payload must lie in (0, {wire.MAX_PAYLOAD}]")
        self.store = store
        self.replay_window = None if replay_window is None else int(replay_window)
        self.max_payload = int(max_payload)
        self.refresh_interval = float(refresh_interval)
        self.negative_ttl = float(negative_ttl)
        self._lock = threading.RLock()
        #: id → (key, status, registry text, contract: stream → mechanism or None for any)
        self._keys: dict[str, tuple[wire.VerifyKey | None, str, str, dict[str, str] | None]] = {}
        self._rounds: dict[str, _Round] = {}
        self._hwm: dict[str, int] = {}
        #: open round → (device, stream) pairs already reported; a closed round's set is dropped (its reports are
        #: rejected as round_closed before this check), so memory follows the open rounds, not the history
        self._reported: dict[str, set[tuple[str, str]]] = {}
        self._pending: dict[tuple[str, int], str] = {}
        self._decoders: dict[tuple[str, str], StreamDecoder] = {}
        #: (device_id, seq) → the parsed report row of an accepted report, until its batch is committed: what
        #: :meth:`statistics` aggregates without parsing the stored body again
        self._rows: dict[tuple[str, int], Any] = {}
        self._committed: deque[list[tuple[str, int]]] = deque()  # (device_id, seq) of committed batches, to forget
        self._missing_rounds: dict[str, float] = {}  # round id → monotonic time of the store lookup that missed
        self._devices_loaded = self._rounds_loaded = 0.0
        self.reload()

    # ------------------------------------------------------------------ state
    def reload(self) -> None:
        """Re-read everything from the store (after a failed commit, or on start). All or nothing: every read
        happens before any state changes, so a store error leaves the validator as it was (and raises)."""
        with self._lock:
            devices = self.store.device_records()
            round_rows = self.store.rounds()
            hwm = self.store.high_water_marks()
            rounds = _rounds_from_rows(round_rows)
            reported: dict[str, set[tuple[str, str]]] = {}
            for device_id, round_id, stream in self.store.reported_keys(
                    [rid for rid, r in rounds.items() if r.status == "open"]):
                reported.setdefault(round_id, set()).add((device_id, stream))
            self._pending.clear()
            self._rows.clear()
            self._apply_devices(devices)
            self._apply_rounds(rounds)
            self._hwm, self._reported = hwm, reported

    def refresh_devices(self) -> None:
        with self._lock:
            self._apply_devices(self.store.device_records())

    def _apply_devices(self, devices: dict[str, dict[str, Any]]) -> None:
        keys: dict[str, tuple[wire.VerifyKey | None, str, str, dict[str, str] | None]] = {}
        for device_id, rec in devices.items():
            text, status = rec["public_key"], rec["status"]
            old = self._keys.get(device_id)
            if old is not None and old[2] == text:
                key = old[0]
            else:
                try:
                    key = wire.load_registry_key(text)  # Ed25519 public key or HMAC report key
                except ValueError:
                    key = None  # a corrupt registry entry rejects the device's reports, never crashes ingest
            keys[device_id] = (key, status, text, rec["contract"])
        self._keys = keys
        self._devices_loaded = time.monotonic()

    def refresh_rounds(self) -> None:
        with self._lock:
            self._apply_rounds(_rounds_from_rows(self.store.rounds()))

    def _apply_rounds(self, rounds: dict[str, "_Round"]) -> None:
        for rid in [rid for rid in self._reported if rid in rounds and rounds[rid].status != "open"]:
            del self._reported[rid]
        self._rounds = rounds
        self._missing_rounds.clear()
        self._rounds_loaded = time.monotonic()

    def set_round(self, config: wire.RoundConfig, status: str) -> None:
        """Tell the validator about a round opened or closed in this process (no store round trip)."""
        with self._lock:
            self._rounds[config.round_id] = _Round(config, parse_round_params(config.params), status)
            if status != "open":
                self._reported.pop(config.round_id, None)
            self._missing_rounds.pop(config.round_id, None)

    def batch_committed(self, reports: Sequence[StoredReport] | None = None) -> None:
        """A batch is durably committed: forget its reservations (its rows are in the store now). ``reports`` — the
        batch's accepted reports — forgets only theirs, and without waiting for the validator's lock (the ingest
        validates the next batch meanwhile): they are dropped when the next batch is checked — until then a copy
        still finds its reservation, and is a duplicate as it would be in the store. None forgets every
        reservation now."""
        if reports is not None:
            self._committed.append([(r.device_id, r.seq) for r in reports])  # deque.append: atomic
            return
        with self._lock:
            self._pending.clear()
            self._rows.clear()

    def _forget_committed(self) -> None:
        """Drop the reservations of the batches committed since (the caller holds the lock)."""
        while self._committed:
            for key in self._committed.popleft():
                self._pending.pop(key, None)
                self._rows.pop(key, None)

    # ------------------------------------------------------------------ checks
    def check(self, topic: str, payload: bytes, now: float | None = None) -> StoredReport:
        """Validate one message; return the row to store, or raise WireError(reason)."""
        (result,) = self.check_batch([(topic, payload)], now)
        if isinstance(result, wire.WireError):
            raise result
        return result

    def check_batch(self, messages: Sequence[tuple[str, bytes]],
                    now: float | None = None) -> list[StoredReport | wire.WireError]:
        """Validate a batch of ``(topic, payload)`` messages: for each, the row to store or the WireError.

        Same checks and outcome as :meth:`check` message by message, in three passes: (1) each message up to
        its body's structure (size, schema, binding, enrolment, signature, round, stream, mechanism); (2) the
        support checks of all rows of one round and stream at once (:meth:`StreamDecoder.check_rows`: one
        stacking, one vectorised check when all are good); (3) in arrival order, the replay and duplicate checks
        and the reservation of what is accepted. An unexpected error in one message is logged and returned as
        ``internal_error`` — it never loses the rest of the batch. A store error (:data:`STORE_ERRORS`: a lookup
        of a newly enrolled device or a round opened elsewhere, a stored signature) raises: the caller retries
        the whole batch after :meth:`reload` (nothing of it is acknowledged).
        """
        t = time.time() if now is None else now
        out: list[StoredReport | wire.WireError] = []
        authentic: list[tuple[int, wire.Report, StreamSpec, Any]] = []
        groups: dict[tuple[str, str], list[int]] = {}
        with self._lock:
            self._forget_committed()
            for i, (topic, payload) in enumerate(messages):
                try:
                    report, spec, row = self._authenticate(topic, payload, t)
                except wire.WireError as exc:
                    if exc.device_id is None:
                        exc.device_id = self._topic_device(topic)
                    out.append(_detached(exc))
                    continue
                except STORE_ERRORS:  # the store failed (a lookup of a new device or round): retry the batch
                    raise
                except Exception:  # noqa: BLE001 - a bug must not lose the batch: count it, go on
                    log.exception("unexpected error validating a report")
                    out.append(wire.WireError("internal_error"))
                    continue
                out.append(None)  # type: ignore[arg-type]  # filled in pass 3
                groups.setdefault((report.round_id, report.stream), []).append(len(authentic))
                authentic.append((i, report, spec, row))
            bad_body: dict[int, tuple[str, str]] = {}
            for (round_id, stream), members in groups.items():
                spec = authentic[members[0]][2]
                try:
                    decoder = self._decoder(round_id, stream, spec)
                    mask = decoder.check_rows([authentic[j][3] for j in members])
                except ValueError as exc:  # the stream's mechanism cannot be built: no row can be checked
                    mask, detail = None, str(exc)
                for pos, j in enumerate(members):
                    if mask is None:
                        bad_body[j] = ("bad_body", detail)
                    elif not mask[pos]:
                        bad_body[j] = decoder.rejection(authentic[j][3])
            for j, (i, report, _, row) in enumerate(authentic):
                if j in bad_body:
                    reason, why = bad_body[j]
                    out[i] = wire.WireError(reason, why, device_id=report.device_id, seq=report.seq)
                    continue
                try:
                    self._check_replay(report)
                except wire.WireError as exc:
                    exc.device_id, exc.seq = report.device_id, report.seq
                    out[i] = _detached(exc)
                    continue
                self._reserve(report)
                self._rows[(report.device_id, report.seq)] = row
                out[i] = StoredReport(
                    device_id=report.device_id, seq=report.seq, boot=report.boot, round_id=report.round_id,
                    stream=report.stream, mechanism=report.mechanism,
                    body=wire.canonical_json_text(report.body), sig=report.sig, received_at=t,
                )
        return out

    def _authenticate(self, topic: str, payload: bytes, t: float) -> tuple[wire.Report, StreamSpec, Any]:
        """Every check up to the body's structure (pass 1 of :meth:`check_batch`); WireError(reason) if one fails."""
        if len(payload) > self.max_payload:
            raise wire.WireError("too_large", f"{len(payload)} bytes > {self.max_payload}")
        try:
            report = wire.decode_report(payload)
        except wire.WireError:
            raise
        except (RecursionError, ValueError, TypeError) as exc:  # e.g. JSON nested deeper than the parser allows
            raise wire.WireError("malformed", type(exc).__name__) from None
        if report.seq > MAX_COUNTER or report.boot > MAX_COUNTER:
            raise wire.WireError("schema", "seq/boot must fit in 63 bits")
        topic_device = wire.device_id_from_topic(topic)
        if topic_device != report.device_id:
            raise wire.WireError("device_mismatch", f"topic names {topic_device!r}, report {report.device_id!r}")
        key, status, _, contract = self._device(report.device_id)
        if status == "quarantined":
            raise wire.WireError("quarantined", report.device_id)
        if status != "active":
            raise wire.WireError("revoked_device", report.device_id)
        if key is None:
            raise wire.WireError("unknown_device", "registered key is unusable")
        try:
            wire.verify_report(report, topic, key, payload)
        except wire.WireError:
            raise
        except (RecursionError, ValueError, TypeError) as exc:  # NaN/inf or unencodable body
            raise wire.WireError("malformed", f"body is not canonical JSON: {type(exc).__name__}") from None
        try:  # authentic from here on: a rejection names the device and seq (per-device counters, receipts)
            return self._check_contract(report, t, contract)
        except wire.WireError as exc:
            exc.device_id, exc.seq = report.device_id, report.seq
            raise

    def _check_contract(self, report: wire.Report, t: float,
                        contract: dict[str, str] | None = None) -> tuple[wire.Report, StreamSpec, Any]:
        """The checks of an authentic report against the device's enrolment contract and its round (open,
        stream, mechanism, body structure)."""
        if contract is not None and report.stream not in contract:
            raise wire.WireError("off_contract", f"{report.device_id} is not enrolled for stream {report.stream!r}")
        rnd = self._round(report.round_id)
        if rnd.status != "open":
            raise wire.WireError("round_closed", report.round_id)
        if rnd.config.not_after is not None and t > rnd.config.not_after:
            raise wire.WireError("round_closed", f"{report.round_id} ended at {rnd.config.not_after}")
        spec = rnd.params.streams.get(report.stream)
        if spec is None:
            raise wire.WireError("wrong_stream", f"round {report.round_id} has no stream {report.stream!r}")
        if report.mechanism != spec.wire_mechanism:
            raise wire.WireError("wrong_mechanism", f"{report.mechanism!r} != {spec.wire_mechanism!r}")
        if contract is not None and not spec.admits(contract[report.stream]):
            raise wire.WireError("off_contract", f"{report.device_id} is enrolled for {report.stream!r} with "
                                                 f"{contract[report.stream]!r}, not {spec.wire_mechanism!r}")
        try:
            row = body_row(spec, report.body)
        except ValueError as exc:
            raise wire.WireError("bad_body", str(exc)) from None
        return report, spec, row

    def statistics(self, reports: Sequence[StoredReport]) -> dict[tuple[str, str], Statistics]:
        """The sufficient statistics (:meth:`protocols.catalogue.Entry.statistics`) of accepted reports, per round
        and stream: the ``aggregate`` function of :meth:`coordinator.store.Store.commit_batch`. ValueError when a
        group cannot be decoded (the store then marks it for a rebuild instead). The rows parsed when the reports
        were validated are reused; a report this validator did not accept in the current batch is decoded from its
        stored body."""
        return self.aggregator(reports)(reports)

    def aggregator(self, reports: Sequence[StoredReport]) -> Callable[[Sequence[StoredReport]], dict[tuple[str, str],
                                                                                                     Statistics]]:
        """:meth:`statistics` for any subset of ``reports``, as a function that no longer needs this validator: the
        rows and decoders are taken now, under the validator's lock, so that the store's transaction can call it
        without that lock (the ingest validates the next batch — which may read the store — meanwhile). The
        statistics of all of ``reports`` are computed now (by the ingest's validate thread, off the commit's path);
        a subset's when asked for."""
        with self._lock:
            rows = {(r.device_id, r.seq): self._rows.get((r.device_id, r.seq), _UNKNOWN) for r in reports}
            decoders: dict[tuple[str, str], StreamDecoder | str] = {}
            for r in reports:
                key = (r.round_id, r.stream)
                if key not in decoders:
                    try:
                        decoders[key] = self._decoder(r.round_id, r.stream,
                                                      self._round(r.round_id).params.streams[r.stream])
                    except (ValueError, KeyError) as exc:  # raised when aggregating: the store marks it for a rebuild
                        decoders[key] = f"{'/'.join(key)}: {type(exc).__name__}: {exc}"

        def aggregate(stored: Sequence[StoredReport]) -> dict[tuple[str, str], Statistics]:
            groups: dict[tuple[str, str], list[StoredReport]] = defaultdict(list)
            for r in stored:
                groups[(r.round_id, r.stream)].append(r)
            out: dict[tuple[str, str], Statistics] = {}
            for (round_id, stream), members in groups.items():
                dec = decoders[(round_id, stream)]
                if isinstance(dec, str):
                    raise ValueError(dec)
                got = [rows.get((r.device_id, r.seq), _UNKNOWN) for r in members]
                if any(row is _UNKNOWN for row in got):
                    decoded = dec.from_bodies([r.body for r in members])
                    if decoded.dropped:
                        raise ValueError(f"{decoded.dropped} accepted bodies of {round_id}/{stream} do not decode")
                    stacked = decoded.reports
                else:
                    stacked = dec.entry.decode_rows(dec.mechanism, got)
                out[(round_id, stream)] = dec.entry.statistics(dec.mechanism, stacked)
            return out

        try:  # computed now (the ingest's validate thread), handed over as is unless some were stored already
            every, failed = aggregate(reports), None
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # raised in the store's transaction, as before
            every, failed = {}, exc

        def aggregate_stored(stored: Sequence[StoredReport]) -> dict[tuple[str, str], Statistics]:
            if len(stored) != len(reports):  # a subset: the others were stored meanwhile (a redelivery)
                return aggregate(stored)
            if failed is not None:
                raise failed
            return every

        return aggregate_stored

    def _decoder(self, round_id: str, stream: str, spec: StreamSpec) -> StreamDecoder:
        """The round's stream decoder (its mechanism built once per round and stream; ValueError if it cannot be)."""
        key = (round_id, stream)
        dec = self._decoders.get(key)
        if dec is None or dec.spec != spec:
            if len(self._decoders) >= 4096:
                self._decoders.clear()
            dec = StreamDecoder.for_spec(spec)
            self._decoders[key] = dec
        return dec

    def _topic_device(self, topic: str) -> str | None:
        """The enrolled device a topic names (a rejection is charged to it), or None."""
        try:
            device_id = wire.device_id_from_topic(topic)
        except wire.WireError:
            return None
        return device_id if device_id in self._keys else None

    def _device(self, device_id: str) -> tuple[wire.VerifyKey | None, str, str, dict[str, str] | None]:
        entry = self._keys.get(device_id)
        if entry is None and time.monotonic() - self._devices_loaded >= self.refresh_interval:
            self.refresh_devices()
            entry = self._keys.get(device_id)
        if entry is None:
            raise wire.WireError("unknown_device", device_id)
        return entry

    def _round(self, round_id: str) -> _Round:
        rnd = self._rounds.get(round_id)
        now = time.monotonic()
        if rnd is not None and rnd.status == "open" and now - self._rounds_loaded >= self.refresh_interval:
            self.refresh_rounds()  # notices rounds closed by another process
            rnd = self._rounds.get(round_id)
        if rnd is None:
            rnd = self._lookup_round(round_id, now)
        if rnd is None:
            raise wire.WireError("unknown_round", round_id)
        return rnd

    def _lookup_round(self, round_id: str, now: float) -> _Round | None:
        """A round not in the cache, read from the store at once (opened by another process); misses are
        remembered for ``negative_ttl`` seconds."""
        missed = self._missing_rounds.get(round_id)
        if missed is not None and now - missed < self.negative_ttl:
            return None
        row = self.store.round(round_id)
        if row is None:
            if len(self._missing_rounds) >= 4096:
                self._missing_rounds.clear()
            self._missing_rounds[round_id] = now
            return None
        self._missing_rounds.pop(round_id, None)
        rnd = _round_from_row(row)
        self._rounds[round_id] = rnd
        return rnd

    def _check_replay(self, report: wire.Report) -> None:
        hwm = self._hwm.get(report.device_id, -1)
        if report.seq <= hwm:
            key = (report.device_id, report.seq)
            stored = self._pending.get(key)
            if stored is None:
                stored = self.store.stored_sig(*key)
            if stored is not None:
                if stored == report.sig:
                    raise wire.WireError(DUPLICATE, f"{report.device_id} seq {report.seq}")
                raise wire.WireError(RejectReason.SEQ_REGRESSION, f"{report.device_id} seq {report.seq} already used",
                                     device_id=report.device_id)
            if self.replay_window is not None and report.seq <= hwm - self.replay_window:
                raise wire.WireError(RejectReason.SEQ_REGRESSION, f"{report.device_id} seq {report.seq} <= high-water mark {hwm}",
                                     device_id=report.device_id)
        if (report.device_id, report.stream) in self._reported.get(report.round_id, ()):
            raise wire.WireError("already_reported", f"{report.device_id} in {report.round_id}/{report.stream}")

    def _reserve(self, report: wire.Report) -> None:
        if report.seq > self._hwm.get(report.device_id, -1):
            self._hwm[report.device_id] = report.seq
        self._pending[(report.device_id, report.seq)] = report.sig
        self._reported.setdefault(report.round_id, set()).add((report.device_id, report.stream))

    # ------------------------------------------------------------------ introspection
    def round_params(self, round_id: str) -> RoundParams:
        with self._lock:
            return self._round(round_id).params

    def known(self) -> dict[str, Any]:
        with self._lock:
            return {"devices": len(self._keys), "rounds": len(self._rounds),
                    "open_rounds": sum(r.status == "open" for r in self._rounds.values())}
