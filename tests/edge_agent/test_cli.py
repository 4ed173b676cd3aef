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


def test_check_config_warns_about_replay_values_it_would_clip_or_drop(tmp_path, capsys):
    cfg = _write_config(tmp_path)
    rows = ["t,cpu,mode", "0,50,1", "1,140,2", "2,-3,0", "3,oops,1", "4,20,7", "5,99,1"]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    assert main(["agent", "check-config", "--config", str(cfg)]) == 0
    out = json.loads(capsys.readouterr().out)
    warnings = "\n".join(out["warnings"])
    assert "cpu: 2 of 6 values outside its bounds [0, 100] (seen -3 to 140; first at line 3): the agent clips" \
        in warnings
    assert "cpu: 1 of 6 values are not valid (first at line 5: 'oops')" in warnings
    assert "mode: 1 of 6 values are not valid (first at line 6: 7)" in warnings
    # the device's stream specs, ready for `coordinator rounds open --params @file`
    from protocols.contract import parse_round_params

    assert set(parse_round_params(out["round_params"]).streams) == {"cpu", "mode"}


def test_check_config_fails_when_a_source_cannot_produce_a_dimension_here(tmp_path, capsys):
    """Issue 37: the Pi config on a host without a temperature sensor passed check-config, then dropped every
    reading. A host root without /sys/class/thermal: the test reading lacks temp, check-config exits 1."""
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"""
device_id = "pi-cli"
state_dir = "state"
[ledger]
total_cap = 10.0
[[dimensions]]
name = "temp"
kind = "numeric"
lo = 0
hi = 100
source = "temp_c"
[[sources]]
kind = "system"
options = {{ root = "{tmp_path / 'host'}" }}
""")
    (tmp_path / "host").mkdir()
    assert main(["agent", "check-config", "--config", str(cfg)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and any("a test reading failed on this host" in w and "temp" in w
                                      for w in out["warnings"]), out["warnings"]
    assert main(["agent", "check-config", "--config", str(cfg), "--no-source-check"]) == 0  # asked not to look


def test_check_config_refuses_a_client_certificate_issued_to_another_device(tmp_path, capsys):
    from coordinator.pki import init_ca, issue_certificate

    ca = tmp_path / "ca"
    init_ca(ca)
    cert, key = issue_certificate(ca, "pi-other", tmp_path / "clients")[:2]
    extra = (f'[mqtt]\nhost = "127.0.0.1"\ntls = true\nca_file = "{ca / "ca.crt"}"\ncert_file = "{cert}"\n'
             f'key_file = "{key}"\n')
    cfg = _write_config(tmp_path, extra)
    assert main(["agent", "check-config", "--config", str(cfg), "--no-source-check"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert any("CN=pi-other, not to device_id 'pi-cli'" in w for w in out["warnings"])
    own = issue_certificate(ca, "pi-cli", tmp_path / "clients")
    cfg.write_text(cfg.read_text().replace(str(cert), str(own[0])).replace(str(key), str(own[1])))
    assert main(["agent", "check-config", "--config", str(cfg), "--no-source-check"]) == 0


def test_dropped_records_name_their_line_and_value_and_clipping_is_logged_rate_limited(tmp_path, caplog):
    import logging

    from edge_agent import agent as agent_module
    from edge_agent.config import load_config
    from edge_agent.sources import ReplaySource

    cfg_path = _write_config(tmp_path)
    rows = ["t,cpu,mode", "0,50,1", "1,140,2", "2,-3,0", "3,oops,1", "4,120,1"]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    cfg = load_config(cfg_path)
    agent = Agent(cfg, ReplaySource(tmp_path / "data.csv", time_column="t"), secrets=new_identity(), transport=False)
    agent.open()
    try:
        with caplog.at_level(logging.WARNING, logger="haarvest.agent"):
            for _ in range(5):
                agent.sample()
        lines = [r.getMessage() for r in caplog.records]
        dropped = [ln for ln in lines if ln.startswith("invalid record dropped")]
        # the value is described, not shown (it may be a real reading; privacy.log_invalid_values shows it)
        assert dropped == [f"invalid record dropped at {tmp_path / 'data.csv'}:5: dimension 'cpu': wrong_type "
                           "(expected a number, got str), value: text of 4 characters; nothing sent, nothing charged"]
        clipped = [ln for ln in lines if ln.startswith("readings clipped")]
        # the first clip is logged at once; the next two wait for the interval (counted, not logged)
        assert clipped == ["readings clipped to their bounds: cpu: 1 outside [0, 100] (1 since start)"]
        assert agent.stats["clipped.cpu"] == 3
        caplog.clear()
        agent_module.CLIP_LOG_INTERVAL_S = 0.0
        with caplog.at_level(logging.WARNING, logger="haarvest.agent"):
            agent.close()  # the pending counts are logged on close
        assert "readings clipped to their bounds: cpu: 2 outside [0, 100] (3 since start)" in caplog.text
    finally:
        agent_module.CLIP_LOG_INTERVAL_S = 60.0
        agent.close()


def test_an_operator_can_opt_in_to_invalid_values_in_the_log(tmp_path, caplog):
    import logging

    from edge_agent.config import load_config
    from edge_agent.sources import ReplaySource

    cfg_path = _write_config(tmp_path, "[privacy]\nlog_invalid_values = true\n")
    (tmp_path / "data.csv").write_text("t,cpu,mode\n0,oops,1\n1,50,5\n")
    agent = Agent(load_config(cfg_path), ReplaySource(tmp_path / "data.csv", time_column="t"),
                  secrets=new_identity(), transport=False)
    agent.open()
    try:
        with caplog.at_level(logging.WARNING, logger="haarvest.agent"):
            agent.sample()
            agent.sample()
        assert "data.csv:2: dimension 'cpu': wrong_type (expected a number, got str), value: 'oops'" in caplog.text
        assert "data.csv:3: dimension 'mode': out_of_domain (the category index is not in [0, 3)), value: 5" \
            in caplog.text
    finally:
        agent.close()
