"""``haarvest demo --quick`` end to end (broker, coordinator, worker processes of real agents, Adult data): every
report arrives, later rounds are planned from earlier aggregates, estimates agree with the truth, the report is
written. Needs the Adult files (data/adult, shipped) and a broker (mosquitto or amqtt)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from haarvest.cli import main
from simulations.broker import amqtt_python, mosquitto_path
from simulations.demo import QUICK, load_adult_rows

pytestmark = pytest.mark.integration


def _adult_available() -> bool:
    try:
        load_adult_rows()
    except (FileNotFoundError, OSError, ValueError):
        return False
    return True


@pytest.mark.skipif(not _adult_available(), reason="Adult data (data/adult) not available")
@pytest.mark.skipif(mosquitto_path() is None and amqtt_python() is None,
                    reason="no MQTT broker (mosquitto or amqtt) installed")
def test_quick_demo_runs_end_to_end_under_a_minute(tmp_path, capsys):
    t0 = time.monotonic()
    assert main(["demo", "--quick", "--out", str(tmp_path / "out")]) == 0
    elapsed = time.monotonic() - t0
    printed = capsys.readouterr().out
    assert elapsed < 60, elapsed
    assert f"{QUICK['agents']}/{QUICK['agents']} agents connected" in printed
    assert "true" in printed and "estimate" in printed and "interval" in printed

    result = json.loads((tmp_path / "out" / "estimates.json").read_text())
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == [f"r{i + 1}" for i in range(QUICK["rounds"])]
    assert all(r["reports"] == r["expected"] == QUICK["agents"] * 5 for r in rounds)
    # sequential interaction: round r+1 is planned from rounds 1..r — rounding steps and heavy-hitter prefixes
    assert rounds[0]["depends_on"] == [] and rounds[1]["depends_on"] == ["r1"]
    assert rounds[2]["depends_on"] == ["r1", "r2"]
    assert set(rounds[1]["rounding"]) == {"profile", "load"}
    assert rounds[1]["heavy_hitters"]["prefix_bits"] == rounds[0]["heavy_hitters"]["step_bits"] or \
        rounds[1]["heavy_hitters"] == rounds[0]["heavy_hitters"]  # nothing significant: the prefix step repeats

    rows = result["rows"]
    assert {r["stream"] for r in rows} == {"profile", "load", "sex", "country", "app"}
    # every unbiased estimate within 5 standard errors of the truth (rounding adds a little unmodelled variance)
    z = np.array([abs(r["estimate"] - r["true"]) / r["stderr"] for r in rows])
    assert np.all(z < 5), max(z)
    assert all(r["ci_low"] <= r["estimate"] <= r["ci_high"] for r in rows)
    # the device unit (default): every report charged, nothing memoized; within rounds × round ε
    assert result["spent"]["max"] <= QUICK["rounds"] * 13.0 and result["spent"]["memo_hits"] == 0

    report = (tmp_path / "out" / "report.html").read_text()
    assert report.count("<svg") >= 10 and 'class="truth"' in report and 'class="band"' in report
    assert (tmp_path / "out" / "dashboard.html").read_text().count("<svg") >= 5
