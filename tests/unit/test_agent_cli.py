"""``haarvest agent ...``: enroll, check-config, run (offline), status, ledger; SIGTERM and systemd notify."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_agent.agent import Agent, run_fleet
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.sources import IterableSource
from edge_agent.systemd import Notifier
from haarvest.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _write_config(tmp_path: Path, extra: str = "") -> Path:
    rows = "\n".join(f"{i},{(i * 13) % 100},{i % 3}" for i in range(40))
    (tmp_path / "data.csv").write_text("t,cpu,mode\n" + rows + "\n")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f"""
device_id = "pi-cli"
state_dir = "state"
schedule = "interval"
report_interval_s = 0.05
sample_interval_s = 0.02
{extra}
[ledger]
total_cap = 100.0

[[dimensions]]
name = "cpu"
kind = "numeric"
lo = 0
hi = 100

[[dimensions]]
name = "mode"
kind = "categorical"
k = 3

[[sources]]
kind = "replay"
path = "data.csv"
time_column = "t"
"""
    )
    return cfg


def test_enroll_check_run_status_ledger(tmp_path, capsys):
    cfg = _write_config(tmp_path)
    assert main(["agent", "enroll", "--config", str(cfg)]) == 0
    enrol = json.loads(capsys.readouterr().out)
    assert enrol["device_id"] == "pi-cli" and enrol["created"] and len(enrol["public_key"]) == 44
    assert enrol["streams"] == {"cpu": "auto", "mode": "auto"}  # its contract: the coordinator accepts only these
    assert (tmp_path / "state" / "device.key").stat().st_mode & 0o777 == 0o600
    assert main(["agent", "enroll", "--config", str(cfg)]) == 0  # idempotent: same identity
    again = json.loads(capsys.readouterr().out)
    assert again["public_key"] == enrol["public_key"] and not again["created"]

    assert main(["agent", "check-config", "--config", str(cfg)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["secrets"] == "ok" and not summary["warnings"]
    assert summary["streams"]["cpu"]["mechanism"] == "hybrid"

    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "3", "--log-level", "WARNING"]) == 0
    capsys.readouterr()
    assert main(["agent", "status", "--config", str(cfg), "--integrity"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["integrity_check"] == ["ok"] and status["invariants"]["ok"]
    assert status["next_seq"] == 6 and status["boot"] == 1
    assert main(["agent", "ledger", "--config", str(cfg), "--total"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[-1]["total"] == status["spent_total"] > 0
    assert all(row["epsilon"] == 1.0 for row in lines[:-1])


def test_enroll_hmac_report_key(tmp_path, capsys):
    """``--signature hmac-sha256``: the key file and the printed registry entry hold the HMAC key; the agent runs
    with it; a mistyped algorithm is a clear error that creates nothing."""
    from edge_agent.config import load_config, load_secrets
    from protocols import wire

    cfg = _write_config(tmp_path)
    with pytest.raises(SystemExit):
        main(["agent", "enroll", "--config", str(cfg), "--signature", "rsa"])
    assert "invalid choice" in capsys.readouterr().err and not (tmp_path / "state" / "device.key").exists()
    assert main(["agent", "enroll", "--config", str(cfg), "--signature", "hmac-sha256"]) == 0
    enrol = json.loads(capsys.readouterr().out)
    assert enrol["algorithm"] == "hmac-sha256" and enrol["public_key"].startswith("hmac-sha256:")
    secrets = load_secrets(load_config(cfg))
    assert isinstance(secrets.signing_key, wire.MacKey) and secrets.public_key_b64 == enrol["public_key"]
    assert secrets.key_id not in enrol["public_key"] and len(secrets.key_id) == 16
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 0


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["agent", "check-config", "--config", str(tmp_path / "none.toml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err
    cfg = _write_config(tmp_path, extra='colour = "blue"')
    assert main(["agent", "check-config", "--config", str(cfg)]) == 2
    assert "colour: unknown key" in capsys.readouterr().err
    cfg = _write_config(tmp_path)
    assert main(["agent", "run", "--config", str(cfg)]) == 2  # not enrolled yet
    assert "agent enroll" in capsys.readouterr().err
    assert main(["agent", "status", "--config", str(cfg)]) == 2
    assert "no agent database" in capsys.readouterr().err
    assert main(["agent", "check-config", "--config", str(cfg)]) == 0
    assert "enroll" in json.loads(capsys.readouterr().out)["warnings"][0]


def test_sigterm_and_systemd_notify(tmp_path):
    cfg = _write_config(tmp_path).read_text().replace("report_interval_s = 0.05", "report_interval_s = 3600")
    cfg = cfg.replace('path = "data.csv"', 'path = "data.csv"\nloop = true')
    (tmp_path / "agent.toml").write_text(cfg)
    assert main(["agent", "enroll", "--config", str(tmp_path / "agent.toml")]) == 0
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "200000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "haarvest", "agent", "run", "--config", str(tmp_path / "agent.toml")],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        msgs = [sock.recv(4096).decode()]
        assert msgs[0].startswith("READY=1")
        msgs.append(sock.recv(4096).decode())
        assert msgs[1] == "WATCHDOG=1"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        rest = []
        sock.settimeout(0.5)
        try:
            while True:
                rest.append(sock.recv(4096).decode())
        except socket.timeout:
            pass
        assert "STOPPING=1" in rest
        logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        assert {"started", "stopped"} <= {entry.get("event") for entry in logs}
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_notifier_is_a_noop_outside_systemd():
    n = Notifier({})
    assert not n.enabled and not n.ready() and not n.watchdog()
    assert Notifier({"NOTIFY_SOCKET": "@abstract", "WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0


def test_fleet_runs_many_embedded_agents_on_one_thread(tmp_path):
    agents = []
    for i in range(20):
        cfg = simple_config(f"dev-{i:03d}", tmp_path / f"d{i}", [numeric("cpu", 0, 100)], report_interval_s=0.02)
        rows = [{"cpu": float((i + j) % 100)} for j in range(100)]
        agents.append(Agent(cfg, IterableSource(rows), secrets=new_identity(), transport=False))
    t0 = time.monotonic()
    run_fleet(agents, max_rounds=3, poll_s=0.01, timeout=20)
    assert time.monotonic() - t0 < 20
    assert all(a.rounds_answered >= 3 for a in agents)
    assert all(a.state is None for a in agents)  # closed
