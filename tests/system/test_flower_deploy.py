"""Acceptance: a loopback Flower deployment with deploy/flower/ — SuperLink with TLS (one HTTP port) and SuperNode
authentication, two registered SuperNodes each hosting a haarvest device with its own ledger, a third SuperNode
with an unregistered key that is refused, and two signed rounds run with ``flwr run`` (< 1 min)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
if not (shutil.which("openssl") and shutil.which("ssh-keygen")):
    pytest.skip("needs openssl and ssh-keygen", allow_module_level=True)

from coordinator.service import load_or_create_key  # noqa: E402
from edge_agent.config import create_secrets, load_config  # noqa: E402
from edge_agent.state import State  # noqa: E402
from protocols import wire  # noqa: E402
from simulations.broker import free_port, wait_port  # noqa: E402

pytestmark = pytest.mark.integration
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "flower"


def _device(d: Path, i: int, coord_pub: Path) -> dict[str, str]:
    (d / f"dev{i}.csv").write_text("age\n" + "\n".join(str((3 * i + j) % 16) for j in range(20)) + "\n")
    toml = d / f"dev{i}.toml"
    toml.write_text(f'''device_id = "pi-{i}"
state_dir = "{d}/dev{i}"
coordinator_public_key_file = "{coord_pub}"
schedule = "rounds"
[privacy]
epsilon = 1.0
max_round_epsilon = 1.5
[ledger]
total_cap = 100.0
[[dimensions]]
name = "age"
kind = "numeric"
lo = 0.0
hi = 15.0
[[streams]]
name = "age"
dimensions = ["age"]
mechanism = "hybrid"
epsilon = 1.0
[[sources]]
kind = "replay"
path = "{d}/dev{i}.csv"
loop = true
''')
    cfg = load_config(toml)
    return {"device_id": cfg.device_id, "public_key": create_secrets(cfg).public_key_b64}


class _Procs:
    def __init__(self, d: Path, env: dict[str, str]) -> None:
        self.d, self.env, self.procs = d, env, {}

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        log = open(self.d / f"{name}.log", "wb")
        p = subprocess.Popen([str(DEPLOY / args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT,
                             env={**self.env, **env}, start_new_session=True)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.d / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        pids = [p.pid for p in self.procs.values()]
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        # flower-superexec runs in a session of its own, watching its parent: end the ones our processes started
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--parent-pid" in cmd and any(str(pid).encode() in cmd for pid in pids):
                try:
                    os.kill(int(proc.name), signal.SIGTERM)
                except OSError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_loopback_deployment_tls_node_auth(fast_path):
    d = fast_path
    env = {**os.environ, "FLWR_HOME": str(d / "flwr-home"), "NODES": "node1 node2 rogue",
           "FLOWER_APP": str(d / "app")}
    shutil.copytree(DEPLOY / "app", d / "app")
    subprocess.run([str(DEPLOY / "certs.sh"), str(d / "pki")], env=env, check=True, capture_output=True)
    key = load_or_create_key(d / "coordinator.key")
    (d / "coordinator.pub").write_text(wire.public_key_b64(key) + "\n")
    devices = [_device(d, i, d / "coordinator.pub") for i in (1, 2)]
    (d / "devices.json").write_text(json.dumps(devices))
    (d / "params.json").write_text(json.dumps({"streams": {"age": {
        "kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["age"], "bounds": [[0, 15]]}}}))
    port = free_port()
    link = f"127.0.0.1:{port}"
    procs = _Procs(d, env)
    try:
        procs.start("superlink", "superlink.sh", str(d / "pki"), "127.0.0.1", str(port))
        wait_port(port, timeout=60)
        subprocess.run([str(DEPLOY / "connection.sh"), env["FLWR_HOME"], str(d / "pki"), link], env=env, check=True)
        for n in ("node1", "node2"):
            reg = subprocess.run([str(DEPLOY / "register.sh"), str(d / "pki" / f"{n}.key.pub")], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert reg.returncode == 0 and "registered" in reg.stdout, reg.stdout + reg.stderr
        for i, n in ((1, "node1"), (2, "node2")):
            procs.start(n, "supernode.sh", str(d / "pki"), str(d / "pki" / f"{n}.key"), link, str(d / f"dev{i}.toml"),
                        str(free_port()))
        rogue = procs.start("rogue", "supernode.sh", str(d / "pki"), str(d / "pki" / "rogue.key"), link,
                            str(d / "dev1.toml"), str(free_port()), SUPERNODE_MAX_RETRIES="1",
                            SUPERNODE_MAX_WAIT="20")
        run = subprocess.run([str(DEPLOY / "run.sh"), str(d / "params.json"), str(d / "coordinator.sqlite3"),
                              str(d / "coordinator.key"), str(d / "devices.json"), str(d / "out.json"),
                              "rounds=2", "epsilon=3.0", "min-nodes=2", "node-wait=60", "timeout=60",
                              "round-prefix='loop'"], env=env, capture_output=True, text=True, timeout=150)
        assert run.returncode == 0 and (d / "out.json").exists(), run.stdout[-3000:] + run.stderr[-3000:]
        rounds = json.loads((d / "out.json").read_text())
        assert [r["round_id"] for r in rounds] == ["loop-r1", "loop-r2"]
        assert rounds[1]["depends_on"] == ["loop-r1"]
        for r in rounds:
            # exactly the two registered nodes take part; every device report verifies and is stored
            assert (r["nodes_asked"], r["nodes_replied"], r["accepted"], r["rejected"]) == (2, 2, 2, {})
            assert r["device_counters"]["status.answered_clamped"] == 2  # ε 3.0 asked, devices allow 1.5
            assert r["estimates"]["age"]["n"] == 2
        # the unregistered SuperNode is refused at activation and gives up
        assert rogue.wait(60) != 0
        assert "Failed to activate SuperNode" in procs.log("rogue")
    finally:
        procs.stop()
    # each SuperNode's device keeps its own durable ledger
    for i in (1, 2):
        with State(d / f"dev{i}" / "agent.sqlite3") as st:
            rows = list(st.ledger_rows())
            assert {r["round_id"] for r in rows} <= {"loop-r1", "loop-r2"} and 1 <= len(rows) <= 2
            assert st.check_invariants()["ok"] and st.outbox_totals().get("pending") is None
