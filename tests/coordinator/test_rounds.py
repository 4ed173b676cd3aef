"""The round planners (coordinator/rounds.py): rounding steps from the history, heavy-hitter prefixes over rounds,
and the next round's recorded dependencies."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.estimate import estimate_round, estimate_stream
from coordinator.rounds import RoundManager, plan_heavy_hitters, plan_rounding_steps
from coordinator.store import SQLiteStore
from protocols import catalogue, wire
from protocols.contract import HeavyHitterSpec, StreamSpec, heavy_hitter_items
from protocols.rounding import quantise_step
from tests.coordinator.test_estimate import PARAMS


def test_rounding_planner():
    lo, hi = np.array([0.0, 0.0]), np.array([100.0, 10.0])
    assert np.allclose(plan_rounding_steps([], [], lo, hi), [1.0, 0.1])  # no history: finest grid
    steady = plan_rounding_steps([[50, 5], [50.2, 5.0], [49.9, 5.0]], [[0.5, 0.05]] * 3, lo, hi)
    assert np.allclose(steady, [1.0, 0.1])  # changes within noise are not volatility
    moving = plan_rounding_steps([[20, 5], [40, 5], [60, 5]], [[0.5, 0.05]] * 3, lo, hi)
    # score ≈ (20 - 0.71)/100 = 0.193; step = 100·0.193/0.1 = 19.3 → capped at 25 → quantised up to 1·2^5 = 32 > cap?
    assert moving[0] in (16.0, 32.0) and moving[1] == pytest.approx(0.1)
    q = quantise_step([1.5, 3.0, 0.01], 0, 100)
    assert np.allclose(q, [2.0, 4.0, 1.0])


def test_heavy_hitters_over_rounds():
    rng = np.random.default_rng(99)
    n, bits = 4000, 8
    heavy = np.array([0b10110001, 0b00011110, 0b11100101])
    values = np.where(rng.random(n) < 0.75, rng.choice(heavy, n), rng.integers(0, 256, n))
    spec = HeavyHitterSpec(bits=bits, prefix_bits=0, step_bits=2, candidates=[0])
    history = []
    for _ in range(4):
        items = heavy_hitter_items(spec, values)
        oracle = catalogue.build("oue", epsilon=3.0, k=spec.k)
        stream = StreamSpec(kind="frequency", mechanism="oue", params={"epsilon": 3.0, "k": spec.k}, dims=["v"],
                            heavy_hitters=spec)
        est = estimate_stream(stream, [stream.entry.encode_row(oracle, r) for r in oracle.privatize(items, rng)])
        history.append(est)
        nxt = plan_heavy_hitters(spec, est, z=4.0, max_candidates=6)
        if nxt is None:
            break
        spec = nxt
    final = history[-1]
    assert final.labels[-1] == "other" and len(final.labels[0]) == bits
    top = sorted(range(len(final.raw) - 1), key=lambda i: -final.raw[i])[:3]
    found = {int(final.labels[i], 2) for i in top}
    assert found == set(heavy.tolist())


def test_open_next_round_records_dependencies(tmp_path):
    store = SQLiteStore(tmp_path / "p.db")
    manager = RoundManager(store, wire.generate_signing_key())
    base = {"streams": {"cpu": PARAMS["streams"]["cpu"]}}
    manager.open_round("r1", 2.0, base)
    manager.open_round("r2", 2.0, base)
    history = [(rid, {"cpu": est}) for rid, est in
               [(r, estimate_round(store, r)["cpu"]) for r in ("r1", "r2")]]
    cfg = manager.open_next_round("r3", 2.0, base, history)
    assert cfg.depends_on == ["r1", "r2"]
    assert cfg.params["streams"]["cpu"]["rounding"] == [1.0]  # no usable estimates yet: finest step
    wire.verify_round(cfg, manager.key.public_key())
