"""`make bench`'s ingest and fleet-scale sections run end to end in their quick mode (no timing is asserted: speed
lives in the bench)."""

from __future__ import annotations

import shutil

import pytest

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not (shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto"))
                                 or not shutil.which("mosquitto_pub"), reason="needs mosquitto and its clients")]


def test_ingest_bench_quick_runs():
    from simulations.bench import ingest

    out = ingest.run(quick=True)
    for row in ("raw: mosquitto_pub", "raw: paho publisher", "1 coordinator, Ed25519, MQTT 5", "1 coordinator, HMAC, MQTT 3.1.1",
                "coordinator live"):
        assert row in out
    assert "of the raw mosquitto_pub rate" in out


def test_fleet_scale_bench_quick_runs():
    """The fleet-scale section at 2,000 devices: the drain stores every report, the tables render, the estimates
    from the aggregates equal those from the stored bodies and lie near the devices' true values."""
    import numpy as np

    from simulations.bench import fleet_scale

    res = fleet_scale.measure(2000, reps=2, old_reps=1)
    out = fleet_scale.render(res)
    assert out.startswith("## Fleet scale: one round, one coordinator\n")
    for row in ("| raw: mosquitto_pub -l", "| coordinator drain of 2,000 queued reports", "| coordinator, main process",
                "| mosquitto, peak RSS", "| SQLite file", "| 200 |", "| 2,000 |", "Conclusions (computed",
                "- Drain:", "- Estimates from the aggregates:", "- Accuracy:"):
        assert row in out, row
    assert [r["n"] for r in res["latency"]] == [200, 2000]
    assert all(r["agree"] < 1e-9 for r in res["latency"])  # aggregates and re-read bodies: the same estimates
    assert res["drain"]["rss_main"] > 0 and res["broker_rss"] > 0 and res["db_bytes"] > 0
    estimates = res["latency"][-1]["estimates"]
    for name, st in res["streams"].items():
        e = estimates[name]
        assert e["n"] == st["reports"] and e["error"] is None
        err = np.abs(np.asarray(e["raw"]) - np.asarray(st["truth"])) / np.asarray(e["stderr"])
        assert np.all(err < 5), (name, err)  # within 5 standard errors of the truth
