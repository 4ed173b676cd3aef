"""Regression tests for the review of the device/coordinator code (one section per finding)."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.config import ConfigError
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.pipeline import Pipeline
from edge_agent.sources import CallableSource
from edge_agent.state import SCHEMA_VERSION, State
from protocols import catalogue, wire

COORD = wire.generate_signing_key()
SECRET = bytes(range(32))


def _cfg(tmp_path, dims, streams, ledger=None, **privacy):
    return simple_config("dev-0001", tmp_path / "d", dims, streams,
                         coordinator_public_key=wire.public_key_b64(COORD),
                         ledger=ledger or {"total_cap": 1e6},
                         privacy={"epsilon": 1.0, "max_round_epsilon": 10.0, **privacy})


def _round(rid, params, eps=10.0):
    return wire.sign_round(wire.RoundConfig(round_id=rid, protocol="t", epsilon=eps, params=params), COORD).to_bytes()


HYBRID_LOAD = [{"name": "load", "dimensions": ["load"], "mechanism": "hybrid", "epsilon": 1.0}]
GAUSS_LOAD = [{"name": "load", "dimensions": ["load"], "mechanism": "gaussian", "epsilon": 0.5,
               "params": {"delta": 1e-6}}]


# --- 1. (ε, δ) mechanisms: a round cannot choose δ; the ledger records and caps δ ---------------------------------


def test_round_cannot_select_a_gaussian_mechanism_on_a_pure_device(tmp_path):
    p = Pipeline(_cfg(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = {"kind": "numeric", "mechanism": "gaussian", "dims": ["load"], "bounds": [[0, 100]],
            "params": {"epsilon": 1.0, "delta": 0.999999, "calibration": "analytic"}}
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "delta")]


def test_gaussian_device_refuses_a_larger_delta_and_records_and_caps_its_own(tmp_path):
    values = iter(range(100))
    cfg = _cfg(tmp_path, [numeric("load", 0, 100, rounding={"enabled": False})], GAUSS_LOAD,
               ledger={"total_cap": 1e6, "delta_cap": 3.5e-6})
    a = Agent(cfg, CallableSource(lambda: {"load": float(next(values))}), secrets=new_identity(),
              transport=False).open()
    own = a.stream_specs()["load"]
    assert own["params"]["delta"] == 1e-6
    larger = dict(own, params={**own["params"], "delta": 1e-3})
    out = a.handle_round(_round("r0", {"streams": {"load": larger}}))
    assert out.refused == [("load", "spec_delta")] and a.state.spent() == 0
    charged = []
    for i in range(5):  # a new value each time: a new memo entry each time
        out = a.handle_round(_round(f"r{i + 1}", {"streams": {"load": own}}))
        charged.append(out.charged)
        if i >= 3:
            assert out.refused == [("load", "delta_cap")]
    assert charged == [0.5, 0.5, 0.5, 0.0, 0.0]
    rows = list(a.state.ledger_rows())
    assert [r["delta"] for r in rows] == [1e-6] * 3 and a.state.spent_delta() == pytest.approx(3e-6)
    a.close()


def test_gaussian_stream_needs_a_delta_cap(tmp_path):
    with pytest.raises(ConfigError, match="delta_cap"):
        Pipeline(_cfg(tmp_path, [numeric("load", 0, 100)], GAUSS_LOAD), SECRET)


def test_pure_mechanisms_leave_delta_null(tmp_path):
    a = Agent(_cfg(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), CallableSource(lambda: {"load": 5.0}),
              secrets=new_identity(), transport=False).open()
    a.report("r1")
    assert [r["delta"] for r in a.state.ledger_rows()] == [None] and a.state.spent_delta() == 0.0
    a.close()


def test_version_1_state_database_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL);
        CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, stream TEXT NOT NULL,
            round_id TEXT NOT NULL, epsilon REAL NOT NULL CHECK (epsilon > 0), memo_key TEXT NOT NULL,
            seq INTEGER NOT NULL, mechanism TEXT NOT NULL);
        CREATE TRIGGER ledger_append_only_u BEFORE UPDATE ON ledger
            BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END;
        INSERT INTO meta VALUES ('schema_version', 1);
        INSERT INTO ledger (ts, stream, round_id, epsilon, memo_key, seq, mechanism) VALUES (1, 's', 'r', 0.5, 'k', 0, 'grr');
    """)
    db.commit()
    db.close()
    with State(path) as st:
        assert [r["delta"] for r in st.ledger_rows()] == [None] and st.spent() == 0.5
        # every charge before privacy units was a per-value memo charge
        assert [r["unit"] for r in st.ledger_rows()] == ["value"] and st.spent_by_unit() == {"value": 0.5}
        assert int(st._get("schema_version")) == SCHEMA_VERSION == 3
    with State(path) as st:  # idempotent
        assert len(list(st.ledger_rows())) == 1


# --- 2. rounding steps: only the device's nested grid steps ----------------------------------------------------


@pytest.mark.parametrize("step", [None, 1e-9, 0.5, 0.999, 3.0, 1.5, 200.0])
def test_rounded_dimension_refuses_exact_fine_and_non_nested_steps(tmp_path, step):
    p = Pipeline(_cfg(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)  # K_base = 100: base step 1
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "rounding")]


@pytest.mark.parametrize("step", [1.0, 1.0 + 1e-12, 2.0, 16.0, 64.0])
def test_rounded_dimension_follows_nested_steps_and_shares_memo_entries(tmp_path, step):
    p = Pipeline(_cfg(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == ["load"] and rp.plans["load"].rounding == (float(2 ** round(np.log2(step))),)
    keys = {p.prepare(p.observe({"load": x}), rp.streams, rp.plans)[0].memo_key for x in (50.0, 50.0001, 50.0002)}
    assert len(keys) <= 2  # three readings within 0.0002 fall on at most two points of a grid of step >= 1


def test_unrounded_dimension_reports_exact_values_whatever_the_step(tmp_path):
    cfg = _cfg(tmp_path, [numeric("load", 0, 100, rounding={"enabled": False})], HYBRID_LOAD)
    p = Pipeline(cfg, SECRET)
    for step in (None, 0.37):
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"]
    rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[500.0])}})
    assert rp.refused == [("load", "rounding")]


def test_planner_steps_are_nested_steps_devices_follow(tmp_path):
    from coordinator.rounds import plan_rounding_steps

    p = Pipeline(_cfg(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    wild = [[0.0], [100.0], [0.0]]  # very volatile: the planner's step hits its cap
    for max_fraction in (0.25, 1.0):
        step = float(plan_rounding_steps(wild, [[0.1]] * 3, [0.0], [100.0], max_fraction=max_fraction)[0])
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"], (max_fraction, step)


# --- 5. a numeric stream takes only numeric mechanisms, a categorical one only frequency oracles ----------------


def test_numeric_stream_refuses_a_frequency_oracle_and_vice_versa(tmp_path):
    dims = [numeric("load", 0, 100), categorical("os", 3)]
    streams = HYBRID_LOAD + [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(_cfg(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    grr_on_load = dict(specs["load"], mechanism="grr", params={"epsilon": 1.0, "k": 2})
    hybrid_on_os = dict(specs["os"], mechanism="hybrid", params={"epsilon": 1.0})
    rp = p.round_plans({"streams": {"load": grr_on_load, "os": hybrid_on_os}})
    assert rp.streams == [] and sorted(rp.refused) == [("load", "mechanism"), ("os", "mechanism")]


# --- 6. category labels must be the device's ------------------------------------------------------------------


def test_round_labels_must_equal_the_device_categories(tmp_path):
    dims = [categorical("os", 3, categories=["linux", "mac", "win"]), categorical("app", 3)]
    streams = [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0},
               {"name": "app", "dimensions": ["app"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(_cfg(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    assert p.round_plans({"streams": specs}).streams == ["os", "app"]  # the device's own labels (and none)
    swapped = {"os": dict(specs["os"], labels=["win", "mac", "linux"]), "app": dict(specs["app"], labels=["a", "b", "c"])}
    rp = p.round_plans({"streams": swapped})
    assert rp.streams == [] and sorted(rp.refused) == [("app", "labels"), ("os", "labels")]


# --- 7. raw readings that fail validation never reach the logs ----------------------------------------------------


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
    a = Agent(_cfg(tmp_path, dims, streams), CallableSource(lambda: dict(reading)), secrets=new_identity(),
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


# --- 10. a device using the Haar record (or auto) with a resolved split does not load scipy ---------------------


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


# --- 3. calibrated intervals: the variance uses the population mean of t², not the squared mean ------------------


def _coverage(spec_data, values, truth, reps, rng):
    from coordinator.estimate import estimate_stream
    from protocols.contract import StreamSpec

    spec = StreamSpec.model_validate(spec_data)
    mech = spec.build()
    hits, stderrs = [], []
    for _ in range(reps):
        out = mech.privatize(values, rng)
        rows = [catalogue.entry("haar").encode_row(mech, r) for r in out] if spec.kind == "haar" else out.tolist()
        est = estimate_stream(spec, rows)
        hits.append((np.asarray(est.ci_low) <= truth) & (truth <= np.asarray(est.ci_high)))
        stderrs.append(est.stderr)
    return np.mean(hits, axis=0), np.mean(stderrs, axis=0), mech


def test_plugin_interval_coverage_for_piecewise_at_eps_4_with_split_population():
    rng = np.random.default_rng(20260414)
    n, reps = 2000, 400
    t = np.where(np.arange(n) % 2 == 0, -1.0, 1.0)  # mean 0, but every user's t² is 1
    spec = {"kind": "numeric", "mechanism": "piecewise", "params": {"epsilon": 4.0}, "dims": ["x"],
            "bounds": [[-1, 1]]}
    coverage, stderr, mech = _coverage(spec, t, 0.0, reps, rng)
    assert coverage[0] >= 0.92  # nominal 0.95; the squared-mean plug-in covered 0.77
    true_se = np.sqrt(mech.variance(1.0) / n)
    assert stderr[0] == pytest.approx(true_se, rel=0.03)


def test_plugin_interval_coverage_for_vector_and_haar_records():
    rng = np.random.default_rng(7)
    n, reps = 1000, 150
    x = rng.choice([-1.0, 1.0], size=(n, 4))
    truth = x.mean(axis=0)
    for spec in (
        {"kind": "vector", "mechanism": "ksampling", "params": {"epsilon": 8.0, "d": 4}},
        {"kind": "haar", "params": {"epsilon": 4.0, "d": 4, "mean_mechanism": "piecewise",
                                    "detail_mechanism": "ksampling", "split": 0.5}},
    ):
        spec.update(dims=["a", "b", "c", "d"], bounds=[[-1, 1]] * 4)
        coverage, _, _ = _coverage(spec, x, truth, reps, rng)
        assert coverage.mean() >= 0.92, (spec["kind"], coverage)  # 600 intervals, nominal 0.95


# --- 4. out-of-support reports: rejected at ingest, dropped and counted by the estimator ---------------------------

SUPPORT_STREAMS = {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
    "mem": {"kind": "vector", "mechanism": "ksampling", "params": {"epsilon": 1.0, "d": 3},
            "dims": ["a", "b", "c"], "bounds": [[0, 1]] * 3},
    "rec": {"kind": "haar", "params": {"epsilon": 2.0, "d": 3, "mean_mechanism": "piecewise",
                                       "detail_mechanism": "duchi_md", "split": 0.5},
            "dims": ["a", "b", "c"], "bounds": [[0, 1]] * 3},
    "os": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": 1.0, "k": 4}, "dims": ["os"]},
    "app": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 1.0, "k": 4}, "dims": ["app"]},
    "web": {"kind": "frequency", "mechanism": "olh", "params": {"epsilon": 1.0, "k": 4}, "dims": ["web"]},
    "geo": {"kind": "longitudinal", "mechanism": "lgrr", "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4},
            "dims": ["geo"]},
    "lang": {"kind": "longitudinal", "mechanism": "loloha",
             "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4, "g": 3}, "dims": ["lang"]},
}
GOOD_ROWS = {"cpu": 0.25, "mem": [0.0, 1.5, 0.0], "rec": {"mean": 0.3, "detail": [0.1, -0.1, 0.0]}, "os": 3,
             "app": [0, 1, 1, 0], "web": [12345, 2], "geo": 0, "lang": [77, 2]}
BAD_ROWS = {
    "cpu": [1e6, -1e6, [0.1]],
    "mem": [[0.0, 1e6, 0.0], [0.1, 0.2], [0, 0, 0, 0]],
    "rec": [{"mean": 1e6, "detail": [0.1, 0.1, 0.1]}, {"mean": 0.1, "detail": [0.1, 99.0, 0.1]},
            {"mean": 0.1, "detail": [0.1, 0.1]}],
    "os": [4, -1, 1.5, [1]],
    "app": [[0, 2, 0, 0], [0, 1, 0], [0.5, 0, 0, 0]],
    "web": [[1, 99], [-1, 0], [1, 2, 3], 5],
    "geo": [4, -1, 2.5],
    "lang": [[1, 3], [1], [1, -1]],
}


def test_ingest_rejects_reports_outside_the_mechanisms_support(tmp_path):
    from coordinator.rounds import RoundManager
    from coordinator.simfleet import SimFleet
    from coordinator.store import SQLiteStore
    from coordinator.validate import Validator

    store = SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(1)
    dev = fleet.devices[0]
    store.upsert_device(dev.device_id, dev.public_key)
    v = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=v.set_round).open_round("r1", 20.0,
                                                                                       {"streams": SUPPORT_STREAMS})
    mech = {name: (spec.get("mechanism") or "haar") for name, spec in SUPPORT_STREAMS.items()}
    for name, rows in BAD_ROWS.items():
        for row in rows:
            with pytest.raises(wire.WireError) as err:
                v.check(*dev.report("r1", name, mech[name], {"report": row}))
            assert err.value.reason == "bad_body", (name, row)
    for name, row in GOOD_ROWS.items():
        v.check(*dev.report("r1", name, mech[name], {"report": row}))
    store.close()


def test_estimator_drops_and_counts_out_of_support_rows():
    from coordinator.estimate import estimate_stream
    from protocols.contract import StreamSpec

    rng = np.random.default_rng(3)
    spec = StreamSpec.model_validate(SUPPORT_STREAMS["cpu"])
    rows = spec.build().privatize(np.zeros(2000), rng).tolist()
    clean = estimate_stream(spec, rows)
    poisoned = estimate_stream(spec, rows[:1000] + [1e6, "x", None, [0.1, 0.2]] + rows[1000:])
    assert poisoned.error is None and poisoned.n == 2000 and poisoned.dropped == 4
    assert poisoned.estimate == clean.estimate and poisoned.ci_low == clean.ci_low
    for name, bad in BAD_ROWS.items():
        spec = StreamSpec.model_validate(SUPPORT_STREAMS[name])
        est = estimate_stream(spec, [GOOD_ROWS[name]] * 5 + bad)
        assert est.error is None and (est.n, est.dropped) == (5, len(bad)), (name, est)


def test_estimate_round_survives_a_poisoned_store(tmp_path):
    from coordinator.estimate import estimate_round
    from coordinator.rounds import RoundManager
    from protocols.contract import StreamSpec
    from coordinator.store import SQLiteStore, StoredReport

    rng = np.random.default_rng(4)
    store = SQLiteStore(tmp_path / "c.db")
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 9.0, {"streams": {"cpu": SUPPORT_STREAMS["cpu"]}})
    rows = StreamSpec.model_validate(SUPPORT_STREAMS["cpu"]).build().privatize(np.zeros(500), rng).tolist()
    bodies = [wire.canonical_json({"report": r}).decode() for r in rows] + ['{"report":1000000.0}', '{"x":1}', "{"]
    store.commit_batch([StoredReport(device_id=f"d{i}", seq=0, boot=1, round_id="r1", stream="cpu",
                                     mechanism="hybrid", body=b, sig="s", received_at=0.0)
                        for i, b in enumerate(bodies)], {})
    est = estimate_round(store, "r1")["cpu"]
    assert est.error is None and est.n == 500 and est.dropped == 3
    store.close()


# --- 8. stored bodies are stacked without a per-report Python loop --------------------------------------------


def _bodies_and_rows(name, n, rng):
    from protocols.contract import StreamSpec

    spec = StreamSpec.model_validate(SUPPORT_STREAMS[name])
    mech = spec.build()
    if spec.kind == "longitudinal":
        rows = [mech.client(secret=bytes(32), stream=f"s{i}", rng=rng).report(int(rng.integers(4))).report
                for i in range(n)]
        rows = [np.asarray(r).tolist() for r in rows]
    elif spec.kind == "frequency":
        rows = mech.privatize(rng.integers(0, 4, n), rng).tolist()
    elif spec.kind == "haar":
        rows = [catalogue.entry("haar").encode_row(mech, r) for r in mech.privatize(rng.uniform(-1, 1, (n, 3)), rng)]
    else:
        d = len(spec.dims)
        rows = mech.privatize(rng.uniform(-1, 1, (n, d)) if d > 1 else rng.uniform(-1, 1, n), rng).tolist()
    return spec, [wire.canonical_json({"report": r}).decode() for r in rows], rows


@pytest.mark.parametrize("name", list(SUPPORT_STREAMS))
def test_bodies_are_stacked_by_one_parse_and_match_row_by_row_decoding(monkeypatch, name):
    from coordinator.decode import StreamDecoder

    spec, bodies, rows = _bodies_and_rows(name, 50, np.random.default_rng(8))
    dec = StreamDecoder.for_spec(spec)
    expected = np.stack([dec.row(r) for r in rows])

    def no_loop(*_a, **_k):
        raise AssertionError("per-row fallback used for canonical bodies")

    with monkeypatch.context() as m:
        m.setattr(StreamDecoder, "_slow_stack", no_loop)
        m.setattr("coordinator.decode._body_rows", no_loop)
        fast = dec.from_bodies(bodies)
        listed = dec.stack(rows)
    np.testing.assert_array_equal(fast.reports, expected)
    np.testing.assert_array_equal(listed.reports, expected)
    assert fast.dropped == 0 and fast.reports.dtype == expected.dtype
    # non-canonical (spaces, key order) and broken bodies: row by row, the broken ones dropped and counted
    odd = [b.replace(":", ": ") for b in bodies[:3]] + ["{", '{"report":"x"}'] + bodies[3:]
    slow = dec.from_bodies(odd)
    np.testing.assert_array_equal(slow.reports, expected)
    assert slow.dropped == 2


# --- 9. the Flower client follows the same round contract (Haar streams, rounding steps) ------------------------


def test_flower_answer_round_uses_the_pipeline_contract(tmp_path):
    from edge_agent.rounds import answer_round

    dims = [numeric("a", 0, 10), numeric("b", 0, 10), numeric("load", 0, 100)]
    streams = [{"name": "rec", "dimensions": ["a", "b"], "mechanism": "haar", "epsilon": 1.0,
                "params": {"split": 0.5, "mean_mechanism": "hybrid"}}] + HYBRID_LOAD
    a = Agent(_cfg(tmp_path, dims, streams), CallableSource(lambda: {"a": 1.0, "b": 2.0, "load": 50.3}),
              secrets=new_identity(), transport=False).open()
    specs = a.stream_specs()
    specs["load"]["rounding"] = [16.0]
    status, out = answer_round(a, _round("r1", {"streams": specs}))
    assert status == "answered" and not out.refused
    bodies = {wire.decode_report(c.payload).stream: c.body["report"] for c in out.commits}
    assert set(bodies["rec"]) == {"mean", "detail"}  # Haar streams are answered
    assert bodies["load"] is not None
    specs["load"]["rounding"] = [None]  # the exact value of a rounded dimension: refused like over MQTT
    status, out = answer_round(a, _round("r2", {"streams": specs}))
    assert status == "answered" and out.refused == [("load", "spec_rounding")]
    a.close()
