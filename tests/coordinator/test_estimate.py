"""Estimation from signed, validated, stored reports of a simulated fleet (real mechanisms). The round planners:
test_rounds.py."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.estimate import estimate_round, estimate_stream
from coordinator.rounds import RoundManager
from protocols.frequency.postprocess import project_simplex as project_to_simplex
from protocols.contract import StreamSpec, denormalise, make_body, normalise
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import catalogue, wire
from protocols.haar import haar_forward, padded_size
from tests.coordinator.support_rows import BAD_ROWS, GOOD_ROWS, SUPPORT_STREAMS

N_DEV = 400
LEVEL = 0.999  # z = 3.29 per coordinate: 16 coordinates all inside by chance with probability ≈ 0.984 (fixed seed)

HAAR_D = 5
PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 2.0}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
    "mem": {"kind": "vector", "mechanism": "ksampling", "params": {"epsilon": 2.0, "d": 3},
            "dims": ["rss", "swap", "cache"], "bounds": [[0, 8], [0, 2], [0, 4]]},
    "rec": {"kind": "haar", "dims": [f"x{i}" for i in range(HAAR_D)], "bounds": [[-10, 10]] * HAAR_D,
            "mean": {"mechanism": "hybrid", "params": {"epsilon": 1.0}},
            "detail": {"mechanism": "ksampling", "params": {"epsilon": 2.0, "d": padded_size(HAAR_D) - 1}}},
    "app": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 2.0, "k": 6}, "dims": ["app"],
            "labels": ["a", "b", "c", "d", "e", "f"]},
}}


def _device_rows(rng: np.random.Generator) -> tuple[dict, dict]:
    """What each device computes locally: privatized rows per stream, and the truth for the test."""
    spec = {k: StreamSpec.model_validate(v) for k, v in PARAMS["streams"].items()}
    mech = {k: catalogue.build(v["mechanism"], **v["params"]) for k, v in PARAMS["streams"].items() if k != "rec"}
    cpu = rng.beta(2, 5, N_DEV) * 100
    mem = np.column_stack([rng.uniform(1, 7, N_DEV), rng.exponential(0.3, N_DEV).clip(0, 2), rng.uniform(0, 4, N_DEV)])
    rec = np.column_stack([rng.normal(i - 2, 2, N_DEV).clip(-10, 10) for i in range(HAAR_D)])
    app = rng.choice(6, N_DEV, p=[0.4, 0.25, 0.15, 0.1, 0.1, 0.0])
    rows = {
        "cpu": mech["cpu"].privatize(normalise(cpu, 0, 100), rng),
        "mem": mech["mem"].privatize(normalise(mem, *spec["mem"].lo_hi()), rng),
        "app": mech["app"].privatize(app, rng),
    }
    m, c = haar_forward(normalise(rec, *spec["rec"].lo_hi()))
    hm = catalogue.build("hybrid", epsilon=1.0)
    hd = catalogue.build("ksampling", epsilon=2.0, d=padded_size(HAAR_D) - 1)
    m_rep, c_rep = hm.privatize(m, rng), hd.privatize(c, rng)
    rows["rec"] = np.concatenate([m_rep[:, None], c_rep], axis=1)  # the HaarRecord's rows, from its two parts
    rows = {k: [spec[k].entry.encode_row(spec[k].build(), r) for r in v] for k, v in rows.items()}  # the wire codec
    truth = {"cpu": [cpu.mean()], "mem": mem.mean(axis=0), "rec": rec.mean(axis=0),
             "app": np.bincount(app, minlength=6) / N_DEV}
    return rows, truth


def test_truth_inside_confidence_intervals(tmp_path):
    rng = np.random.default_rng(20261122)
    store = SQLiteStore(tmp_path / "e.db")
    fleet = SimFleet(N_DEV)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    validator = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round).open_round("r1", 9.0, PARAMS)
    rows, truth = _device_rows(rng)
    accepted = []
    for stream, mech_rows in rows.items():
        mech = "haar" if stream == "rec" else PARAMS["streams"][stream]["mechanism"]
        for dev, row in zip(fleet.devices, mech_rows):
            body = make_body(row)
            accepted.append(validator.check(*dev.report("r1", stream, mech, body)))
    assert store.commit_batch(accepted, {}) == 4 * N_DEV

    plugin = estimate_round(store, "r1", level=LEVEL)
    worst = estimate_round(store, "r1", level=LEVEL, variance="worst", consistency=False)
    for stream, est in plugin.items():
        assert est.error is None and est.n == N_DEV, est.error
        t = np.asarray(truth[stream])
        raw, lo, hi = (np.asarray(a) for a in (est.raw, est.ci_low, est.ci_high))
        assert np.all(lo <= t) and np.all(t <= hi), (stream, t, lo, hi)
        assert np.all(np.asarray(est.stderr) > 0)
        w = worst[stream]
        assert np.all(np.asarray(w.ci_low) <= lo + 1e-9) or stream == "app"  # app lo is clipped at 0
        assert np.all(np.asarray(w.ci_high) >= np.minimum(hi, np.asarray(w.ci_high)) - 1e-9)
        assert np.allclose(w.raw, est.raw)
    app = plugin["app"]
    assert app.labels == ["a", "b", "c", "d", "e", "f"]
    assert abs(sum(app.estimate) - 1) < 1e-9 and min(app.estimate) >= 0  # projected onto the simplex
    cpu = plugin["cpu"]
    assert 0 <= cpu.ci_low[0] <= cpu.estimate[0] <= cpu.ci_high[0] <= 100
    # the Haar stream's CIs are wider than a single-coordinate estimate at the same budget would be (log D + 1 terms)
    assert min(plugin["rec"].stderr) > 0.1


def test_errors_are_reported_per_stream(tmp_path):
    store = SQLiteStore(tmp_path / "e.db")
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 9.0, PARAMS)
    est = estimate_round(store, "r1")
    assert all(e.error == "no reports" and e.n == 0 for e in est.values())
    with pytest.raises(ValueError):
        estimate_round(store, "nope")
    spec = StreamSpec.model_validate(PARAMS["streams"]["cpu"])
    bad = estimate_stream(spec, [[0.1, 0.2]] * 3)  # two values for a one-dimensional stream: dropped, counted
    assert bad.error == "no valid reports" and bad.n == 0 and bad.dropped == 3


def test_project_to_simplex():
    p = project_to_simplex([0.5, 0.6, -0.2])
    assert np.isclose(p.sum(), 1) and np.all(p >= 0)
    assert np.allclose(project_to_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
    assert np.allclose(denormalise(normalise([0.0, 50.0, 100.0, 200.0], 0, 100), 0, 100), [0, 50, 100, 100])


# Calibrated intervals: the variance uses the population mean of t², not the squared mean


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


# Out-of-support rows: dropped and counted by the estimator, whatever the store holds


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
