"""The edge pipeline and the agent's report path: validation, clipping, rounding, memoization, mechanisms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.config import ConfigError, Secrets
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.pipeline import Pipeline
from protocols.memo_key import record_key as memo_key
from protocols.errors import InvalidRecord
from edge_agent.sources import CallableSource, IterableSource
from protocols import catalogue, wire
from protocols.catalogue import Family, Role
from tests.edge_agent.signed_rounds import GAUSS_LOAD, HYBRID_LOAD, round_config

SECRET = bytes(range(32))


def _cfg(tmp_path, streams=None, dims=None, **kw):
    dims = dims or [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)]
    return simple_config("dev-p", tmp_path / "state", dims, streams, **kw)


def _agent(tmp_path, rows, **kw):
    return Agent(_cfg(tmp_path, **kw), IterableSource(rows), secrets=new_identity(), transport=False).open()


@pytest.mark.parametrize(
    "reading, reason, dim",
    [
        ({"cpu": float("nan"), "temp": 1, "mode": 0}, "not_finite", "cpu"),
        ({"cpu": float("inf"), "temp": 1, "mode": 0}, "not_finite", "cpu"),
        ({"cpu": "12", "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"cpu": True, "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"cpu": [1.0], "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"temp": 1, "mode": 0}, "missing", "cpu"),
        ({"cpu": None, "temp": 1, "mode": 0}, "missing", "cpu"),
        ({"cpu": 1, "temp": 1, "mode": 3}, "out_of_domain", "mode"),
        ({"cpu": 1, "temp": 1, "mode": -1}, "out_of_domain", "mode"),
        ({"cpu": 1, "temp": 1, "mode": 1.5}, "wrong_type", "mode"),
        ({"cpu": 1, "temp": 1, "mode": "busy"}, "wrong_type", "mode"),
    ],
)
def test_invalid_records_are_rejected(tmp_path, reading, reason, dim):
    p = Pipeline(_cfg(tmp_path), SECRET)
    with pytest.raises(InvalidRecord) as err:
        p.observe(reading)
    assert err.value.reason == reason and err.value.dimension == dim


def test_invalid_record_sends_nothing_and_charges_nothing(tmp_path):
    rows = [{"cpu": float("nan"), "temp": 1, "mode": 0}, {"cpu": 5, "temp": "hot", "mode": 0}, {"temp": 1, "mode": 0}]
    agent = _agent(tmp_path, rows)
    for i in range(3):
        out = agent.report(f"r{i}")
        assert out.invalid == "invalid_record" and not out.commits and out.charged == 0
    st = agent.state
    assert st.spent() == 0 and st.next_seq == 0 and st.pending_count() == 0
    assert st.outbox_totals().get("pending") is None
    assert st.counters()["invalid_records"] == 3
    assert st.counters()["invalid.not_finite"] == 1 and st.counters()["invalid.missing"] == 1
    agent.close()


def test_categorical_labels(tmp_path):
    cfg = _cfg(tmp_path, dims=[categorical("mode", 3, categories=["idle", "busy", "boost"])])
    p = Pipeline(cfg, SECRET)
    assert p.observe({"mode": "boost"}).values["mode"] == 2
    with pytest.raises(InvalidRecord, match="not one of the categories"):
        p.observe({"mode": "turbo"})


def test_out_of_range_is_clipped_and_counted(tmp_path):
    p = Pipeline(_cfg(tmp_path), SECRET)
    rec = p.observe({"cpu": 150.0, "temp": -3, "mode": 1})
    assert rec.values["cpu"] == 100.0 and rec.values["temp"] == 0.0
    assert rec.normalised["cpu"] == 1.0 and rec.normalised["temp"] == -1.0
    assert set(rec.clipped) == {"cpu", "temp"} and p.clipped_total == {"cpu": 1, "temp": 1}
    agent = _agent(tmp_path, [{"cpu": 150.0, "temp": 20, "mode": 1}, {"cpu": 101.0, "temp": 20, "mode": 1}])
    assert len(agent.report("a").commits) == 3 and len(agent.report("b").commits) == 3  # clipping is no error
    assert agent.state.counters()["clipped.cpu"] == 2
    agent.close()


def test_normalisation(tmp_path):
    p = Pipeline(_cfg(tmp_path), SECRET)
    rec = p.observe({"cpu": 25.0, "temp": 45.0, "mode": 0})
    assert rec.normalised == {"cpu": -0.5, "temp": 0.0}


def test_memo_hit_costs_nothing_and_returns_the_same_body(tmp_path):
    rows = [{"cpu": 42.0, "temp": 20.0, "mode": 1}] * 3 + [{"cpu": 43.0, "temp": 20.0, "mode": 1}]
    agent = _agent(tmp_path, rows, privacy={"unit": "value"})
    first = agent.report("r0")
    assert first.charged == 3.0 and not any(c.memo_hit for c in first.commits)
    second = agent.report("r1")
    assert second.charged == 0.0 and all(c.memo_hit for c in second.commits)
    assert [c.body for c in second.commits] == [c.body for c in first.commits]
    assert [c.seq for c in second.commits] == [3, 4, 5]
    agent.report("r2")
    fourth = agent.report("r3")  # cpu changed: cpu stream charged, the others still hit
    assert [c.memo_hit for c in fourth.commits] == [False, True, True]
    assert agent.state.spent() == 4.0
    assert agent.state.check_invariants()["ok"]
    agent.close()


def test_memo_key_binds_stream_spec_and_value():
    k = memo_key(SECRET, "cpu", '{"m":1}', [["x", 1.0]])
    assert len(k) == 64 and int(k, 16) >= 0
    assert k != memo_key(SECRET, "cpu2", '{"m":1}', [["x", 1.0]])
    assert k != memo_key(SECRET, "cpu", '{"m":2}', [["x", 1.0]])
    assert k != memo_key(SECRET, "cpu", '{"m":1}', [["x", 1.5]])
    assert k != memo_key(bytes(32), "cpu", '{"m":1}', [["x", 1.0]])


def test_raw_readings_never_stored(tmp_path):
    distinctive = 12.3456789
    dims = [numeric("cpu", 0, 100, rounding={"enabled": False})]
    agent = Agent(_cfg(tmp_path, dims=dims), IterableSource([{"cpu": distinctive}] * 2), secrets=new_identity(),
                  transport=False).open()
    agent.report("r0")
    agent.report("r1")
    agent.close()
    blob = b"".join(p.read_bytes() for p in (tmp_path / "state").iterdir())
    assert str(distinctive).encode() not in blob
    assert repr(distinctive).encode() not in blob


def test_group_stream_uses_one_vector_mechanism(tmp_path):
    streams = [{"name": "env", "dimensions": ["cpu", "temp"], "mechanism": "ksampling", "epsilon": 2.0}]
    agent = _agent(tmp_path, [{"cpu": 50, "temp": 45, "mode": 0}], streams=streams)
    plan = agent.pipeline.streams["env"]
    assert plan.kind == "vector" and plan.mechanism.d == 2
    (commit,) = agent.report("r0").commits
    report = wire.decode_report(commit.payload)
    assert report.stream == "env" and report.mechanism == "ksampling"
    assert len(report.body["report"]) == 2
    assert agent.state.spent() == 2.0
    agent.close()


def test_auto_policy_picks_the_lowest_variance(tmp_path):
    cfg = _cfg(
        tmp_path,
        dims=[numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("small", 3), categorical("big", 1000)],
        streams=[
            {"name": "cpu", "dimensions": ["cpu"]},
            {"name": "env", "dimensions": ["cpu", "temp"]},
            {"name": "small", "dimensions": ["small"]},
            {"name": "big", "dimensions": ["big"]},
        ],
    )
    p = Pipeline(cfg, SECRET)
    assert p.streams["cpu"].mechanism_name == "hybrid"
    assert p.streams["small"].mechanism_name == "grr"
    assert p.streams["big"].mechanism_name == "oue"
    env = p.streams["env"]
    assert env.mechanism_name in catalogue.names(Role.AUTO, Family.VECTOR) + catalogue.names(Role.AUTO, Family.HAAR)
    chosen = env.mechanism.worst_case_variance()
    for name in ("ksampling", "duchi_md"):
        assert chosen <= catalogue.build(name, epsilon=1.0, d=2).worst_case_variance() + 1e-12


def test_explicit_mechanism_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown mechanism"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["cpu"], "mechanism": "gpm"}]), SECRET)
    with pytest.raises(ConfigError, match="bad parameters"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["cpu"], "mechanism": "hybrid",
                                          "params": {"nope": 1}}]), SECRET)
    with pytest.raises(ConfigError, match="explicit mechanism"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["mode"], "epsilon_1": 0.5,
                                          "epsilon_inf": 1.0}]), SECRET)


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


def test_agent_persists_rounding_u_across_restarts(tmp_path):
    cfg = _cfg(tmp_path)
    ident = new_identity()
    a = Agent(cfg, IterableSource([]), secrets=ident, transport=False).open()
    u1 = a.pipeline.rounding_state()["cpu"]["rounder"]["u"]
    a.close()
    b = Agent(cfg, IterableSource([]), secrets=Secrets(ident.signing_key, ident.hmac_secret), transport=False).open()
    assert b.pipeline.rounding_state()["cpu"]["rounder"]["u"] == u1 and b.boot == 2
    b.close()


def test_hadamard_design_is_pinned_in_the_stream_spec(tmp_path):
    """HR picks its design (rows, hence its output space) automatically; the device's stream spec carries the
    choice, so the coordinator decodes with the device's design whatever version of the rule it runs."""
    from edge_agent.plans import build_stream_plan
    from protocols.contract import StreamSpec

    cfg = _cfg(tmp_path, streams=[{"name": "big", "dimensions": ["big"], "mechanism": "hr", "epsilon": 6.0}],
               dims=[categorical("big", 100)], privacy={"max_round_epsilon": 6.0},
               ledger={"total_cap": 100.0})
    plan = build_stream_plan(cfg, cfg.effective_streams()[0])
    spec = plan.stream_spec()
    assert spec["params"]["rows"] == plan.mechanism.rows
    rebuilt = StreamSpec.model_validate(spec).build()
    assert (rebuilt.rows, rebuilt.K) == (plan.mechanism.rows, plan.mechanism.K)


# (ε, δ) mechanisms: a round cannot choose δ, and a Gaussian stream needs a δ cap


def test_round_cannot_select_a_gaussian_mechanism_on_a_pure_device(tmp_path):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = {"kind": "numeric", "mechanism": "gaussian", "dims": ["load"], "bounds": [[0, 100]],
            "params": {"epsilon": 1.0, "delta": 0.999999, "calibration": "analytic"}}
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "delta")]


def test_gaussian_stream_needs_a_delta_cap(tmp_path):
    with pytest.raises(ConfigError, match="delta_cap"):
        Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], GAUSS_LOAD), SECRET)


# Rounding steps: a round may ask only for the device's nested grid steps


@pytest.mark.parametrize("step", [None, 1e-9, 0.5, 0.999, 3.0, 1.5, 200.0])
def test_rounded_dimension_refuses_exact_fine_and_non_nested_steps(tmp_path, step):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)  # K_base = 100: base step 1
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "rounding")]


@pytest.mark.parametrize("step", [1.0, 1.0 + 1e-12, 2.0, 16.0, 64.0])
def test_rounded_dimension_follows_nested_steps_and_shares_memo_entries(tmp_path, step):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == ["load"] and rp.plans["load"].rounding == (float(2 ** round(np.log2(step))),)
    keys = {p.prepare(p.observe({"load": x}), rp.streams, rp.plans)[0].memo_key for x in (50.0, 50.0001, 50.0002)}
    assert len(keys) <= 2  # three readings within 0.0002 fall on at most two points of a grid of step >= 1


def test_unrounded_dimension_reports_exact_values_whatever_the_step(tmp_path):
    cfg = round_config(tmp_path, [numeric("load", 0, 100, rounding={"enabled": False})], HYBRID_LOAD)
    p = Pipeline(cfg, SECRET)
    for step in (None, 0.37):
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"]
    rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[500.0])}})
    assert rp.refused == [("load", "rounding")]


def test_planner_steps_are_nested_steps_devices_follow(tmp_path):
    from coordinator.rounds import plan_rounding_steps

    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    wild = [[0.0], [100.0], [0.0]]  # very volatile: the planner's step hits its cap
    for max_fraction in (0.25, 1.0):
        step = float(plan_rounding_steps(wild, [[0.1]] * 3, [0.0], [100.0], max_fraction=max_fraction)[0])
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"], (max_fraction, step)


# A numeric stream takes only numeric mechanisms, a categorical one only frequency oracles


def test_numeric_stream_refuses_a_frequency_oracle_and_vice_versa(tmp_path):
    dims = [numeric("load", 0, 100), categorical("os", 3)]
    streams = HYBRID_LOAD + [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(round_config(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    grr_on_load = dict(specs["load"], mechanism="grr", params={"epsilon": 1.0, "k": 2})
    hybrid_on_os = dict(specs["os"], mechanism="hybrid", params={"epsilon": 1.0})
    rp = p.round_plans({"streams": {"load": grr_on_load, "os": hybrid_on_os}})
    assert rp.streams == [] and sorted(rp.refused) == [("load", "mechanism"), ("os", "mechanism")]


# Category labels must be the device's


def test_round_labels_must_equal_the_device_categories(tmp_path):
    dims = [categorical("os", 3, categories=["linux", "mac", "win"]), categorical("app", 3)]
    streams = [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0},
               {"name": "app", "dimensions": ["app"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(round_config(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    assert p.round_plans({"streams": specs}).streams == ["os", "app"]  # the device's own labels (and none)
    swapped = {"os": dict(specs["os"], labels=["win", "mac", "linux"]), "app": dict(specs["app"], labels=["a", "b", "c"])}
    rp = p.round_plans({"streams": swapped})
    assert rp.streams == [] and sorted(rp.refused) == [("app", "labels"), ("os", "labels")]


# Raw readings that fail validation never reach the logs


@pytest.mark.parametrize("reading", [
    {"load": float("nan"), "os": 1},
    {"load": 73.123456, "os": "secret-label-xyz"},
    {"load": 73.123456, "os": 987654},
    {"load": 73.123456, "os": 2.71828},
    {"load": 73.123456, "os": float("-inf")},
    {"load": "31337.4242", "os": 1},
])
def test_invalid_reading_values_are_not_in_exceptions_or_logs(tmp_path, caplog, reading):
    dims = [numeric("load", 0, 100), categorical("os", 3, categories=["linux", "mac", "win"])]
    streams = HYBRID_LOAD + [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0}]
    a = Agent(round_config(tmp_path, dims, streams), CallableSource(lambda: dict(reading)), secrets=new_identity(),
              transport=False).open()
    with caplog.at_level("DEBUG"):
        assert a.sample() is None
    a.close()
    with pytest.raises(ValueError) as err:
        a.pipeline.validate(reading)
    text = str(err.value) + caplog.text + repr([r.__dict__ for r in caplog.records])
    assert "invalid record dropped" in caplog.text and "value: " in caplog.text  # described by kind only
    for secret in ("nan", "secret-label-xyz", "987654", "2.71828", "-inf", "31337", "73.12"):
        assert secret not in text.lower(), secret


# A device using the Haar record (or auto) with a resolved split does not load scipy


def test_haar_device_pipeline_does_not_import_scipy(tmp_path):
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import os, sys
        from edge_agent.embed import numeric, simple_config
        from edge_agent.pipeline import Pipeline
        from protocols.pipeline import HaarRecord
        dims = [numeric(n, 0, 10) for n in "abc"]
        streams = [{{"name": "rec", "dimensions": ["a", "b", "c"], "mechanism": "haar", "epsilon": 2.0,
                    "params": {{"split": 0.4, "mean_mechanism": "hybrid"}}}}]
        p = Pipeline(simple_config("d1", {str(tmp_path / 'd')!r}, dims, streams), os.urandom(32))
        rec = p.observe({{"a": 1.0, "b": 2.0, "c": 3.0}})
        body = p.prepare(rec)[0].make_body()
        assert set(body["report"]) == {{"mean", "detail"}}
        HaarRecord(2.0, 5, mean_mechanism="piecewise", split=0.3).privatize([[0.1] * 5], __import__("numpy").random.default_rng(1))
        print(sorted(m for m in sys.modules if m.split(".")[0] == "scipy")[:3])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
