"""Per-dimension rounding state (edge_agent/rounding_state.py): volatile dimensions are α-rounded on a stable grid
with a life-long offset that survives restarts; static dimensions are reported exactly."""

from __future__ import annotations

import math

import numpy as np

from edge_agent.embed import categorical, numeric, simple_config
from edge_agent.pipeline import Pipeline

SECRET = bytes(range(32))


def _cfg(tmp_path, streams=None, dims=None, **kw):
    dims = dims or [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)]
    return simple_config("dev-p", tmp_path / "state", dims, streams, **kw)


def test_volatile_dimension_is_rounded_on_a_stable_grid(tmp_path):
    dims = [numeric("cpu", 0, 100, rounding={"window": 4, "epoch_readings": 8})]
    p = Pipeline(_cfg(tmp_path, dims=dims), SECRET)
    rng = np.random.default_rng(3)
    values = 50 + rng.uniform(-3, 3, size=40)
    recs = [p.observe({"cpu": float(v)}) for v in values]
    late = recs[10:]
    assert all("cpu" in r.rounded for r in late)
    step = 100 / 100 * 2 ** late[-1].canonical["cpu"][1]
    for r in late:
        kind, m, gi = r.canonical["cpu"]
        assert kind == "g" and math.isclose(r.values["cpu"], gi * 100 / 100 * 2**m)
    # few distinct grid points → few distinct memo keys
    assert len({tuple(r.canonical["cpu"]) for r in late}) <= 8 and step >= 1.0
    # the life-long u survives a restart through the persisted state
    state = p.rounding_state()
    q = Pipeline(_cfg(tmp_path, dims=dims), SECRET, rounding_state=state)
    assert q.rounding_state()["cpu"]["rounder"]["u"] == state["cpu"]["rounder"]["u"]
    assert q.rounding_state()["cpu"]["epochs"]["plan"] == state["cpu"]["epochs"]["plan"]
    assert "index" in state["cpu"] and "window" not in str(state)


def test_static_dimension_is_not_rounded(tmp_path):
    p = Pipeline(_cfg(tmp_path, dims=[numeric("cpu", 0, 100, rounding={"window": 4, "epoch_readings": 4})]), SECRET)
    recs = [p.observe({"cpu": 33.3}) for _ in range(20)]
    assert all(not r.rounded and r.values["cpu"] == 33.3 for r in recs)
