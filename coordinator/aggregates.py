"""Check and rebuild the aggregates kept at ingest against the stored reports (``haarvest coordinator aggregates``).

The stored reports are the source of truth; the per-(round, stream) sufficient statistics the ingest transaction
keeps (:mod:`coordinator.store`, *Aggregates kept at ingest*) must equal the statistics recomputed from them
(:func:`coordinator.estimate.statistics_from_bodies`): counts exactly, sums up to floating-point summation order.
:func:`check_aggregates` compares the two for every stream of the given rounds; with ``rebuild`` it replaces the
stored aggregates by the recomputed ones (with writes held off, :meth:`Store.rebuild_aggregates`) — after an upgrade
from a version without aggregates, or whenever a check disagrees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from coordinator.decode import StreamDecoder
from coordinator.estimate import statistics_from_bodies
from coordinator.store import Store
from protocols import wire
from protocols.catalogue import Statistics
from protocols.contract import parse_round_params

__all__ = ["AggregateCheck", "check_aggregates"]


@dataclass(frozen=True)
class AggregateCheck:
    """One stream's comparison: ``status`` is ``agree``, ``differ``, ``stale`` (not kept; estimated from reports)
    or ``rebuilt``; ``stored_n`` / ``reports_n`` the report counts on each side."""

    round_id: str
    stream: str
    status: str
    stored_n: int | None
    reports_n: int


def check_aggregates(store: Store, round_ids: list[str] | None = None, rebuild: bool = False) -> list[AggregateCheck]:
    """Compare (or, with ``rebuild``, replace) the aggregates of every stream of ``round_ids`` (default: all rounds)."""
    rounds = {r["round_id"]: r for r in store.rounds()}
    wanted = list(rounds) if round_ids is None else round_ids
    stale = store.stale_aggregates()
    out: list[AggregateCheck] = []
    for round_id in wanted:
        if round_id not in rounds:
            raise ValueError(f"unknown round {round_id!r}")
        config = wire.RoundConfig.model_validate(json.loads(rounds[round_id]["config"]))
        for stream, spec in parse_round_params(config.params).streams.items():
            decoder = StreamDecoder.for_spec(spec)

            def compute(bodies: list[str], spec=spec, decoder=decoder) -> Statistics:
                return statistics_from_bodies(spec, bodies, decoder)

            if rebuild:
                before, after = store.rebuild_aggregates(round_id, stream, compute)
                out.append(AggregateCheck(round_id, stream, "rebuilt", None if before is None else before.n, after.n))
                continue
            kept = store.aggregates(round_id, stream)
            recomputed = compute(store.report_bodies(round_id, stream))
            if (round_id, stream) in stale:
                status = "stale"
            elif kept is None:
                status = "agree" if recomputed.n == 0 else "differ"
            else:
                status = "agree" if kept.close_to(recomputed) else "differ"
            out.append(AggregateCheck(round_id, stream, status, None if kept is None else kept.n, recomputed.n))
    return out
