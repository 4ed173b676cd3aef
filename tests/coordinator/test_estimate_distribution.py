"""Distribution streams through the coordinator — signed reports of a simulated fleet accepted
by the Validator, statistics kept at ingest by the Store, the estimate (histogram, CDF, quantiles with intervals)
equal from the aggregates and from the stored reports, and the truth's quantiles inside the intervals."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from coordinator.aggregates import check_aggregates
from coordinator.decode import StreamDecoder
from coordinator.estimate import DEFAULT_QUANTILES, StreamEstimate, estimate_round, estimate_stream
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import wire
from protocols.contract import StreamSpec, make_body, parse_round_params

N = 3000
LO, HI = 0.0, 200.0
PARAMS = {"streams": {
    "flat": {"kind": "distribution", "mechanism": "distribution_flat", "params": {"epsilon": 2.0, "D": 32},
             "dims": ["latency"], "bounds": [[LO, HI]], "units": ["ms"]},
    "olh": {"kind": "distribution", "mechanism": "distribution_flat",
            "params": {"epsilon": 2.0, "D": 32, "oracle": "olh"}, "dims": ["latency"], "bounds": [[LO, HI]]},
    "tree": {"kind": "distribution", "mechanism": "distribution_hierarchical",
             "params": {"epsilon": 2.0, "D": 32, "branching": 4}, "dims": ["latency"], "bounds": [[LO, HI]]},
    "haar": {"kind": "distribution", "mechanism": "distribution_haar", "params": {"epsilon": 2.0, "D": 32},
             "dims": ["latency"], "bounds": [[LO, HI]]},
    "sw": {"kind": "distribution", "mechanism": "distribution_square_wave", "params": {"epsilon": 2.0, "D": 32},
           "dims": ["latency"], "bounds": [[LO, HI]]},
}}


def _population(rng: np.random.Generator) -> np.ndarray:
    """A skewed metric (log-normal latency), some of it beyond the upper bound (clipped on the device)."""
    return rng.lognormal(np.log(40.0), 0.6, N)


def _messages(fleet: SimFleet, x: np.ndarray, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = []
    for stream, raw in PARAMS["streams"].items():
        spec = StreamSpec.model_validate(raw)
        mech, codec, grid = spec.build(), spec.entry, spec.grid()
        rows = mech.privatize_unit(grid.unit(x), rng)  # the device: clip, scale/bucketise, privatize
        out += [dev.report("r1", stream, spec.wire_mechanism, make_body(codec.encode_row(mech, row)))
                for dev, row in zip(fleet.devices, rows)]
    return out


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    rng = np.random.default_rng(19)
    fleet = SimFleet(N, signature="hmac-sha256")
    store = SQLiteStore(tmp_path_factory.mktemp("dist") / "a.db")
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    validator = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round).open_round("r1", 20.0, PARAMS)
    validator.reload()
    x = _population(rng)
    msgs = _messages(fleet, x, rng)
    accepted = 0
    for i in range(0, len(msgs), 1000):
        batch = [r for r in validator.check_batch(msgs[i:i + 1000]) if not isinstance(r, wire.WireError)]
        accepted += len(batch)
        store.commit_batch(batch, {}, validator.statistics)
        validator.batch_committed()
    assert accepted == len(msgs)
    return store, x


def test_aggregates_equal_the_reports_and_the_estimate_has_the_distribution_fields(ingested):
    store, _ = ingested
    assert store.stale_aggregates() == set()
    kept = estimate_round(store, "r1")
    params = parse_round_params(wire.RoundConfig.model_validate_json(store.round("r1")["config"]).params)
    for name, spec in params.streams.items():
        dec = StreamDecoder.for_spec(spec)
        again = estimate_stream(spec, dec.from_bodies(store.report_bodies("r1", name)), "r1", name, decoder=dec)
        a, b = kept[name], again
        assert a.error is None and b.error is None, (name, a.error, b.error)
        assert a.n == b.n == N and a.kind == "distribution"
        for f in ("estimate", "raw", "ci_low", "ci_high", "stderr", "edges", "cdf", "cdf_low", "cdf_high"):
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-9, atol=1e-12, err_msg=(name, f))
        assert [q["q"] for q in a.quantiles] == list(DEFAULT_QUANTILES)
        assert len(a.estimate) == 32 and len(a.edges) == 33 and len(a.cdf) == 32
        assert a.edges[0] == LO and a.edges[-1] == HI and a.cdf[-1] == 1.0
        assert np.all(np.diff(a.cdf) >= 0) and abs(sum(a.estimate) - 1.0) < 1e-9
        # JSON: new optional fields; an old reader's StreamEstimate without them still loads
        data = json.loads(json.dumps(a.to_dict()))
        old = {k: v for k, v in data.items() if k not in ("edges", "cdf", "cdf_low", "cdf_high", "quantiles")}
        assert StreamEstimate(**old).quantiles == []
    assert all(c.status == "agree" for c in check_aggregates(store))


@pytest.mark.parametrize("name", ["flat", "olh", "tree", "haar"])
def test_truth_quantiles_lie_in_the_intervals(ingested, name):
    store, x = ingested
    est = estimate_round(store, "r1", streams=[name])[name]
    truth = np.quantile(np.clip(x, LO, HI), DEFAULT_QUANTILES)
    for q, t in zip(est.quantiles, truth):
        assert q["low"] is not None and q["low"] <= q["value"] <= q["high"], (name, q)
        assert q["low"] <= t <= q["high"], (name, q, t)
    lo, hi = np.asarray(est.cdf_low), np.asarray(est.cdf_high)
    true_cdf = np.array([np.mean(np.clip(x, LO, HI) <= e) for e in est.edges[1:]])
    assert np.mean((lo <= true_cdf) & (true_cdf <= hi)) >= 0.9


def test_square_wave_has_quantiles_without_intervals(ingested):
    store, x = ingested
    est = estimate_round(store, "r1", streams=["sw"])["sw"]
    assert est.ci_low == [] and est.cdf_low == [] and all(q["low"] is None for q in est.quantiles)
    truth = np.quantile(np.clip(x, LO, HI), 0.5)
    assert abs(est.quantiles[0]["value"] - truth) < 0.1 * (HI - LO)


def test_malformed_rows_are_rejected_at_ingest(tmp_path):
    fleet = SimFleet(3, signature="hmac-sha256")
    store = SQLiteStore(tmp_path / "a.db")
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    validator = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round).open_round("r1", 20.0, PARAMS)
    validator.reload()
    d0, d1, d2 = fleet.devices
    bad = [d0.report("r1", "haar", "distribution_haar", make_body([9, 0, 1])),        # level outside the tree
           d1.report("r1", "sw", "distribution_square_wave", make_body(5.0)),        # outside [-b, 1 + b]
           d2.report("r1", "flat", "distribution_flat", make_body([0, 1, 2] + [0] * 29))]  # not bits
    assert all(isinstance(r, wire.WireError) for r in validator.check_batch(bad))


def _set_old_shape(path, stream: str) -> None:
    """Rewrite the stream's kept statistics as a version before flat OLH's second moments kept them."""
    con = sqlite3.connect(path)
    for writer, text in con.execute("SELECT writer, stats FROM aggregates WHERE stream = ?", (stream,)).fetchall():
        stats = json.loads(text)
        stats["squares"] = []
        con.execute("UPDATE aggregates SET stats = ? WHERE stream = ? AND writer = ?", (json.dumps(stats), stream, writer))
    con.commit()
    con.close()


def test_flat_olh_aggregates_kept_before_the_prefix_squares_still_estimate_and_rebuild(tmp_path):
    """Aggregates of a flat OLH stream kept without Q (the old shape) estimate with the formula and the check says
    they differ; a batch added to them by the same writer, or a new writer's row beside them, leaves the stream
    estimated from its reports (stale / not summable) — never a failed batch or estimate; ``--rebuild`` restores
    aggregates equal to the reports'."""
    n = 300
    path = tmp_path / "a.db"
    fleet = SimFleet(n, signature="hmac-sha256")
    rng = np.random.default_rng(23)
    msgs = _messages(fleet, _population(rng)[:n], rng)
    third = [[m for i, m in enumerate(msgs) if (i % n) * 3 // n == part] for part in range(3)]  # by device

    def ingest(store, batch):
        validator = Validator(store)
        validator.reload()
        accepted = [r for r in validator.check_batch(batch) if not isinstance(r, wire.WireError)]
        assert len(accepted) == len(batch)
        store.commit_batch(accepted, {}, validator.statistics)

    store = SQLiteStore(path)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 20.0, PARAMS)
    ingest(store, third[0])
    _set_old_shape(path, "olh")
    old = estimate_round(store, "r1")["olh"]
    assert old.error is None and old.n == n // 3 and old.quantiles[0]["low"] is not None
    assert {c.stream: c.status for c in check_aggregates(store)}["olh"] == "differ"

    ingest(store, third[1])  # the same writer adds to its old-shape row: the stream becomes stale
    assert ("r1", "olh") in store.stale_aggregates() and store.aggregates("r1", "olh") is None
    assert store.aggregates("r1", "flat").n == 2 * n // 3
    assert estimate_round(store, "r1")["olh"].n == 2 * n // 3  # from the reports meanwhile

    check_aggregates(store, rebuild=True)
    _set_old_shape(path, "olh")
    other = SQLiteStore(path)  # another writer: a new-shape row beside the old one
    ingest(other, third[2])
    assert store.aggregates("r1", "olh") is None and ("r1", "olh") not in store.stale_aggregates()
    assert estimate_round(store, "r1")["olh"].n == n

    assert all(c.status == "rebuilt" for c in check_aggregates(store, rebuild=True))
    assert all(c.status == "agree" for c in check_aggregates(store))
    kept = estimate_round(store, "r1")["olh"]
    spec = StreamSpec.model_validate(PARAMS["streams"]["olh"])
    dec = StreamDecoder.for_spec(spec)
    again = estimate_stream(spec, dec.from_bodies(store.report_bodies("r1", "olh")), "r1", "olh", decoder=dec)
    assert kept.n == again.n == n
    for f in ("cdf", "cdf_low", "cdf_high", "ci_low", "ci_high"):
        np.testing.assert_allclose(getattr(kept, f), getattr(again, f), rtol=1e-9, atol=1e-12, err_msg=f)
