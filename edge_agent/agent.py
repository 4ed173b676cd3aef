"""The agent: reads sources, runs the pipeline, commits reports durably, drains the outbox over MQTT.

Embedding (the demo runs hundreds in one process)::

    agent = Agent(config, source=IterableSource(rows), secrets=Secrets(key, secret))
    agent.open()
    agent.report("round-1")                    # one fresh reading → one report per stream (durable)
    agent.step()                               # acks, incoming rounds, outbox drain, scheduled work
    agent.close()

or ``agent.run(max_rounds=5)`` (blocking), or :func:`run_fleet` for many agents on one thread. Each agent with MQTT
has one paho network thread; without ``[mqtt]`` the agent only fills its outbox (offline mode, tests, crash test).

A report's life: fresh reading → :class:`~edge_agent.pipeline.Pipeline` → one transaction for the device round
(:meth:`~edge_agent.state.State.commit_reports`: caps, ledger debit, memo, signed outbox row and seq of every
stream, with the round's record and the rounding state) → outbox drain in seq order → PUBACK → ``sent``. Nothing
reaches the network before its transaction has committed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from protocols import wire
from protocols.errors import InvalidRecord, Refused

from .config import AgentConfig, Secrets, load_secrets
from .ledger_guard import check_ledger, mark_key, write_mark
from .ledger_guard import compare as compare_ledger
from .pipeline import Pipeline, PreparedReport, Record
from .rounds import RoundCheck, RoundStatus, answer_round
from .sources import build_sources, source_position
from .state import Commit, ReportRequest, State
from .systemd import Notifier
from .transport import MqttTransport

__all__ = ["Agent", "ReportOutcome", "run_fleet"]

log = logging.getLogger("haarvest.agent")

#: Clipped readings are logged at most once per this many seconds (with the counts since the last such line).
CLIP_LOG_INTERVAL_S = 60.0


@dataclass
class ReportOutcome:
    """What one report attempt did: committed reports, refused streams (stream, reason), or an invalid record."""

    round_id: str
    commits: list[Commit] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    invalid: str | None = None
    exhausted: bool = False
    #: pending outbox rows older than these commits when they committed (None: unknown); 0 means the commits are
    #: exactly what the outbox holds pending
    backlog: int | None = None

    @property
    def charged(self) -> float:
        return sum(c.charged for c in self.commits)


class Agent:
    """One device's agent. Not thread-safe: drive it from one thread (paho's callbacks only queue work)."""

    def __init__(
        self,
        config: AgentConfig,
        source: Any | None = None,
        *,
        secrets: Secrets | None = None,
        transport: MqttTransport | bool | None = None,
        clock: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
        hosted: bool = False,
    ) -> None:
        self.config = config
        #: the state database is one of many this process keeps open (:class:`State` ``hosted``)
        self.hosted = hosted
        self.source = source if source is not None else build_sources(config.sources, config.device_id)
        self.secrets = secrets if secrets is not None else load_secrets(config)
        self.clock = clock
        self.wake = threading.Event()
        if transport is None or transport is True:
            self.transport = MqttTransport(config.mqtt, config.device_id, self.wake) if config.mqtt else None
        elif transport is False:
            self.transport = None
        else:
            self.transport = transport
            self.transport.wake = self.wake
        self.notifier = notifier or Notifier({})
        self.coordinator_key = config.coordinator_key()
        self.state: State | None = None
        self.pipeline: Pipeline | None = None
        self.boot = 0
        self.stats: Counter[str] = Counter()
        self._pending_counters: Counter[str] = Counter()
        self.rounds_answered = 0
        self.readings = 0
        self._clipped_since_log: Counter[str] = Counter()
        self._clip_logged_at = -math.inf
        self.exhausted = False
        self.last_record: Record | None = None
        self._next_sample: float | None = None
        self._next_interval_report: float | None = None
        self._last_compact = 0.0
        self._saved_link: tuple[str, float, str] | None = None  # the broker link as last written to the state
        self._sent_later: list[int] = []
        self._mark: dict[str, Any] = {}
        self._mark_key = b""

    # --- lifecycle ----------------------------------------------------------------------------------------

    def open(self) -> "Agent":
        """Open the state database, count a boot, restore rounding state, connect (if MQTT is configured)."""
        if self.state is not None:
            return self
        # the ledger cannot be silently reset: refuse a missing, older, foreign or damaged ledger (ledger_guard)
        identity = self.config.signing_key_path.exists()
        self._mark_key = mark_key(self.secrets.hmac_secret)
        mark = check_ledger(self.config.database_path, identity, self._mark_key)
        state = State(self.config.database_path, hosted=self.hosted)
        try:
            compare_ledger(state, mark, identity)
            self.pipeline = Pipeline(self.config, self.secrets.hmac_secret, state.load_rounding())
        except BaseException:
            state.close()
            raise
        self.state = state
        rounding = self.pipeline.rounding_state(clear_dirty=False) if self.pipeline.rounding_dirty else None
        self.boot = self.state.begin_boot(rounding)  # one transaction: the boot and any newly drawn α offsets
        if rounding is not None:
            self.pipeline.rounding_saved()
        self._mark = self.state.mark()
        write_mark(self.config.state_dir, self._mark, self._mark_key)
        if self.transport is not None:
            self.transport.start({"boot": self.boot, "key_id": self.secrets.key_id})
        log.info(
            "agent started",
            extra={
                "event": "started",
                "device_id": self.config.device_id,
                "boot": self.boot,
                "streams": {n: p.mechanism_name for n, p in self.pipeline.streams.items()},
                "pending": self.state.pending_count(),
            },
        )
        return self

    def close(self, drain_timeout: float = 0.0) -> None:
        """Flush counters and rounding state; optionally wait for the outbox to drain; disconnect cleanly."""
        if self.state is None:
            return
        if drain_timeout > 0:
            self.drain(drain_timeout)
        self.flush_sent()
        self._log_clipped(force=True)
        self._flush_counters()
        self._persist_rounding()
        if self.transport is not None:
            self.transport.stop()
            self.step_acks()
            self._save_link(("stopped", time.time(), "agent closed"))
        close = getattr(self.source, "close", None)
        if callable(close):
            close()
        self.state.close()
        self.state = None
        log.info("agent stopped", extra={"event": "stopped", "device_id": self.config.device_id})

    def __enter__(self) -> "Agent":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _require(self) -> tuple[State, Pipeline]:
        if self.state is None or self.pipeline is None:
            raise RuntimeError("agent is not open (call open())")
        return self.state, self.pipeline

    # --- readings -----------------------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] += n
        self._pending_counters[name] += n

    def _flush_counters(self) -> None:
        if self.state is not None and self._pending_counters:
            self.state.bump(dict(self._pending_counters))
            self._pending_counters.clear()

    def _persist_rounding(self) -> None:
        if self.state is not None and self.pipeline is not None and self.pipeline.rounding_dirty:
            self.state.save_rounding(self.pipeline.rounding_state())

    def mark_sent_later(self, seqs: list[int]) -> None:
        """Outbox rows a transport with at-most-once delivery has taken (a Flower reply): they are marked ``sent``
        in the device's next write transaction (the next report's, or :meth:`flush_sent`) instead of one of their
        own. They were durable before they left; until marked, a crash leaves them ``pending`` and they go out again
        with the next reply (the coordinator drops the copies as duplicates)."""
        self._sent_later.extend(int(s) for s in seqs)

    @property
    def sent_unmarked(self) -> int:
        """How many rows of :meth:`mark_sent_later` still wait for their ``sent`` mark."""
        return len(self._sent_later)

    def flush_sent(self) -> None:
        """Mark the rows of :meth:`mark_sent_later` sent now (one transaction; nothing to do if none wait)."""
        if self._sent_later and self.state is not None:
            self.state.mark_sent(self._sent_later)
            self._sent_later.clear()

    def sample(self) -> Record | None:
        """Read the source once and feed the pipeline (volatility windows, epochs). None if invalid/exhausted."""
        _, pipeline = self._require()
        reading = self.source.read()
        if reading is None:
            self.exhausted = True
            return None
        self.readings += 1
        try:
            record = pipeline.observe(reading)
        except InvalidRecord as exc:
            self._count("invalid_records")
            self._count(f"invalid.{exc.reason}")
            where = source_position(self.source)
            value = exc.shown_value() if self.config.privacy.log_invalid_values else exc.described_value()
            log.warning(
                "invalid record dropped%s: %s, value: %s; nothing sent, nothing charged",
                f" at {where}" if where else "", exc, value,
                extra={"event": "invalid_record", "reason": exc.reason, "dimension": exc.dimension,
                       "detail": str(exc), "source_line": where, "value": value},
            )
            return None
        for name in record.clipped:
            self._count(f"clipped.{name}")
            self._clipped_since_log[name] += 1
        if record.clipped:
            self._log_clipped()
        self.last_record = record
        return record

    def _log_clipped(self, force: bool = False) -> None:
        """One warning for the readings clipped to their bounds since the last such line, at most every
        :data:`CLIP_LOG_INTERVAL_S` seconds (counts per dimension, with the totals; never the values)."""
        if not self._clipped_since_log:
            return
        now = time.monotonic()
        if not force and now - self._clip_logged_at < CLIP_LOG_INTERVAL_S:
            return
        totals = self.pipeline.clipped_total if self.pipeline is not None else {}
        parts = []
        for name, n in sorted(self._clipped_since_log.items()):
            d = self.config.dimension(name)
            parts.append(f"{name}: {n} outside [{d.lo:g}, {d.hi:g}] ({totals.get(name, n)} since start)")
        log.warning("readings clipped to their bounds: %s", "; ".join(parts),
                    extra={"event": "clipped", "clipped": dict(self._clipped_since_log)})
        self._clipped_since_log.clear()
        self._clip_logged_at = now

    # --- reporting ----------------------------------------------------------------------------------------

    def _payload(self, prepared: PreparedReport, round_id: str) -> Callable[[int, dict[str, Any]], tuple[str, bytes]]:
        topic = wire.report_topic(self.config.device_id)

        def make(seq: int, body: dict[str, Any]) -> tuple[str, bytes]:
            report = wire.Report(
                device_id=self.config.device_id,
                boot=self.boot,
                seq=seq,
                round_id=round_id,
                stream=prepared.stream,
                mechanism=prepared.mechanism,
                body=body,
            )
            payload = wire.signed_report_bytes(report, topic, self.secrets.signing_key)
            if len(payload) > wire.MAX_PAYLOAD:
                raise Refused("too_large", f"{len(payload)} bytes > {wire.MAX_PAYLOAD}")
            return topic, payload

        return make

    def report(
        self,
        round_id: str,
        streams: list[str] | None = None,
        round_cap: float | None = None,
        record: Record | None = None,
        plans: dict[str, Any] | None = None,
        round_status: tuple[str, str] | None = None,
    ) -> ReportOutcome:
        """Take a fresh reading (unless ``record`` is given) and commit one report per stream.

        The device round is ONE write transaction (:meth:`State.commit_reports`): every stream's report (ledger
        debit, memo entry, signed outbox row), the α-rounding state the reading was rounded with, the status
        counters, the ``sent`` marks of :meth:`mark_sent_later` and — with ``round_status = (status, detail)`` —
        the round's record (a round is answered at most once: the record commits with the reports or not at all).
        A stream refused (cap, round budget, full outbox) is logged and counted and sends nothing, the others go
        on. An invalid reading sends nothing and charges nothing (the round record and counters still commit).
        """
        state, pipeline = self._require()
        outcome = ReportOutcome(round_id)
        round_record = (round_id, *round_status) if round_status is not None else None
        if record is None:
            record = self.sample()
            if record is None:
                outcome.exhausted = self.exhausted
                outcome.invalid = None if self.exhausted else "invalid_record"
                if round_record is not None or self._sent_later:
                    self._commit([], round_record, None)
                else:
                    self._flush_counters()
                return outcome
        cap = self.config.privacy.max_round_epsilon if round_cap is None else round_cap
        prepared_list = pipeline.prepare(record, streams, plans, now=self.clock())
        requests = [
            ReportRequest(
                stream=p.stream,
                round_id=round_id,
                memo_key=p.memo_key,
                spec=p.spec,
                mechanism=p.mechanism,
                epsilon=p.epsilon,
                stream_cap=p.cap,
                round_cap=cap,
                make_body=p.make_body,
                make_payload=self._payload(p, round_id),
                memoize=p.memoize,
                refresh=p.refresh,
                delta=p.delta,
                unit=p.unit,
                until=p.until,
                state=p.state,
            )
            for p in prepared_list
        ]
        results = self._commit(requests, round_record, cap)
        outcome.backlog = state.backlog
        for prepared, result in zip(prepared_list, results):
            if isinstance(result, Refused):
                self.stats[f"refused.{result.reason}"] += 1
                outcome.refused.append((prepared.stream, result.reason))
                log.warning(
                    "report refused: nothing sent",
                    extra={"event": "refused", "stream": prepared.stream, "round_id": round_id,
                           "reason": result.reason, "detail": result.detail},
                )
                continue
            outcome.commits.append(result)
            if prepared.on_commit is not None:
                prepared.on_commit()
            self.stats["memo_hits" if result.memo_hit else "charged_reports"] += 1
        self.rounds_answered += 1
        if log.isEnabledFor(logging.DEBUG):  # its fields cost more than the check (a shard host answers thousands)
            log.debug(
                "reported",
                extra={"event": "reported", "round_id": round_id, "seqs": [c.seq for c in outcome.commits],
                       "charged": outcome.charged, "refused": outcome.refused},
            )
        return outcome

    def _commit(self, requests: list[ReportRequest], round_record: tuple[str, str, str] | None,
                round_cap: float | None) -> list[Commit | Refused]:
        """The device round's one transaction (see :meth:`report`); in-memory marks are cleared once it committed."""
        state, pipeline = self._require()
        rounding = pipeline.rounding_state(clear_dirty=False) if pipeline.rounding_dirty else None
        counters = dict(self._pending_counters)
        sent = list(self._sent_later)
        results = state.commit_reports(
            requests,
            total_cap=self.config.ledger.total_cap,
            renewal_period_s=self.config.ledger.renewal_period_s,
            max_pending=self.config.outbox.max_pending,
            counters=counters,
            now=self.clock(),
            delta_cap=self.config.ledger.delta_cap,
            round_record=round_record,
            rounding=rounding,
            sent=sent,
        )
        if rounding is not None:
            pipeline.rounding_saved()
        committed = [r for r in results if isinstance(r, Commit)]
        if committed:  # the mark follows the committed ledger (never ahead of it: written after the commit)
            self._mark["next_seq"] = max(c.seq for c in committed) + 1
            self._mark["spent_total"] += sum(c.charged for c in committed)
            if state.ledger_max is not None:  # None: the batch wrote no ledger row
                self._mark["ledger_rows"] = state.ledger_max
            write_mark(self.config.state_dir, self._mark, self._mark_key)
        for name, n in counters.items():  # committed: forget them (nothing counts while the transaction runs)
            left = self._pending_counters[name] - n
            if left:
                self._pending_counters[name] = left
            else:
                del self._pending_counters[name]
        del self._sent_later[: len(sent)]
        return results

    # --- rounds -------------------------------------------------------------------------------------------

    def handle_round(self, payload: bytes) -> ReportOutcome | None:
        """A round config from the coordinator (the retained ``rounds/current``): the outcome of
        :func:`edge_agent.rounds.answer_round` — the one path MQTT and Flower rounds share — or None when the
        round was not answered (its status is counted and logged there)."""
        return self.answer_round(payload)[1]

    def answer_round(self, payload: bytes, now: float | None = None,
                     check: RoundCheck | None = None) -> tuple[RoundStatus, ReportOutcome | None]:
        """``(status, outcome)`` of answering signed round bytes (:func:`edge_agent.rounds.answer_round`)."""
        return answer_round(self, payload, now=now, check=check)

    def stream_specs(self) -> dict[str, dict[str, Any]]:
        """``{stream: StreamSpec}`` (JSON-ready, :mod:`protocols.contract`) a round must send for this device to
        answer every stream as configured — build rounds from this (the device refuses other bounds)."""
        if self.pipeline is not None:
            return self.pipeline.stream_specs()
        from .plans import stream_specs

        return stream_specs(self.config)

    # --- the loop -----------------------------------------------------------------------------------------

    def step_acks(self) -> None:
        state, _ = self._require()
        if self.transport is None:
            return
        sent, rejected = self.transport.take_acks()
        if sent:
            state.mark_sent(sent)
            self.stats["acked"] += len(sent)
        if rejected:
            state.mark_sent(rejected, status="rejected")
            self.stats["rejected_by_broker"] += len(rejected)
            log.warning("broker rejected reports", extra={"event": "broker_rejected", "seqs": rejected})

    def step(self, now: float | None = None) -> None:
        """Non-blocking unit of work: acks, fallback, incoming rounds, scheduled sampling/reports, outbox drain."""
        state, _ = self._require()
        now = self.clock() if now is None else now
        tr = self.transport
        if tr is not None:
            self.step_acks()
            tr.maybe_fallback()
            for payload in tr.take_rounds():
                self.handle_round(payload)
        cfg = self.config
        if cfg.sample_interval_s and not self.exhausted:
            if self._next_sample is None:
                self._next_sample = now
            if now >= self._next_sample:
                self.sample()
                self._next_sample = max(self._next_sample + cfg.sample_interval_s, now)
        if cfg.schedule == "interval" and not self.exhausted:
            if self._next_interval_report is None:  # aligned: every device reports at the same boundaries
                self._next_interval_report = (math.floor(now / cfg.report_interval_s) + 1) * cfg.report_interval_s
            if now >= self._next_interval_report:
                idx = int(math.floor(now / cfg.report_interval_s))
                self.report(f"interval-{idx}")
                self._next_interval_report = (idx + 1) * cfg.report_interval_s
        if tr is not None:
            tr.resend_due()
            cap = tr.capacity()
            if cap > 0:
                tr.submit(state.pending(after_seq=tr.last_submitted, limit=cap))
            self._save_link(tr.link)
        if now - self._last_compact > 3600:
            self._last_compact = now
            state.compact(cfg.outbox.keep_sent)
            self._flush_counters()
        self.notifier.watchdog()

    def _save_link(self, link: tuple[str, float, str]) -> None:
        """Persist the transport's link state when it changes (``agent status`` reads it from the state file)."""
        if link != self._saved_link and self.state is not None:
            self.state.save_link(*link)
            self._saved_link = link

    def drain(self, timeout: float) -> bool:
        """Step until the outbox has no pending rows (True) or ``timeout`` seconds pass (False)."""
        state, _ = self._require()
        if self.transport is None:
            return state.pending_count() == 0
        deadline = time.monotonic() + timeout
        while True:
            self.step_acks()
            if state.pending_count() == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            self.transport.resend_due()
            cap = self.transport.capacity()
            if cap:
                self.transport.submit(state.pending(after_seq=self.transport.last_submitted, limit=cap))
            self.wake.wait(0.05)
            self.wake.clear()

    def run(
        self,
        stop: threading.Event | None = None,
        max_rounds: int | None = None,
        max_readings: int | None = None,
        drain_timeout: float = 10.0,
        poll_s: float = 0.2,
    ) -> int:
        """Run until ``stop`` is set, ``max_rounds`` rounds are answered, ``max_readings`` readings are taken, or the
        source is exhausted; then drain the outbox (up to ``drain_timeout``) and close. Returns rounds answered."""
        stop = stop or threading.Event()
        self.open()
        self.notifier.ready(f"device {self.config.device_id} boot {self.boot}")
        try:
            while not stop.is_set():
                self.step()
                if max_rounds is not None and self.rounds_answered >= max_rounds:
                    break
                if max_readings is not None and self.readings >= max_readings:
                    break
                if self.exhausted:
                    break
                self.wake.wait(self._wait_time(poll_s))
                self.wake.clear()
        finally:
            self.notifier.stopping()
            self.close(drain_timeout=drain_timeout if self.transport is not None else 0.0)
        return self.rounds_answered

    def _wait_time(self, poll_s: float) -> float:
        now = self.clock()
        nxt = [t for t in (self._next_sample, self._next_interval_report) if t is not None]
        wait = min([poll_s] + [max(0.0, t - now) for t in nxt])
        if self.notifier.watchdog_interval:
            wait = min(wait, self.notifier.watchdog_interval)
        return max(0.001, wait)

    def status(self) -> dict[str, Any]:
        state, pipeline = self._require()
        out = state.status()
        out.update(
            device_id=self.config.device_id,
            connected=bool(self.transport and self.transport.connected.is_set()),
            inflight=self.transport.inflight if self.transport else 0,
            volatility=pipeline.volatility_scores(),
            session_stats=dict(self.stats),
        )
        return out


def run_fleet(
    agents: list[Agent],
    stop: threading.Event | None = None,
    max_rounds: int | None = None,
    poll_s: float = 0.05,
    drain_timeout: float = 10.0,
    timeout: float | None = None,
) -> None:
    """Drive many embedded agents from ONE thread (plus one paho thread per MQTT agent).

    Every agent is opened, stepped round-robin until ``stop`` is set, every agent has answered ``max_rounds``
    rounds or ``timeout`` seconds pass, then drained and closed.
    """
    stop = stop or threading.Event()
    for a in agents:
        a.open()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not stop.is_set():
            for a in agents:
                a.step()
            if max_rounds is not None and all(a.rounds_answered >= max_rounds or a.exhausted for a in agents):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            stop.wait(poll_s)
    finally:
        end = time.monotonic() + drain_timeout
        for a in agents:
            a.close(drain_timeout=max(0.0, end - time.monotonic()) if a.transport is not None else 0.0)
