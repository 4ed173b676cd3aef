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
    assert "## Coordinator ingest over PostgreSQL: workers on a shared subscription" in out
    if "Not measured" not in out:  # the PostgreSQL server binaries are installed
        for row in ("| 1 worker, HMAC, MQTT 3.1.1 |", "| 2 workers, HMAC, MQTT 3.1.1 |", "| 1 worker, Ed25519, MQTT 5 |",
                    "| 10,000,000 | 1 min | 166,667 |", "Conclusions (computed"):
            assert row in out, row


def test_postgres_section_computes_its_conclusions_and_sizing_from_the_measurements():
    """The PostgreSQL section from made-up drains: the per-worker rates, per-core capacities and the sizing table
    follow the numbers given (workers = ⌈headroom × reports/s ÷ one worker's rate⌉, cores = headroom × reports/s ×
    CPU per report)."""
    from simulations.bench.ingest import HEADROOM, _Drain, postgres_report

    n = 10_000
    drains = {(1, "HMAC", "3.1.1"): _Drain(rate=5000, cpu=2.0, broker_in=0.1, broker_out=0.1, db_cpu=0.5,
                                           db_bytes=500, load=(1.0, 1.5)),
              (2, "HMAC", "3.1.1"): _Drain(rate=9000, cpu=2.2, broker_out=0.1, db_cpu=0.6, db_bytes=500),
              (1, "Ed25519", "5"): _Drain(rate=2000, cpu=5.0, broker_in=0.1, broker_out=0.1, db_cpu=0.5)}
    out = postgres_report(n, drains, _Drain(rate=8000, cpu=1.9), cores=2)
    assert HEADROOM == 2.0
    assert "| 1 worker, HMAC, MQTT 3.1.1 | 5,000 | 5,000 | 200 µs | 50 µs | 20 µs | 500 B/report | 1.00 → 1.50 |" in out
    assert "| 2 workers, HMAC, MQTT 3.1.1 | 9,000 | 4,500 | 220 µs | 60 µs | 10 µs |" in out
    assert "drained 5,000 reports/s (HMAC, MQTT 3.1.1), 62 % of the same worker over SQLite (8,000/s)" in out
    assert "drained 9,000/s, 1.80× one worker" in out
    assert "cores 131 % busy" in out and "the cores were saturated" in out  # 9000 × 290 µs
    assert "a worker (both processes) validates and commits 5,000 reports/s" in out  # 1e6 / 200 µs
    assert "PostgreSQL stores 20,000/s and mosquitto moves 50,000/s" in out
    # 10^7 devices every minute: 166,667/s; HMAC workers ⌈2 × 166,667 / 5,000⌉ = 67, Ed25519 ⌈2 × 166,667 / 2,000⌉
    # = 167; PostgreSQL 2 × 166,667 × 50 µs = 17 cores, broker 2 × 166,667 × 20 µs = 6.7; 166,667 × 86,400 × 500 B
    assert "| 10,000,000 | 1 min | 166,667 | 67 | 167 | 17 | 6.7 | 7,200.0 GB |" in out
    assert "| 10,000 | 60 min | 2.8 | 1 | 1 | < 0.01 | < 0.01 | 0.1 GB |" in out


def test_fleet_scale_bench_quick_runs():
    """The fleet-scale section at 2,000 devices: both coordinators (MQTT 5 and 3.1.1) drain every report of one
    publication pass, the tables render, the estimates from the aggregates equal those from the stored bodies and
    lie near the devices' true values."""
    import numpy as np

    from simulations.bench import fleet_scale

    res = fleet_scale.measure(2000, reps=2, old_reps=1)
    out = fleet_scale.render(res)
    assert out.startswith("## Fleet scale: one round, one coordinator\n")
    for row in ("| raw: mosquitto_pub -l", "| coordinator over MQTT 5: drain of 2,000 queued reports",
                "| coordinator over MQTT 3.1.1: drain of 2,000 queued reports", "| coordinator, main process",
                "| mosquitto, peak RSS", "| SQLite file", "| 200 |", "| 2,000 |", "Conclusions (computed",
                "- Drain over MQTT 5:", "- Drain over MQTT 3.1.1:", "- Estimates from the aggregates:",
                "- Accuracy:"):
        assert row in out, row
    assert [r["n"] for r in res["latency"]] == [200, 2000]
    assert all(r["agree"] < 1e-9 for r in res["latency"])  # aggregates and re-read bodies: the same estimates
    assert [d["protocol"] for d in res["drains"]] == ["5", "3.1.1"]
    assert all(d["rss_main"] > 0 and d["cpu_main_us"] > 0 for d in res["drains"])
    assert res["broker_rss"] > 0 and res["db_bytes"] > 0
    estimates = res["latency"][-1]["estimates"]
    for name, st in res["streams"].items():
        e = estimates[name]
        assert e["n"] == st["reports"] and e["error"] is None
        err = np.abs(np.asarray(e["raw"]) - np.asarray(st["truth"])) / np.asarray(e["stderr"])
        assert np.all(err < 5), (name, err)  # within 5 standard errors of the truth
