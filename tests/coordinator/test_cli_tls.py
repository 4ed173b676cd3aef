"""`haarvest coordinator run --config FILE` and `coordinator rounds …` over the shipped TLS broker configuration
(deploy/mosquitto: client certificates required, CN = user name, ACL), with the coordinator's certificate (CN
"coordinator") from `haarvest pki`: ingest subscribes, rounds are published, a TLS agent's report is stored; a
client the ACL does not let publish rounds, or one without a certificate, makes `rounds` fail loudly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator import cli
from coordinator.store import SQLiteStore
from edge_agent.agent import Agent
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from tests.brokers import wait_until
from tests.deploy.test_tls_acl import tls_broker  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"streams": {"cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["cpu"],
                              "bounds": [[0, 100]]}}}


def _config(path: Path, port: int, ca: Path, cn: str | None) -> Path:
    lines = ['db = "coordinator.db"', 'key = "coordinator.key"', 'mqtt_host = "localhost"', f"mqtt_port = {port}",
             f'mqtt_ca = "{ca / "ca.crt"}"', "batch_ms = 10"]
    if cn is not None:
        lines += [f'mqtt-cert = "{ca / "clients" / f"{cn}.crt"}"', f'mqtt-key = "{ca / "clients" / f"{cn}.key"}"']
        rounds = "coordinator-rounds"  # the round publisher's own identity (one certificate, one session)
        lines += [f'rounds_cert = "{ca / "clients" / f"{rounds}.crt"}"',
                  f'rounds_key = "{ca / "clients" / f"{rounds}.key"}"']
    path.write_text("\n".join(lines) + "\n")
    return path


_wait = wait_until


def test_coordinator_and_rounds_cli_over_tls_with_client_certificate(tls_broker, tmp_path, capsys):  # noqa: F811
    port, ca = tls_broker
    work = tmp_path / "coord"
    work.mkdir()
    conf = _config(work / "coordinator.toml", port, ca, "coordinator")
    # the coordinator's key and the device's enrolment first (as an operator would)
    assert cli.main(["coordinator", "check-config", "--config", str(conf)]) == 0
    ident = new_identity()
    assert cli.main(["coordinator", "enroll-device", "--config", str(conf), "--id", "dev-1",
                     "--pubkey", ident.public_key_b64]) == 0
    from coordinator.service import load_or_create_key
    from protocols import wire

    coord_pub = wire.public_key_b64(load_or_create_key(work / "coordinator.key"))
    proc = subprocess.Popen([sys.executable, "-m", "haarvest", "coordinator", "run", "--config", str(conf)],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "coordinator.log", "wb"), cwd=ROOT,
                            text=True)
    agent = None
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line and json.loads(line)["status"] == "ready", (tmp_path / "coordinator.log").read_text()
        cfg = simple_config(
            "dev-1", tmp_path / "agent", [numeric("cpu", 0, 100)],
            mqtt={"host": "localhost", "port": port, "tls": True, "ca_file": str(ca / "ca.crt"),
                  "cert_file": str(ca / "clients" / "dev-1.crt"), "key_file": str(ca / "clients" / "dev-1.key"),
                  "protocol": "5", "reconnect_min_s": 1, "reconnect_max_s": 2},
            coordinator_public_key=coord_pub,
        )
        agent = Agent(cfg, CallableSource(lambda: {"cpu": 42.0}), secrets=ident).open()
        assert _wait(lambda: (agent.step(), agent.transport.connected.is_set())[1], 15)
        capsys.readouterr()
        assert cli.main(["coordinator", "rounds", "open", "--config", str(conf), "--id", "r1", "--epsilon", "1",
                         "--params", json.dumps(PARAMS)]) == 0
        store = SQLiteStore(work / "coordinator.db")
        try:
            assert _wait(lambda: (agent.step(), store.report_counts().get(("r1", "cpu")) == 1)[1], 20), \
                (dict(agent.stats), (tmp_path / "coordinator.log").read_text()[-2000:])
            assert store.counters() == {"accepted": 1}
        finally:
            store.close()
        assert cli.main(["coordinator", "rounds", "close", "--config", str(conf), "--id", "r1"]) == 0
        assert _wait(lambda: (agent.step(), agent.stats["rounds.cleared"] >= 1)[1], 10)

        # a device's certificate may not publish rounds (ACL): refused by the broker, reported, exit status 1
        capsys.readouterr()
        assert cli.main(["coordinator", "rounds", "publish", "--config", str(conf),
                         "--rounds-cert", str(ca / "clients" / "dev-2.crt"),
                         "--rounds-key", str(ca / "clients" / "dev-2.key")]) == 0  # nothing open: nothing to publish
        assert cli.main(["coordinator", "rounds", "open", "--config", str(conf), "--id", "r2", "--epsilon", "1",
                         "--params", json.dumps(PARAMS), "--rounds-cert", str(ca / "clients" / "dev-2.crt"),
                         "--rounds-key", str(ca / "clients" / "dev-2.key")]) == 1
        err = capsys.readouterr().err
        assert "refused" in err and "Not authorized" in err and "rounds publish" in err, err
        # no client certificate: the broker does not let it in
        bare = _config(work / "bare.toml", port, ca, None)
        assert cli.main(["coordinator", "rounds", "publish", "--config", str(bare), "--db",
                         str(work / "coordinator.db"), "--key", str(work / "coordinator.key")]) == 1
        err = capsys.readouterr().err
        assert "cannot connect" in err or "did not accept" in err, err
    finally:
        if agent is not None:
            agent.close(drain_timeout=1)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
