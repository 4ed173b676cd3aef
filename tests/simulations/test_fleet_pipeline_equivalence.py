"""The fleet simulator is the device pipeline, driven: real agents and simulations/fleet_pipeline.py on the same
readings and α offsets agree exactly, per device and round, on the rounded values, the normalised values, the
canonical memo-key values and their keys, which rounds are memo hits, and the ε charged.

The agents take the path a device takes (:class:`edge_agent.Agent` with its SQLite state, no transport: a reading
from its source, the pipeline, one transaction per report); their life-long offsets u are set through the
persisted rounding state, as after a restart.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.config import Secrets
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.sources import IterableSource
from protocols.memo_key import record_key
from simulations.fleet_pipeline import FleetRun, FleetTrace, MemoizedPipeline

NAMES = ("a", "b", "c")
LO = np.array([0.0, -20.0, 0.0])
HI = np.array([100.0, 60.0, 1.0])
ROUNDING = {"window": 4, "epoch_readings": 8, "tau": 0.01, "k_base": 100, "eta": 0.1}
EPSILON = 1.0
STREAM = "rec"
#: fixed α offsets, one per device and dimension (edges of [0, 1) included)
U = np.array([[0.0, 0.5, 0.93], [0.25, 0.999, 0.1], [0.61, 0.07, 0.45], [0.9, 0.33, 0.72], [0.42, 0.81, 0.0]])


def _readings(n: int = 5, rounds: int = 66) -> np.ndarray:
    """(n, rounds, 3) readings in phases — constant, jitter, a walk past the bounds, level changes — so that windows
    fill, volatility comes and goes, epochs change the step, values are clipped, and keys repeat and change."""
    rng = np.random.default_rng(20240617)
    x = np.empty((n, rounds, 3))
    t = np.arange(rounds)
    for i in range(n):
        a = np.full(rounds, 40.0 + 3 * i)
        jitter = (t >= 12) & (t < 30)
        a[jitter] += rng.uniform(-1.5, 1.5, jitter.sum())
        walk = (t >= 30) & (t < 46)
        a[walk] = 60.0 + np.cumsum(rng.normal(0, 12.0, walk.sum()))  # wanders, often past 0 or 100: clipped
        a[t >= 46] = 70.0 + (t[t >= 46] % 2) * 0.4  # a small square wave: volatile, one or two cells
        b = np.where(t < 20, 20.0, np.where(t < 35, 35.5 - 0.5 * i, 12.25))
        b[[7, 50]] = -25.0, 61.0  # below lo and above hi
        c = np.where(t % 2 == 0, 0.49, 0.51) + np.where(t < 40, 0.0, 0.2 * (i % 2))
        c[:6] = 0.5
        x[i] = np.stack([np.round(a, 2), b, c], axis=1)
    return x


def _agent(tmp_path, i: int, rows: list[dict[str, float]], u: np.ndarray, unit: str) -> tuple[Agent, bytes]:
    """Device i: a real agent over ``rows``, its offsets set to ``u`` through its persisted rounding state."""
    dims = [numeric(name, lo, hi, rounding=ROUNDING) for name, lo, hi in zip(NAMES, LO, HI)]
    streams = [{"name": STREAM, "dimensions": list(NAMES), "mechanism": "ksampling", "epsilon": EPSILON}]
    cfg = simple_config(f"dev-{i}", tmp_path / f"dev-{i}", dims, streams, privacy={"unit": unit}, total_cap=1e6)
    ident = new_identity()
    first = Agent(cfg, IterableSource([]), secrets=ident, transport=False).open()
    state = first.pipeline.rounding_state()
    for name, uj in zip(NAMES, u):
        state[name]["rounder"]["u"] = [float(uj)]
    first.state.save_rounding(state)
    first.close()
    agent = Agent(cfg, IterableSource(rows), secrets=Secrets(ident.signing_key, ident.hmac_secret),
                  transport=False).open()
    assert [agent.pipeline.rounding_state()[name]["rounder"]["u"] for name in NAMES] == [[float(v)] for v in u]
    return agent, ident.hmac_secret


def _check_device(agent: Agent, secret: bytes, i: int, trace: FleetTrace, run: FleetRun, history: int) -> None:
    for _ in range(history):
        assert agent.sample() is not None  # a reading the device observes without reporting it
    spec = agent.pipeline.streams[STREAM].spec
    keys = []
    for r in range(run.new_key.shape[1]):
        out = agent.report(f"r{r}")
        rec = agent.last_record
        (commit,) = out.commits
        where = f"device {i}, round {r}"
        assert [rec.values[name] for name in NAMES] == trace.values[i, r].tolist(), where
        assert [name in rec.rounded for name in NAMES] == trace.rounded[i, r].tolist(), where
        assert [rec.normalised[name] for name in NAMES] == trace.normalised[i, r].tolist(), where
        canonical = trace.canonical(i, r)
        assert [rec.canonical[name] for name in NAMES] == canonical, where
        keys.append(record_key(secret, STREAM, spec, canonical))
        assert commit.memo_hit == (not run.new_key[i, r]), where
        assert commit.charged == run.charged[i, r], where
    # the device's own memo keys (its ledger has one row per charged report) are the simulator's canonical values'
    charged_keys = [row["memo_key"] for row in agent.state.ledger_rows(STREAM)]
    assert charged_keys == [k for k, new in zip(keys, run.new_key[i]) if new]
    assert agent.state.spent() == run.total_spend[i]


@pytest.mark.parametrize(("unit", "history"), [("value", 0), ("value", 6), ("device", 0)])
def test_agents_and_the_fleet_simulator_agree_exactly(tmp_path, unit, history):
    x = _readings()
    hist, records = x[:, :history], x[:, history:]
    pipe = MemoizedPipeline(LO, HI, EPSILON, "ksampling", window=ROUNDING["window"], tau=ROUNDING["tau"],
                            epoch_length=ROUNDING["epoch_readings"], k_base=ROUNDING["k_base"], eta=ROUNDING["eta"],
                            memoize=unit == "value")
    trace = pipe.trace(records, U, history=hist if history else None)
    run = pipe.run(records, np.random.default_rng(0), history=hist if history else None, u=U)
    # the scenario exercises every step
    assert run.clipped > 0
    assert trace.rounded.any() and (~trace.rounded).any()
    assert len(np.unique(trace.exponents[trace.rounded])) >= 2  # epochs changed the step
    if unit == "value":
        assert run.new_key.any(axis=1).all() and (~run.new_key).sum(axis=1).min() >= 10  # hits on every device
    else:
        assert run.new_key.all()
    for i in range(x.shape[0]):
        rows = [dict(zip(NAMES, map(float, row))) for row in x[i]]
        agent, secret = _agent(tmp_path, i, rows, U[i], unit)
        try:
            _check_device(agent, secret, i, trace, run, history)
        finally:
            agent.close()


def test_minus_zero_is_the_same_memo_key_as_zero(tmp_path):
    """SPEC §2.4: the memo key is an HMAC of the *canonical* record; -0.0 and 0.0 are one value, so a device that
    reads 0.0 then -0.0 (e.g. a sensor's round(-0.04, 1)) should be charged once, as the simulator charges it."""
    x = np.array([[[0.0, 30.0, 0.5], [-0.0, 30.0, 0.5]]])
    run = MemoizedPipeline(LO, HI, EPSILON, "ksampling", window=4).run(x, np.random.default_rng(0), u=U[:1])
    assert run.new_key.tolist() == [[True, False]]
    agent, _ = _agent(tmp_path, 0, [dict(zip(NAMES, map(float, row))) for row in x[0]], U[0], "value")
    try:
        hits = [agent.report(f"r{r}").commits[0].memo_hit for r in range(2)]
    finally:
        agent.close()
    assert hits == [False, True]
