"""Answering a signed round: the one path the MQTT agent and the Flower client share.

A round arrives as the coordinator's signed :class:`protocols.wire.RoundConfig` bytes — on the retained MQTT topic
``rounds/current`` (:meth:`edge_agent.agent.Agent.handle_round`) or in a Flower ``query.round`` message
(:class:`edge_agent.flower_app.DeviceShard`). Both hand the bytes to :func:`answer_round`, which decides, in this
order, and returns ``(status, outcome)``:

=====================  ======================================================  ==============================
status                 when                                                    recorded / counted
=====================  ======================================================  ==============================
``cleared``            empty payload: the coordinator cleared the retained      ``rounds.cleared`` (in memory)
                       round ("no open round"; MQTT deletes a retained
                       message with a zero-length one)
``malformed``          the bytes do not decode as a round config, or its        ``rounds.malformed`` (+ round
                       ``params.streams`` is neither a list nor a mapping       record ``refused`` when decoded)
``no_coordinator_key`` the device was provisioned without a coordinator key     ``rounds.no_coordinator_key``
``bad_signature``      the Ed25519 signature does not verify                    ``rounds.bad_signature``
``seen``               the round id was answered (or refused) before: a round   nothing
                       is answered at most once, across reboots
``expired``            past the round's ``not_after``                           round record, ``rounds.expired``
``refused_epsilon``    ε above ``privacy.max_round_epsilon`` with               round record,
                       ``round_policy = "refuse"``                              ``rounds.refused_epsilon``
``no_streams``         the round asks for streams and the device can answer     round record, ``rounds.no_streams``
                       none of them
``answered``           reports committed (ε clamped to the device maximum:      round record with the reports,
``answered_clamped``   ``answered_clamped``, round record detail ``clamped``)    ``rounds.answered``
                                                                                (+ ``rounds.clamped``)
=====================  ======================================================  ==============================

Streams the device cannot answer as asked are skipped, the others answered: each appears in the outcome's
``refused`` as ``(stream, "spec_<reason>")`` — the reasons of :meth:`edge_agent.pipeline.Pipeline.round_plans`
(docs/agent.md) and ``unknown`` for a stream the device does not have — and is counted as
``rounds.stream_refused`` and ``rounds.stream_refused.<reason>``.

A shard of devices verifies the same bytes against the same coordinator key once (:class:`RoundCheck`, memoized:
Ed25519 verification is a deterministic function of key, message and signature); a single device checks afresh.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocols import wire
from protocols.contract import StreamSpec

if TYPE_CHECKING:  # the agent imports this module
    from .agent import Agent, ReportOutcome

__all__ = ["RoundStatus", "RoundCheck", "answer_round"]

log = logging.getLogger("haarvest.agent")


class RoundStatus(StrEnum):
    """What a device did with a round configuration (see the module docstring)."""

    CLEARED = "cleared"
    MALFORMED = "malformed"
    NO_COORDINATOR_KEY = "no_coordinator_key"
    BAD_SIGNATURE = "bad_signature"
    SEEN = "seen"
    EXPIRED = "expired"
    REFUSED_EPSILON = "refused_epsilon"
    NO_STREAMS = "no_streams"
    ANSWERED = "answered"
    ANSWERED_CLAMPED = "answered_clamped"


def _prevalidated(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` with each stream spec of a ``{stream: StreamSpec}`` mapping validated once (a spec that does not
    validate is left as it is: the device refuses it as before). :meth:`Pipeline.plan_for` skips the validation of
    an already validated spec, so every device of a shard answers from the same validated specs."""
    streams = params.get("streams") if isinstance(params, Mapping) else None
    if not isinstance(streams, Mapping):
        return params
    out: dict[str, Any] = {}
    for name, spec in streams.items():
        if isinstance(spec, Mapping) and not isinstance(spec, StreamSpec):
            try:
                spec = StreamSpec.model_validate(dict(spec))
            except (ValueError, TypeError):
                pass
        out[name] = spec
    return {**params, "streams": out}


class RoundCheck:
    """Decodes a signed round configuration and verifies its signature against a coordinator key — each distinct
    (key, payload) once when ``memo`` (a shard's devices verify the same bytes against the same provisioned key).

    Calling it returns ``(status, config, params)``: status ``ok`` (config verified; params = ``config.params``,
    with the stream specs validated once when memoizing, :func:`_prevalidated`), or ``malformed`` /
    ``no_coordinator_key`` / ``bad_signature`` with config and params None. ``memo=False`` checks every call afresh.
    """

    def __init__(self, memo: bool = True, size: int = 8) -> None:
        self.memo = memo
        self.size = int(size)
        self._seen: OrderedDict[tuple[bytes, bytes], tuple[str, wire.RoundConfig | None, Any]] = OrderedDict()
        self.verified = 0

    def __call__(self, payload: bytes, key: Ed25519PublicKey | None) -> tuple[str, wire.RoundConfig | None, Any]:
        memo_key = (key.public_bytes_raw() if key is not None else b"", bytes(payload)) if self.memo else None
        if memo_key is not None:
            hit = self._seen.get(memo_key)
            if hit is not None:
                return hit
        result = self._check(payload, key)
        if memo_key is not None:
            self._seen[memo_key] = result
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)
        return result

    def _check(self, payload: bytes, key: Ed25519PublicKey | None) -> tuple[str, wire.RoundConfig | None, Any]:
        try:
            rc = wire.decode_round(payload)
        except wire.WireError as exc:
            log.warning("round config rejected", extra={"event": "round_rejected", "reason": exc.reason})
            return RoundStatus.MALFORMED, None, None
        if key is None:
            log.warning("round ignored: no coordinator key configured",
                        extra={"event": "round_rejected", "round_id": rc.round_id})
            return RoundStatus.NO_COORDINATOR_KEY, None, None
        self.verified += 1
        try:
            wire.verify_round(rc, key)
        except wire.WireError as exc:
            log.warning("round config rejected", extra={"event": "round_rejected", "round_id": rc.round_id,
                                                        "reason": exc.reason})
            return RoundStatus.BAD_SIGNATURE, None, None
        return "ok", rc, _prevalidated(rc.params) if self.memo else rc.params


def answer_round(agent: Agent, payload: bytes, now: float | None = None,
                 check: RoundCheck | None = None) -> tuple[RoundStatus, ReportOutcome | None]:
    """Verify a signed round configuration and answer it through the agent's pipeline and ledger.

    Returns ``(status, outcome)``: the outcome of an answered round, an outcome with no commits and the refused
    streams for ``no_streams``, None otherwise (module docstring: statuses, records, counters). ``now``: the clock for ``not_after`` (default the agent's). ``check``: the decoder/verifier
    (a shard shares one memoizing :class:`RoundCheck`; default: a fresh check).
    """
    state, pipeline = agent._require()
    if not payload:
        agent.stats["rounds.cleared"] += 1
        log.info("no open round", extra={"event": "rounds_cleared"})
        return RoundStatus.CLEARED, None
    status, rc, params = (check or RoundCheck(memo=False))(payload, agent.coordinator_key)
    if rc is None:
        agent._count(f"rounds.{status}")
        return RoundStatus(status), None
    if state.round_seen(rc.round_id) is not None:
        return RoundStatus.SEEN, None  # retained config redelivered on reconnect: answered (or refused) already
    now = agent.clock() if now is None else now
    if rc.not_after is not None and now > rc.not_after:
        state.record_round(rc.round_id, "expired")
        agent._count("rounds.expired")
        return RoundStatus.EXPIRED, None
    epsilon = rc.epsilon
    max_eps = agent.config.privacy.max_round_epsilon
    clamped = epsilon > max_eps
    if clamped:
        if agent.config.privacy.round_policy == "refuse":
            state.record_round(rc.round_id, "refused", f"epsilon {epsilon} > max {max_eps}")
            agent._count("rounds.refused_epsilon")
            log.warning("round refused: epsilon above the device maximum",
                        extra={"event": "round_refused", "round_id": rc.round_id, "epsilon": epsilon,
                               "max_round_epsilon": max_eps})
            return RoundStatus.REFUSED_EPSILON, None
        agent._count("rounds.clamped")
        log.info("round epsilon clamped to the device maximum",
                 extra={"event": "round_clamped", "round_id": rc.round_id, "epsilon": epsilon,
                        "max_round_epsilon": max_eps})
        epsilon = max_eps
    try:
        answer = pipeline.round_plans(params)  # the device/coordinator contract
    except ValueError as exc:
        state.record_round(rc.round_id, "refused", str(exc))
        agent._count("rounds.malformed")
        return RoundStatus.MALFORMED, None
    skipped = list(answer.refused) + [(name, "unknown") for name in answer.unknown]
    for name, reason in skipped:
        agent._count("rounds.stream_refused")
        agent._count(f"rounds.stream_refused.{reason}")
        log.warning("round stream refused", extra={"event": "round_stream_refused", "round_id": rc.round_id,
                                                   "stream": name, "reason": reason})
    refused = [(name, f"spec_{reason}") for name, reason in skipped]
    if answer.streams is not None and not answer.streams:
        from .agent import ReportOutcome  # noqa: F811 (at run time: the agent module imports this one)

        state.record_round(rc.round_id, "refused", f"no answerable streams: {skipped}")
        agent._count("rounds.no_streams")
        return RoundStatus.NO_STREAMS, ReportOutcome(rc.round_id, refused=refused)
    # recorded in the reports' transaction: a crash mid-round never answers the same round twice
    outcome = agent.report(rc.round_id, streams=answer.streams, round_cap=epsilon, plans=answer.plans,
                           round_status=("answered", "clamped" if clamped else ""))
    outcome.refused.extend(refused)
    agent._count("rounds.answered")
    return (RoundStatus.ANSWERED_CLAMPED if clamped else RoundStatus.ANSWERED), outcome
