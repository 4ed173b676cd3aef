"""Aggregates kept at ingest (coordinator/store.py, coordinator/aggregates.py): estimates from them equal estimates
from the stored reports for every stream family; redeliveries, replays and duplicates never double-count; two
writers' rows merge; reports stored without aggregates are stale until rebuilt; the check/rebuild command."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from coordinator.aggregates import check_aggregates
from coordinator.cli import main as cli_main
from coordinator.decode import StreamDecoder
from coordinator.estimate import estimate_round, estimate_stream
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import wire
from protocols.contract import StreamSpec, make_body, normalise, parse_round_params

N = 120
PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 2.0}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
    "mem": {"kind": "vector", "mechanism": "ksampling", "params": {"epsilon": 2.0, "d": 3},
            "dims": ["a", "b", "c"], "bounds": [[0, 8], [0, 2], [0, 4]]},
    "rec": {"kind": "haar", "mechanism": "haar", "params": {"epsilon": 3.0, "split": 0.4}, "dims": ["x", "y", "z"],
            "bounds": [[-10, 10]] * 3},
    "app": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 2.0, "k": 5}, "dims": ["app"]},
    "os": {"kind": "frequency", "mechanism": "olh", "params": {"epsilon": 2.0, "k": 7}, "dims": ["os"]},
    "hr": {"kind": "frequency", "mechanism": "hr", "params": {"epsilon": 1.0, "k": 6}, "dims": ["hr"]},
    "lg": {"kind": "longitudinal", "mechanism": "lgrr", "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 4},
           "dims": ["lg"]},
    "lo": {"kind": "longitudinal", "mechanism": "loloha", "params": {"epsilon_inf": 2.0, "epsilon_1": 1.0, "k": 6},
           "dims": ["lo"]},
}}


def _messages(fleet: SimFleet, rng: np.random.Generator, round_id: str = "r1") -> list[tuple[str, bytes]]:
    """Every device's signed report of every stream, privatized as a device does (its own mechanism object)."""
    out = []
    for stream, raw in PARAMS["streams"].items():
        spec = StreamSpec.model_validate(raw)
        mech, codec = spec.build(), spec.entry
        for dev in fleet.devices:
            if spec.kind == "longitudinal":
                row = mech.client(secret=os.urandom(32), stream=stream, rng=rng).report(int(rng.integers(mech.k))).report
            elif spec.kind == "frequency":
                row = mech.privatize(rng.integers(0, mech.k, 1), rng)[0]
            else:
                lo, hi = spec.lo_hi()
                x = normalise(rng.uniform(lo, hi), lo, hi)
                row = mech.privatize(x[None] if len(spec.dims) > 1 or spec.kind == "haar" else x, rng)[0]
            out.append(dev.report(round_id, stream, spec.wire_mechanism, make_body(codec.encode_row(mech, row))))
    return out


def _coordinator(path, fleet: SimFleet) -> tuple[SQLiteStore, Validator]:
    store = SQLiteStore(path)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    validator = Validator(store)
    if store.round("r1") is None:
        RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round).open_round("r1", 20.0, PARAMS)
    validator.reload()
    return store, validator


def _accept(validator: Validator, messages) -> list:
    return [r for r in validator.check_batch(messages) if not isinstance(r, wire.WireError)]


def _from_reports(store, round_id="r1", **kw):
    """The estimate recomputed from the stored report bodies, bypassing the aggregates."""
    params = parse_round_params(wire.RoundConfig.model_validate_json(store.round(round_id)["config"]).params)
    out = {}
    for name, spec in params.streams.items():
        dec = StreamDecoder.for_spec(spec)
        out[name] = estimate_stream(spec, dec.from_bodies(store.report_bodies(round_id, name)), round_id, name,
                                    decoder=dec, **kw)
    return out


def _same(a, b):
    assert set(a) == set(b)
    for name in a:
        x, y = a[name], b[name]
        assert x.error is None and y.error is None, (name, x.error, y.error)
        assert x.n == y.n, name
        for field in ("estimate", "raw", "ci_low", "ci_high", "stderr"):
            np.testing.assert_allclose(getattr(x, field), getattr(y, field), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("variance", ["plugin", "worst"])
def test_estimates_from_aggregates_equal_estimates_from_the_reports(tmp_path, variance):
    fleet = SimFleet(N)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    msgs = _messages(fleet, np.random.default_rng(5))
    for i in range(0, len(msgs), 97):  # many batches, each adding to the stored statistics
        batch = _accept(validator, msgs[i:i + 97])
        store.commit_batch(batch, {}, validator.statistics)
        validator.batch_committed()
    assert store.stale_aggregates() == set()
    kept = estimate_round(store, "r1", variance=variance)
    assert all(e.n == N for e in kept.values())
    _same(kept, _from_reports(store, variance=variance))
    assert all(c.status == "agree" for c in check_aggregates(store))


def test_redelivered_replayed_and_duplicate_reports_never_count_twice(tmp_path):
    fleet = SimFleet(40)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    msgs = _messages(fleet, np.random.default_rng(6))
    first = _accept(validator, msgs[: len(msgs) // 2])
    assert store.commit_batch(first, {}, validator.statistics) == len(first)
    validator.batch_committed()
    before = {s: store.aggregates("r1", s) for s in PARAMS["streams"]}
    # a redelivery of the same accepted batch (the broker resends what was not acknowledged): nothing inserted
    assert store.commit_batch(first, {}, validator.statistics) == 0
    for s in PARAMS["streams"]:
        after = store.aggregates("r1", s)
        assert (before[s] is None and after is None) or (after.n == before[s].n and after.close_to(before[s]))
    # a batch mixing already stored reports with new ones: only the new ones count
    rest = _accept(validator, msgs[len(msgs) // 2:])
    assert store.commit_batch(first[:7] + rest, {}, validator.statistics) == len(rest)
    assert store.counters()["duplicate"] == len(first) + 7
    # replays are rejected by the validator before the store (and would be ignored by it anyway)
    assert _accept(validator, msgs[:5]) == []
    assert all(store.aggregates("r1", s).n == 40 for s in PARAMS["streams"])
    _same(estimate_round(store, "r1"), _from_reports(store))


def test_two_writers_on_one_database_merge(tmp_path):
    """Two coordinator processes (two store instances: two writer rows) ingest halves; a reader sums them."""
    fleet = SimFleet(60)
    a, va = _coordinator(tmp_path / "a.db", fleet)
    b, vb = _coordinator(tmp_path / "a.db", fleet)
    msgs = _messages(fleet, np.random.default_rng(7))
    half = len(msgs) // 2
    a.commit_batch(_accept(va, msgs[:half]), {}, va.statistics)
    b.commit_batch(_accept(vb, msgs[half:]), {}, vb.statistics)
    rows = sqlite3.connect(tmp_path / "a.db").execute("SELECT COUNT(DISTINCT writer) FROM aggregates").fetchone()[0]
    assert rows == 2
    reader = SQLiteStore(tmp_path / "a.db")
    assert all(reader.aggregates("r1", s).n == 60 for s in PARAMS["streams"])
    _same(estimate_round(reader, "r1"), _from_reports(reader))


def test_reports_stored_without_aggregates_are_stale_until_rebuilt(tmp_path, capsys):
    fleet = SimFleet(30)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    msgs = _messages(fleet, np.random.default_rng(8))
    store.commit_batch(_accept(validator, msgs), {})  # no aggregate function: a tool, an older writer
    assert store.stale_aggregates() == {("r1", s) for s in PARAMS["streams"]}
    assert store.aggregates("r1", "cpu") is None
    from_reports = _from_reports(store)
    _same(estimate_round(store, "r1"), from_reports)  # estimated from the reports meanwhile
    db = str(tmp_path / "a.db")
    assert cli_main(["coordinator", "aggregates", "--db", db]) == 1
    assert "r1/cpu: stale" in capsys.readouterr().out
    assert cli_main(["coordinator", "aggregates", "--db", db, "--rebuild"]) == 0
    assert cli_main(["coordinator", "aggregates", "--db", db, "r1"]) == 0
    assert "r1/cpu: agree (aggregated n=30, stored reports n=30)" in capsys.readouterr().out
    reopened = SQLiteStore(db)
    assert reopened.stale_aggregates() == set()
    _same(estimate_round(reopened, "r1"), from_reports)


def test_a_database_from_before_aggregates_is_marked_stale(tmp_path):
    fleet = SimFleet(20)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    store.commit_batch(_accept(validator, _messages(fleet, np.random.default_rng(9))), {}, validator.statistics)
    store.close()
    con = sqlite3.connect(tmp_path / "a.db")
    con.execute("DROP TABLE aggregates")
    con.execute("DROP TABLE aggregates_stale")
    con.commit()
    con.close()
    upgraded = SQLiteStore(tmp_path / "a.db")
    assert upgraded.stale_aggregates() == {("r1", s) for s in PARAMS["streams"]}
    assert [c.status for c in check_aggregates(upgraded, rebuild=True)] == ["rebuilt"] * len(PARAMS["streams"])
    assert all(c.status == "agree" for c in check_aggregates(upgraded))


def test_a_tampered_aggregate_is_caught_by_the_check(tmp_path):
    fleet = SimFleet(20)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    store.commit_batch(_accept(validator, _messages(fleet, np.random.default_rng(10))), {}, validator.statistics)
    con = sqlite3.connect(tmp_path / "a.db")
    con.execute("UPDATE aggregates SET stats = replace(stats, '\"n\": 20', '\"n\": 21') WHERE stream = 'app'")
    con.commit()
    con.close()
    checks = {c.stream: c.status for c in check_aggregates(SQLiteStore(tmp_path / "a.db"))}
    assert checks["app"] == "differ" and checks["cpu"] == "agree"


def test_round_report_count_reads_the_aggregates_and_counts_only_stale_streams(tmp_path):
    fleet = SimFleet(25)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    msgs = _messages(fleet, np.random.default_rng(11))
    half = len(msgs) // 2
    store.commit_batch(_accept(validator, msgs[:half]), {}, validator.statistics)
    assert store.round_report_count("r1") == half == sum(store.report_counts("r1").values())
    store.commit_batch(_accept(validator, msgs[half:]), {})  # without aggregates: those streams become stale
    assert store.stale_aggregates()
    assert store.round_report_count("r1") == len(msgs) == sum(store.report_counts("r1").values())
    assert store.round_report_count("nope") == 0


def test_ingest_aggregates_the_rows_it_validated_without_parsing_bodies_again(tmp_path, monkeypatch):
    """Validator.statistics reuses the rows parsed at validation; reports it did not validate in the current batch
    are decoded from their bodies, to the same statistics."""
    fleet = SimFleet(30)
    store, validator = _coordinator(tmp_path / "a.db", fleet)
    accepted = _accept(validator, _messages(fleet, np.random.default_rng(12)))

    def no_parse(*_a, **_k):
        raise AssertionError("stored bodies parsed again at ingest")

    with monkeypatch.context() as m:
        m.setattr(StreamDecoder, "from_bodies", no_parse)
        kept = validator.statistics(accepted)
    validator.batch_committed()  # the rows are let go: now decoded from the bodies
    again = validator.statistics(accepted)
    assert set(kept) == set(again) == {("r1", s) for s in PARAMS["streams"]}
    for key in kept:
        assert kept[key].n == again[key].n == 30 and kept[key].close_to(again[key])
