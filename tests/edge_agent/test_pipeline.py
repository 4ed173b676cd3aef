"""The edge pipeline and the agent's report path: invalid records, clipping, normalisation, memoization, the
report bodies. Reading validation, stream plans, round specs and rounding state have their own files
(test_readings.py, test_plans.py, test_round_contract.py, test_rounding_state.py)."""

from __future__ import annotations

import pytest

from edge_agent.agent import Agent
from edge_agent.config import Secrets
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.pipeline import Pipeline
from protocols.memo_key import record_key as memo_key
from edge_agent.sources import CallableSource, IterableSource
from protocols import wire
from tests.edge_agent.signed_rounds import HYBRID_LOAD, round_config

SECRET = bytes(range(32))


def _cfg(tmp_path, streams=None, dims=None, **kw):
    dims = dims or [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)]
    return simple_config("dev-p", tmp_path / "state", dims, streams, **kw)


def _agent(tmp_path, rows, **kw):
    return Agent(_cfg(tmp_path, **kw), IterableSource(rows), secrets=new_identity(), transport=False).open()


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


def test_agent_persists_rounding_u_across_restarts(tmp_path):
    cfg = _cfg(tmp_path)
    ident = new_identity()
    a = Agent(cfg, IterableSource([]), secrets=ident, transport=False).open()
    u1 = a.pipeline.rounding_state()["cpu"]["rounder"]["u"]
    a.close()
    b = Agent(cfg, IterableSource([]), secrets=Secrets(ident.signing_key, ident.hmac_secret), transport=False).open()
    assert b.pipeline.rounding_state()["cpu"]["rounder"]["u"] == u1 and b.boot == 2
    b.close()


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
