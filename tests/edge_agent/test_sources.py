"""Sources: /proc and /sys metrics (real and a fake tree), CSV/JSONL replay, plugins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_agent.config import SourceConfig
from edge_agent.sources import (
    IterableSource,
    MergedSource,
    ReplaySource,
    SourceError,
    SystemMetrics,
    build_source,
    build_sources,
    load_plugin,
)


class FakeSensor:
    def __init__(self, value: float = 1.5) -> None:
        self.value = value

    def read(self):
        return {"humidity": self.value}


def make_sensor(value: float = 2.0) -> FakeSensor:
    return FakeSensor(value)


def _fake_proc(root: Path, user: int, idle: int, rx: int, tx: int) -> None:
    (root / "proc" / "net").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "stat").write_text(f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (root / "proc" / "loadavg").write_text("0.50 0.25 0.10 1/100 1234\n")
    (root / "proc" / "meminfo").write_text("MemTotal:  1000 kB\nMemFree: 100 kB\nMemAvailable:  250 kB\n")
    (root / "proc" / "uptime").write_text("1234.5 4000.0\n")
    (root / "proc" / "net" / "dev").write_text(
        "Inter-|   Receive |  Transmit\n face |bytes packets ...\n"
        f"    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
        f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"
    )


def test_system_metrics_fake_tree(tmp_path):
    _fake_proc(tmp_path, user=100, idle=100, rx=1000, tx=500)
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("48312\n")
    t = [100.0]
    src = SystemMetrics(root=tmp_path, clock=lambda: t[0])
    _fake_proc(tmp_path, user=175, idle=125, rx=1000, tx=500)  # 75 busy of 100 jiffies
    first = src.read()
    assert first["cpu_percent"] == pytest.approx(75.0)
    assert first["load1"] == 0.5 and first["load15"] == 0.1
    assert first["mem_percent"] == pytest.approx(75.0)
    assert first["temp_c"] == pytest.approx(48.312)
    assert first["uptime_s"] == 1234.5
    assert first["net_rx_bytes"] == 1000 and first["net_tx_bytes"] == 500  # lo excluded
    assert "net_rx_rate" not in first
    _fake_proc(tmp_path, user=175, idle=225, rx=3000, tx=700)
    t[0] = 102.0
    second = src.read()
    assert second["cpu_percent"] == pytest.approx(0.0)
    assert second["net_rx_rate"] == pytest.approx(1000.0) and second["net_tx_rate"] == pytest.approx(100.0)


def test_system_metrics_without_thermal_zone(tmp_path):
    _fake_proc(tmp_path, 1, 1, 0, 0)
    assert "temp_c" not in SystemMetrics(root=tmp_path).read()


def test_system_metrics_real_proc():
    if not Path("/proc/stat").exists():
        pytest.skip("not Linux")
    src = SystemMetrics()
    r = src.read()
    assert 0.0 <= r["cpu_percent"] <= 100.0
    assert 0.0 <= r["mem_percent"] <= 100.0
    assert r["uptime_s"] > 0 and r["load1"] >= 0
    assert "net_rx_rate" in src.read()


def test_csv_replay_with_time_and_device_columns(tmp_path):
    path = tmp_path / "fleet.csv"
    path.write_text("t,device,cpu,mode\n0,a,10.5,1\n1,b,20,2\n2,a,30,\n3,a,abc,0\n")
    src = ReplaySource(path, time_column="t", device_column="device", device="a")
    assert src.read() == {"cpu": 10.5, "mode": 1}
    assert src.read() == {"cpu": 30, "mode": None}
    assert src.read() == {"cpu": "abc", "mode": 0}  # text stays text: the pipeline rejects it
    assert src.read() is None


def test_jsonl_replay_loop_and_realtime(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps({"ts": 100 + 5 * i, "x": i}) for i in range(3)) + "\n")
    clock = [0.0]
    slept: list[float] = []

    def sleep(d):
        slept.append(d)
        clock[0] += d

    src = ReplaySource(path, time_column="ts", realtime=True, loop=True, sleep=sleep, clock=lambda: clock[0])
    xs = [src.read()["x"] for _ in range(5)]
    assert xs == [0, 1, 2, 0, 1]
    assert slept[:2] == [5.0, 5.0]


def test_replay_errors(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        ReplaySource(tmp_path / "nope.csv")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\nnot json\n')
    src = ReplaySource(bad)
    assert src.read() == {"x": 1}
    with pytest.raises(SourceError, match="bad.jsonl:2: not JSON"):
        src.read()
    with pytest.raises(SourceError, match="needs time_column"):
        ReplaySource(bad, realtime=True)


def test_plugins_by_dotted_path_and_errors():
    src = build_source(SourceConfig(kind="plugin", plugin="tests.edge_agent.test_sources:make_sensor",
                                    options={"value": 3.0}))
    assert src.read() == {"humidity": 3.0}
    assert load_plugin("tests.edge_agent.test_sources.FakeSensor") is FakeSensor
    with pytest.raises(SourceError, match="cannot import"):
        load_plugin("no_such_module_xyz:thing")
    with pytest.raises(SourceError, match="no attribute"):
        load_plugin("tests.edge_agent.test_sources:nothing_here")
    with pytest.raises(SourceError, match="not an entry point"):
        load_plugin("nonexistent-plugin")
    with pytest.raises(SourceError, match="bad options"):
        build_source(SourceConfig(kind="plugin", plugin="tests.edge_agent.test_sources:make_sensor",
                                  options={"nope": 1}))


def test_merged_sources(tmp_path):
    merged = MergedSource([IterableSource([{"a": 1}, {"a": 2}]), FakeSensor(7.0)])
    assert merged.read() == {"a": 1, "humidity": 7.0}
    assert merged.read() == {"a": 2, "humidity": 7.0}
    assert merged.read() is None
    path = tmp_path / "x.csv"
    path.write_text("cpu\n1\n")
    both = build_sources([SourceConfig(kind="replay", path=path),
                          SourceConfig(kind="plugin", plugin="tests.edge_agent.test_sources:FakeSensor")])
    assert both.read() == {"cpu": 1, "humidity": 1.5}
    with pytest.raises(SourceError, match="no"):
        build_sources([])
