"""`haarvest coordinator estimate` prints a distribution stream's quantiles with intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coordinator import cli
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from protocols import wire
from protocols.contract import StreamSpec, make_body

PARAMS = {"streams": {
    "lat": {"kind": "distribution", "mechanism": "distribution_haar", "params": {"epsilon": 3.0, "D": 16},
            "dims": ["lat"], "bounds": [[0.0, 100.0]], "units": ["ms"]},
    "sw": {"kind": "distribution", "mechanism": "distribution_square_wave", "params": {"epsilon": 3.0, "D": 16},
           "dims": ["lat"], "bounds": [[0.0, 100.0]]},
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 2.0}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
}}


@pytest.fixture()
def db(tmp_path):
    path = str(tmp_path / "c.db")
    rng = np.random.default_rng(3)
    fleet = SimFleet(400, signature="hmac-sha256")
    store = SQLiteStore(path)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    v = Validator(store)
    RoundManager(store, wire.generate_signing_key(), on_change=v.set_round).open_round("r1", 20.0, PARAMS)
    v.reload()
    msgs = []
    for name, raw in PARAMS["streams"].items():
        spec = StreamSpec.model_validate(raw)
        mech = spec.build()
        if spec.kind == "distribution":
            rows = mech.privatize_unit(spec.grid().unit(rng.normal(50, 10, len(fleet))), rng)
        else:
            rows = mech.privatize(rng.uniform(-1, 1, len(fleet)), rng)
        msgs += [d.report("r1", name, spec.wire_mechanism, make_body(spec.entry.encode_row(mech, r)))
                 for d, r in zip(fleet.devices, rows)]
    batch = [r for r in v.check_batch(msgs) if not isinstance(r, wire.WireError)]
    assert len(batch) == len(msgs)
    store.commit_batch(batch, {}, v.statistics)
    store.close()
    return path


def test_estimate_prints_quantiles_with_intervals(db, capsys):
    assert cli.main(["coordinator", "estimate", "r1", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "r1/lat (distribution, distribution_haar, n=400)" in out
    section = out.split("r1/lat")[1].split("==")[0]
    lines = {ln.split()[0]: ln for ln in section.splitlines() if ln.strip().startswith("p")}
    assert {"p50", "p90", "p95", "p99"} <= set(lines)
    assert "ms" in lines["p50"] and "[" in lines["p50"]
    assert "no interval" in out  # Square Wave
    assert "histogram and CDF over 16 buckets of [0, 100] ms: --json" in out
    assert "r1/cpu" in out


def test_estimate_quantiles_option_and_json(db, capsys):
    assert cli.main(["coordinator", "estimate", "r1", "--db", db, "--quantiles", "0.25,0.75", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lat = data["lat"]
    assert [q["q"] for q in lat["quantiles"]] == [0.25, 0.75]
    assert len(lat["edges"]) == 17 and len(lat["cdf"]) == 16 and len(lat["cdf_low"]) == 16
    q25, q75 = lat["quantiles"]
    assert q25["low"] <= q25["value"] <= q25["high"] and q25["value"] < q75["value"]
    assert abs(q25["value"] - (50 - 0.674 * 10)) < 10 and abs(q75["value"] - (50 + 0.674 * 10)) < 10
    assert data["cpu"]["quantiles"] == [] and data["cpu"]["edges"] == []


@pytest.mark.parametrize("bad", ["0,0.5", "1.5", "x", ""])
def test_bad_quantile_levels_are_a_usage_error(db, bad, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["coordinator", "estimate", "r1", "--db", db, "--quantiles", bad])
    assert exc.value.code == 2
