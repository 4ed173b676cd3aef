"""``haarvest demo --quick`` end to end (broker, coordinator, worker processes of real agents, Adult data): every
report arrives, later rounds are planned from earlier aggregates, estimates agree with the truth, the report is
written. Needs the Adult files (data/adult, shipped) and a broker (mosquitto or amqtt)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from haarvest.cli import main
from simulations.broker import amqtt_python, mosquitto_path
from simulations.demo import QUANTILES, QUICK, ROUND_EPSILON, load_adult_rows

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
def test_quick_demo_runs_end_to_end(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path / "out")]) == 0  # its time is not asserted
    printed = capsys.readouterr().out
    assert f"{QUICK['agents']}/{QUICK['agents']} agents connected" in printed
    assert "true" in printed and "estimate" in printed and "interval" in printed
    # decoded, with units: no raw Adult codes or bit prefixes in the table
    assert "age (years)" in printed and "hours (h/week)" in printed and "Male" in printed
    assert "United-States" in printed and "load (%)" in printed
    # the fleet's latency p50/p95: estimate, interval and the true quantile on one line, every round
    quantile_lines = [ln.split() for ln in printed.splitlines() if ln.split()[1:3] in (["latency", "p50"],
                                                                                       ["latency", "p95"])]
    assert len(quantile_lines) == 2 * QUICK["rounds"]
    assert all(ln[3] == "(ms)" and ln[6].startswith("[") and ln[7].endswith("]") for ln in quantile_lines)
    assert "no report was re-sent from a memo" in printed  # the output says why estimates do not repeat
    assert "--serve" in printed  # and how to keep the dashboard up
    # docs/demo.md quotes the output: every quoted line is one the demo prints, numbers and paths aside
    for line in _quoted_output():
        assert any(_matches(line, got) for got in printed.splitlines()), f"docs/demo.md quotes {line!r}"

    result = json.loads((tmp_path / "out" / "estimates.json").read_text())
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == [f"r{i + 1}" for i in range(QUICK["rounds"])]
    assert all(r["reports"] == r["expected"] == QUICK["agents"] * 6 for r in rounds)
    # sequential interaction: round r+1 is planned from rounds 1..r — rounding steps and heavy-hitter prefixes
    assert rounds[0]["depends_on"] == [] and rounds[1]["depends_on"] == ["r1"]
    assert rounds[2]["depends_on"] == ["r1", "r2"]
    assert set(rounds[1]["rounding"]) == {"profile", "load"}
    assert rounds[1]["heavy_hitters"]["prefix_bits"] == rounds[0]["heavy_hitters"]["step_bits"] or \
        rounds[1]["heavy_hitters"] == rounds[0]["heavy_hitters"]  # nothing significant: the prefix step repeats

    rows = result["rows"]
    assert {r["stream"] for r in rows} == {"profile", "load", "sex", "country", "app", "latency"}
    age = [r for r in rows if r["item"] == "age"]
    assert age and all(r["unit"] == "years" and 30 < r["true"] < 50 for r in age)  # mean age in years, not a code
    # the distribution stream's rows are its quantiles with their intervals (from the inverted CDF band) and the
    # true quantiles of the devices' readings that round
    quantiles = [r for r in rows if r["stream"] == "latency"]
    assert [r["item"] for r in quantiles] == [f"p{100 * q:g}" for q in QUANTILES] * QUICK["rounds"]
    assert all(r["kind"] == "distribution" and r["unit"] == "ms" and r["n"] == QUICK["agents"] for r in quantiles)
    assert all(0 <= r["ci_low"] <= r["estimate"] <= r["ci_high"] <= 1000 for r in quantiles)
    assert all(20 < r["true"] < 1000 for r in quantiles)
    assert all(p50["true"] < p95["true"] for p50, p95 in zip(quantiles[::2], quantiles[1::2]))
    est = result["estimates"]
    assert all(est[r["round"]]["latency"]["quantiles"] and len(result["truth"][r["round"]]["latency"])
               == len(est[r["round"]]["latency"]["cdf"]) for r in rounds)  # the true CDF for the chart
    # every unbiased mean or frequency within 5 standard errors of the truth (rounding adds a little unmodelled
    # variance); quantile intervals are not symmetric and have no standard error
    z = np.array([abs(r["estimate"] - r["true"]) / r["stderr"] for r in rows if r["stderr"] is not None])
    assert np.all(z < 5), max(z)
    assert all(r["ci_low"] <= r["estimate"] <= r["ci_high"] for r in rows)
    # the device unit (default): every report charged, nothing memoized; within rounds × round ε
    assert result["spent"]["max"] <= QUICK["rounds"] * ROUND_EPSILON and result["spent"]["memo_hits"] == 0
    # the latency stream is charged too: every round at least its ε = 4 on top of the others' 4 + 2 + 1 + 2
    assert result["spent"]["min"] >= QUICK["rounds"] * (4 + 2 + 1 + 2 + 4)

    report = (tmp_path / "out" / "report.html").read_text()
    assert report.count("<svg") >= 10 and 'class="truth"' in report and 'class="band"' in report
    assert "latency — fleet p95 per round" in report and "latency — CDF, r1" in report
    assert (tmp_path / "out" / "dashboard.html").read_text().count("<svg") >= 5


def _norm(line: str) -> str:
    line = re.sub(r"\S*/\S*", "PATH", line)  # paths and URLs
    line = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return " ".join(line.replace(" NO", " yes").split())


def _matches(quoted: str, printed: str) -> bool:
    """``printed`` is ``quoted`` with other numbers and paths; ``…`` in the quote stands for anything."""
    parts = [re.escape(_norm(p)) for p in quoted.split("…")]
    return re.fullmatch(".*".join(parts), _norm(printed)) is not None


def _quoted_output() -> list[str]:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "demo.md").read_text()
    block = doc.split("A full run (200 agents", 1)[1].split("```", 2)[1]
    return [ln for ln in block.splitlines() if ln.strip() and ln.strip() != "…"]


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _survivors(children: set[int], timeout: float = 15.0) -> list[int]:
    """The processes of ``children`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [c for c in children if _alive(c)]


def _reap(proc) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _start_demo(tmp_path, *extra):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "haarvest.cli", "demo", "--quick", "--agents", "20", "--rounds",
                             "2", "--out", str(tmp_path / "out"), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _read_until(proc, marker: str, timeout: float) -> str:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"{marker!r} not printed within {timeout} s:\n" + "".join(seen)[-3000:])


@pytest.mark.skipif(not _adult_available(), reason="Adult data (data/adult) not available")
@pytest.mark.skipif(mosquitto_path() is None and amqtt_python() is None, reason="no MQTT broker installed")
def test_serve_keeps_the_dashboard_up_and_sigterm_stops_it_cleanly(tmp_path):
    proc = _start_demo(tmp_path, "--serve")
    try:
        printed = _read_until(proc, "serving the dashboard at", 90)
        url = printed.rsplit("serving the dashboard at ", 1)[1].split()[0]
        assert (tmp_path / "out" / "report.html").exists()  # written before serving, not only on exit
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and "haarvest coordinator" in resp.read().decode()
        children = _descendants(proc.pid)
        assert children  # the broker at least
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not _survivors(children)
    finally:
        _reap(proc)


@pytest.mark.skipif(not _adult_available(), reason="Adult data (data/adult) not available")
@pytest.mark.skipif(mosquitto_path() is None and amqtt_python() is None, reason="no MQTT broker installed")
def test_a_demo_killed_outright_leaves_no_broker_or_worker_behind(tmp_path):
    proc = _start_demo(tmp_path, "--serve")
    try:
        _read_until(proc, "agents connected", 90)
        children = _descendants(proc.pid)
        assert len(children) >= 2  # the broker and a fleet worker
        proc.kill()
        proc.wait()
        assert not _survivors(children)
    finally:
        _reap(proc)
