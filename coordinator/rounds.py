"""Collection rounds: signed, published, stored — and planned from earlier rounds' aggregates (SPEC §5).

A round is a :class:`protocols.wire.RoundConfig` whose ``params`` follow :class:`protocols.contract.RoundParams`.
:class:`RoundManager` validates it (every stream's mechanism must build; the streams' ε must add up to at most
the round's ε — one device answers every stream, sequential composition, SPEC §4), signs it with the
coordinator's Ed25519 key, stores it, and publishes it retained on ``haarvest/v1/rounds/current`` and
``haarvest/v1/rounds/<id>``.

**Sequential interaction.** The planners below compute a round's parameters only from *published aggregates* of
earlier rounds (post-processing of ε-LDP outputs costs no privacy; SPEC §4 "post-processing is free", and the
adaptive-composition theorem of SPEC §4 covers devices whose channel depends on them); ``depends_on`` records
which rounds were used:

* :func:`plan_rounding_steps` — adaptive α-rounding steps per dimension from the volatility of the estimated
  means over the previous rounds (the coordinator-side analogue of SPEC §2.2);
* :func:`plan_heavy_hitters` — prefix extension for heavy hitters: keep the (prefix, next bits) items whose
  estimated frequency is significantly above zero, and ask about their extensions next round (SPEC §3.13).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.estimate import StreamEstimate, select_heavy_hitters
from protocols.contract import HeavyHitterSpec, RoundParams, StreamSpec, parse_round_params
from coordinator.store import Store
from protocols import wire
from protocols.base import check_bounds
from protocols.rounding import quantise_step, quantised_step

__all__ = ["RoundManager", "check_round_params", "plan_rounding_steps", "plan_heavy_hitters",
           "heavy_hitters_from_estimate"]

Publisher = Callable[[str, bytes, bool], None]


def check_round_params(params: RoundParams, epsilon: float) -> None:
    """Every stream's mechanisms build with their parameters, and Σ stream ε ≤ round ε (ValueError otherwise)."""
    for name, spec in params.streams.items():
        try:
            spec.build()
        except (ValueError, ImportError, AttributeError) as exc:
            raise ValueError(f"stream {name!r}: mechanism {spec.wire_mechanism!r}: {exc}") from None
        if spec.epsilon <= 0:
            raise ValueError(f"stream {name!r}: its mechanism params must state epsilon > 0")
    if params.epsilon > epsilon * (1 + 1e-12):
        raise ValueError(f"the streams spend ε = {params.epsilon:g} per device, more than the round's ε = {epsilon:g}")


class RoundManager:
    """Opens, closes, lists and publishes rounds.

    Args:
        store: durable storage of the signed configurations and their status.
        key: the coordinator's Ed25519 signing key (devices verify rounds against its public key).
        publish: ``publish(topic, payload, retain)`` — e.g. the ingest worker's MQTT client; None = do not publish.
        on_change: called with ``(config, status)`` after a round is opened or closed (the validator's cache).
    """

    def __init__(self, store: Store, key: Ed25519PrivateKey, publish: Publisher | None = None,
                 on_change: Callable[[wire.RoundConfig, str], None] | None = None) -> None:
        self.store = store
        self.key = key
        self.publish = publish
        self.on_change = on_change

    @property
    def public_key(self) -> str:
        return wire.public_key_b64(self.key)

    def open_round(self, round_id: str, epsilon: float, params: RoundParams | dict[str, Any], protocol: str = "telemetry",
                   depends_on: Sequence[str] = (), not_after: float | None = None, check: bool = True) -> wire.RoundConfig:
        """Validate, sign, store and publish a new round; returns the signed configuration."""
        parsed = parse_round_params(params)
        if check:
            check_round_params(parsed, float(epsilon))
        known = {r["round_id"] for r in self.store.rounds()}
        missing = [d for d in depends_on if d not in known]
        if missing:
            raise ValueError(f"depends_on names unknown rounds: {missing}")
        config = wire.RoundConfig(
            round_id=round_id, protocol=protocol, epsilon=float(epsilon),
            params=parsed.model_dump(mode="json", exclude_none=True), depends_on=list(depends_on),
            not_after=not_after,
        )
        signed = wire.sign_round(config, self.key)
        self.store.put_round(round_id, signed.to_bytes().decode(), "open")
        if self.on_change:
            self.on_change(signed, "open")
        self._publish(signed, current=True)
        return signed

    def close_round(self, round_id: str) -> None:
        """Close a round: its retained topic is cleared and ``current`` becomes the newest open round, or is cleared
        (an empty retained payload) when none is open — devices stop answering a closed round."""
        self.store.set_round_status(round_id, "closed")
        if self.on_change:
            self.on_change(self.get(round_id), "closed")
        if self.publish is not None:
            self.publish(wire.round_topic(round_id), b"", True)
            newest = self.current()
            if newest is None:
                self.publish(wire.ROUNDS_CURRENT_TOPIC, b"", True)
            else:
                self._publish(newest, current=True)

    def get(self, round_id: str) -> wire.RoundConfig:
        row = self.store.round(round_id)
        if row is None:
            raise ValueError(f"unknown round {round_id!r}")
        return wire.RoundConfig.model_validate(json.loads(row["config"]))

    def params(self, round_id: str) -> RoundParams:
        return parse_round_params(self.get(round_id).params)

    def list(self) -> list[dict[str, Any]]:
        out = []
        for row in self.store.rounds():
            cfg = json.loads(row["config"])
            out.append({"round_id": row["round_id"], "status": row["status"], "opened_at": row["opened_at"],
                        "closed_at": row["closed_at"], "protocol": cfg["protocol"], "epsilon": cfg["epsilon"],
                        "depends_on": cfg.get("depends_on", []), "streams": sorted(cfg["params"]["streams"]),
                        "config": cfg})
        return out

    def current(self) -> wire.RoundConfig | None:
        """The most recently opened round that is still open."""
        open_rows = [r for r in self.store.rounds() if r["status"] == "open"]
        return wire.RoundConfig.model_validate(json.loads(open_rows[-1]["config"])) if open_rows else None

    def republish(self) -> None:
        """Publish every open round (retained) again, the newest as ``current`` (e.g. after a broker reset)."""
        open_rows = [r for r in self.store.rounds() if r["status"] == "open"]
        for i, row in enumerate(open_rows):
            self._publish(wire.RoundConfig.model_validate(json.loads(row["config"])), current=i == len(open_rows) - 1)

    def _publish(self, config: wire.RoundConfig, current: bool) -> None:
        if self.publish is None:
            return
        payload = config.to_bytes()
        self.publish(wire.round_topic(config.round_id), payload, True)
        if current:
            self.publish(wire.ROUNDS_CURRENT_TOPIC, payload, True)

    # ------------------------------------------------------------------ planning
    def open_next_round(self, round_id: str, epsilon: float, base: RoundParams | dict[str, Any],
                        history: Sequence[tuple[str, dict[str, StreamEstimate]]], protocol: str = "adaptive",
                        **planner_args: Any) -> wire.RoundConfig:
        """Open a round whose rounding steps / heavy-hitter candidates are planned from ``history``.

        ``history`` is ``[(round_id, {stream: StreamEstimate})]`` of the earlier rounds, oldest first (the output of
        :func:`coordinator.estimate.estimate_round`). Streams of ``base`` with bounds get ``rounding`` from
        :func:`plan_rounding_steps`; streams with ``heavy_hitters`` are extended by :func:`plan_heavy_hitters`
        from the latest round's estimate of the same stream.
        """
        params = plan_round(parse_round_params(base), history, **planner_args)
        return self.open_round(round_id, epsilon, params, protocol=protocol,
                               depends_on=[rid for rid, _ in history])


# ---------------------------------------------------------------------- planners (pure functions)


def plan_rounding_steps(means: Sequence[Sequence[float]], stderrs: Sequence[Sequence[float]], lo: Any, hi: Any,
                        k_base: int = 100, eta: float = 0.1, max_fraction: float = 0.25) -> np.ndarray:
    """α-rounding step per dimension for the next round from the previous rounds' estimated means.

    The population analogue of SPEC §2.2: with ``x̄_r`` the estimated mean of round r (standard error ``s_r``),
    the volatility score is the average noise-corrected change between consecutive rounds,

        score_j = mean_r max(0, |x̄_{r,j} - x̄_{r-1,j}| - sqrt(s_{r,j}² + s_{r-1,j}²)) / (hi_j - lo_j),

    (subtracting the difference's standard error so estimation noise alone does not look volatile), and
    ``step_j = (hi_j - lo_j) · max(1/K_base, score_j/η)`` quantised up to the nested grid
    (:func:`protocols.rounding.quantised_step`, the device's rule for its epochs), capped at
    ``max_fraction·(hi_j - lo_j)`` quantised (:func:`protocols.rounding.quantise_step`; quantising is monotone, so
    the cap commutes with it). Fewer than two rounds: the finest step ``(hi - lo)/K_base``.
    Uses only published aggregates (post-processing).
    """
    lo_a, hi_a = check_bounds(lo, hi)
    if k_base < 1 or eta <= 0 or not 0 < max_fraction <= 1:
        raise ValueError("need k_base >= 1, eta > 0 and 0 < max_fraction <= 1")
    width = hi_a - lo_a
    m = np.asarray(means, dtype=float).reshape(len(means), -1) if len(means) else np.empty((0, lo_a.size))
    s = np.asarray(stderrs, dtype=float).reshape(m.shape) if len(means) else m
    if m.shape[0] >= 2:
        diffs = np.abs(np.diff(m, axis=0)) - np.sqrt(s[1:] ** 2 + s[:-1] ** 2)
        score = np.maximum(diffs, 0.0).mean(axis=0) / width
    else:
        score = np.zeros_like(width)
    return np.minimum(quantised_step(lo_a, hi_a, score, k_base, eta),
                      quantise_step(max_fraction * width, lo_a, hi_a, k_base))


def heavy_hitters_from_estimate(spec: HeavyHitterSpec, est: StreamEstimate, z: float = 3.0,
                                max_candidates: int = 16, min_frequency: float = 0.0) -> list[tuple[int, float]]:
    """The items (as (prefix_bits + step_bits)-bit prefixes) the round selects, largest first, catch-all item
    excluded: :func:`coordinator.estimate.select_heavy_hitters` — estimates reaching the round's ``threshold`` (unset:
    exceeding ``max(z·stderr, min_frequency)``), at most its ``top_k`` (unset: ``max_candidates``)."""
    keep = select_heavy_hitters(spec, est.estimate, est.stderr, z, max_candidates, min_frequency)
    f = np.asarray(est.estimate, dtype=float)
    return [(int(spec.item_prefix(int(i))), float(f[i])) for i in keep]  # type: ignore[arg-type]


def plan_heavy_hitters(spec: HeavyHitterSpec, est: StreamEstimate, z: float = 3.0, max_candidates: int = 16,
                       min_frequency: float = 0.0) -> HeavyHitterSpec | None:
    """Next round's prefix extension: candidates = this round's selected (prefix, next bits) items
    (:func:`heavy_hitters_from_estimate`); the round's ``threshold`` and ``top_k`` carry over.

    Returns None when the prefixes already have ``bits`` bits (done) or nothing is selected.
    """
    new_prefix_bits = spec.prefix_bits + spec.step_bits
    if new_prefix_bits >= spec.bits:
        return None
    found = heavy_hitters_from_estimate(spec, est, z, max_candidates, min_frequency)
    if not found:
        return None
    step = min(spec.step_bits, spec.bits - new_prefix_bits)
    return HeavyHitterSpec(bits=spec.bits, prefix_bits=new_prefix_bits, step_bits=step,
                           candidates=sorted(p for p, _ in found), threshold=spec.threshold, top_k=spec.top_k)


def plan_round(base: RoundParams, history: Sequence[tuple[str, dict[str, StreamEstimate]]], k_base: int = 100,
               eta: float = 0.1, z: float = 3.0, max_candidates: int = 16) -> RoundParams:
    """Apply both planners to every stream of ``base`` that they concern (see :meth:`RoundManager.open_next_round`)."""
    streams: dict[str, StreamSpec] = {}
    for name, spec in base.streams.items():
        update: dict[str, Any] = {}
        past = [ests[name] for _, ests in history if name in ests and ests[name].error is None]
        if spec.bounds is not None and spec.kind in ("numeric", "vector", "haar"):
            lo, hi = spec.lo_hi()
            steps = plan_rounding_steps([p.estimate for p in past], [p.stderr for p in past], lo, hi, k_base, eta)
            update["rounding"] = [float(s) for s in steps]
        if spec.heavy_hitters is not None and past:
            nxt = plan_heavy_hitters(spec.heavy_hitters, past[-1], z, max_candidates)
            if nxt is not None:
                update["heavy_hitters"] = nxt
                update["params"] = {**spec.params, "k": nxt.k}
        data = spec.model_dump(mode="python")
        data.update({k: (v.model_dump() if hasattr(v, "model_dump") else v) for k, v in update.items()})
        streams[name] = StreamSpec.model_validate(data)
    return RoundParams(streams=streams)
