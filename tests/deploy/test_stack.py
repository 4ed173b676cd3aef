"""deploy/stack/up.sh: mosquitto with the shipped TLS config and ACL, the coordinator and 3 agents (real TLS, one
client certificate and state directory each) on free loopback ports; two rounds through the coordinator CLI;
estimates exist, every report was accepted exactly once; down.sh stops everything.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from simulations.broker import free_port

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deploy" / "stack"
HAARVEST = Path(sys.executable).parent / "haarvest"
N_AGENTS = 3
STREAMS = ("cpu", "mem", "load")

pytestmark = pytest.mark.integration


def _need_mosquitto() -> None:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()):
        pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does this)")


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            parts = shlex.split(value)
            out[key] = parts[0] if parts else ""
    return out


def _hv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    res = subprocess.run([str(HAARVEST), *args], capture_output=True, text=True, timeout=timeout, cwd="/")
    assert res.returncode == 0, f"haarvest {' '.join(args)}: {res.stderr}"
    return res


def _get(url: str, token_file: str) -> bytes:
    token = Path(token_file).read_text().strip()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback test server
        return resp.read()


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _diagnostics(work: Path, env: dict[str, str]) -> str:
    out = [json.dumps(json.loads(_get(env["HTTP_URL"] + "/api/metrics", env["API_TOKEN_FILE"])))]
    for log in sorted(work.rglob("*.log")):
        out.append(f"--- {log.relative_to(work)}\n" + "\n".join(log.read_text().splitlines()[-15:]))
    for conf in sorted(work.glob("agents/*/agent.toml")):
        res = subprocess.run([str(HAARVEST), "agent", "status", "-c", str(conf)], capture_output=True, text=True)
        out.append(f"--- status {conf.parent.name}\n{res.stdout[-3000:]}")
    return "\n".join(out)


def _sent_rows(state_db: Path) -> set[tuple[int, str, str]]:
    con = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=30)
    try:
        return {(s, r, st) for s, r, st in con.execute("SELECT seq, round_id, stream FROM outbox WHERE status='sent'")}
    finally:
        con.close()


@pytest.fixture
def stack(tmp_path):
    _need_mosquitto()
    work = tmp_path / "stack"
    ports = {"--tls-port": free_port(), "--http-port": free_port()}
    cmd = ["bash", str(STACK / "up.sh"), "--work", str(work), "--agents", str(N_AGENTS), "--haarvest", str(HAARVEST),
           "--timeout", "45"]
    for opt, port in ports.items():
        cmd += [opt, str(port)]
    up = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stderr + "".join(
            f"\n--- {p}\n{p.read_text()[-2000:]}" for p in work.rglob("*.log"))
        yield work, _read_env(work / "stack.env")
    finally:
        down = subprocess.run(["bash", str(STACK / "down.sh"), "--work", str(work), "--timeout", "20"],
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0 or not (work / "stack.env").exists(), down.stderr


def test_stack_two_rounds_over_tls(stack):
    work, env = stack
    db, key, conf = env["DB"], env["KEY"], env["COORD_CONF"]
    devices = env["AGENTS"].split()
    assert devices == [f"dev-{i}" for i in range(1, N_AGENTS + 1)]
    # the devices connected with their own certificates (mosquitto logs the CN it took as user name)
    broker_log = (work / "mosquitto" / "mosquitto.log").read_text()
    for dev in devices:
        assert f"as {dev} (" in broker_log and f"u'{dev}'" in broker_log
    assert json.loads(_hv("coordinator", "devices", "--db", db).stdout)[0]["status"] == "active"

    pki = work / "pki"
    # the broker has no anonymous listener: only the TLS one, where every client presents a certificate
    assert "allow_anonymous false" in (work / "mosquitto" / "mosquitto.conf").read_text()
    # the coordinator's own certificate (CN "coordinator") on the devices' TLS listener, as the shipped ACL expects
    tls = ["--mqtt-host", "127.0.0.1", "--mqtt-port", env["TLS_PORT"], "--mqtt-ca", str(pki / "ca.crt"),
           "--mqtt-cert", str(pki / "clients" / "coordinator.crt"), "--mqtt-key", str(pki / "clients" / "coordinator.key")]
    # publishing rounds with the ingest's certificate is refused before anything changes (one cert, one session)
    refused = subprocess.run([str(HAARVEST), "coordinator", "rounds", "close", "--db", db, "--key", key, *tls,
                              "--id", "r0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "rounds_cert" in refused.stderr and refused.stderr.count("\n") == 1
    tls += ["--rounds-cert", str(pki / "clients" / "coordinator-rounds.crt"),
            "--rounds-key", str(pki / "clients" / "coordinator-rounds.key")]
    for r, rid in enumerate(("r1", "r2")):
        if r == 0:  # with the stack's coordinator.toml (TLS, the coordinator's certificate)
            _hv("coordinator", "rounds", "open", "--config", conf, "--id", rid,
                "--epsilon", env["ROUND_EPSILON"], "--params", "@" + env["ROUND_PARAMS"])
        else:  # over TLS with the coordinator's client certificate; published at once (the running coordinator
            # looks up a round it does not know in the store: test_round_opened_elsewhere_is_known_to_the_validator)
            _hv("coordinator", "rounds", "close", "--db", db, "--key", key, *tls, "--id", "r1")
            _hv("coordinator", "rounds", "open", "--db", db, "--key", key, *tls, "--id", rid,
                "--epsilon", env["ROUND_EPSILON"], "--params", "@" + env["ROUND_PARAMS"])
        want = (r + 1) * N_AGENTS * len(STREAMS)
        try:
            _wait(lambda: json.loads(_get(env["HTTP_URL"] + "/api/metrics", env["API_TOKEN_FILE"]))["stored_reports"] >= want, 45,
                  f"{want} stored reports after round {rid}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnostics(work, env)}") from None

    metrics = json.loads(_get(env["HTTP_URL"] + "/api/metrics", env["API_TOKEN_FILE"]))
    assert metrics["accepted"] == metrics["stored_reports"] == 2 * N_AGENTS * len(STREAMS)
    assert metrics["rejected_total"] == 0 and metrics["devices"] == N_AGENTS
    bounds = {"cpu": (0, 100), "mem": (0, 100), "load": (0, 8)}
    for rid in ("r1", "r2"):
        est = json.loads(_hv("coordinator", "estimate", rid, "--db", db, "--json").stdout)
        assert set(est) == set(STREAMS)
        for stream, e in est.items():
            lo, hi = bounds[stream]
            assert e["n"] == N_AGENTS and not e.get("error")
            assert lo <= e["ci_low"][0] <= e["estimate"][0] <= e["ci_high"][0] <= hi
    page = _get(env["HTTP_URL"] + "/", env["API_TOKEN_FILE"]).decode()
    with pytest.raises(urllib.error.HTTPError) as denied:  # the API is locked: no token, no data
        urllib.request.urlopen(env["HTTP_URL"] + "/api/metrics", timeout=10)  # noqa: S310
    assert denied.value.code == 401
    assert "r1" in page and "r2" in page and "<svg" in page

    # every stored report is one of an agent's acknowledged outbox rows, and vice versa
    exported = _hv("coordinator", "export", "--db", db).stdout.splitlines()
    stored = {(rep["device_id"], rep["seq"]) for rep in map(json.loads, exported)}
    assert len(stored) == len(exported)
    sent: set[tuple[str, int]] = set()
    for dev in devices:
        conf = work / "agents" / dev / "agent.toml"
        rows = _sent_rows(work / "agents" / dev / "state" / "agent.sqlite3")
        assert {(r, s) for _, r, s in rows} == {(r, s) for r in ("r1", "r2") for s in STREAMS}
        sent |= {(dev, seq) for seq, _, _ in rows}
        status = subprocess.run([str(HAARVEST), "agent", "status", "-c", str(conf)], capture_output=True, text=True,
                                timeout=60, cwd="/")
        assert status.returncode == 0, status.stderr
        st = json.loads(status.stdout)
        assert st["invariants"]["ok"] and st["spent_total"] <= st["caps"]["total"]
        assert 0 < st["spent_total"] <= 2 * len(STREAMS) * 1.0 + 1e-9  # memo hits cost nothing
        assert "pending" not in st["outbox"] or st["outbox"]["pending"]["count"] == 0
    assert stored == sent

    # a second up.sh on the running stack refuses instead of starting a second set of processes
    pids = [int(p) for p in (env["MOSQUITTO_PID"], env["COORDINATOR_PID"], *env["AGENT_PIDS"].split())]
    assert len(pids) == 2 + N_AGENTS and all(_alive(p) for p in pids)
    again = subprocess.run(["bash", str(STACK / "up.sh"), "--work", str(work), "--haarvest", str(HAARVEST)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "running" in again.stderr
    down = subprocess.run(["bash", str(STACK / "down.sh"), "--work", str(work)], capture_output=True, text=True,
                          timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(p) for p in pids)
    for dev in devices:  # SIGTERM: the agents drained and stopped cleanly
        assert '"event":"stopped"' in (work / "agents" / dev / "agent.log").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_prepare_only_matches_shipped_config(tmp_path):
    """What compose's "init" service runs: certificates, broker config, agent configs and enrolment, no process."""
    work = tmp_path / "w"
    res = subprocess.run(["bash", str(STACK / "up.sh"), "--prepare-only", "--work", str(work), "--agents", "2",
                          "--bind", "0.0.0.0", "--broker-host", "mosquitto", "--haarvest", str(HAARVEST)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    conf = (work / "mosquitto" / "mosquitto.conf").read_text()
    shipped = (REPO / "deploy" / "mosquitto" / "haarvest.conf").read_text()
    for line in ("require_certificate true", "use_identity_as_username true", "tls_version tlsv1.2",
                 "per_listener_settings false", "max_queued_messages 100000"):
        assert line in shipped and line in conf
    assert "listener 8883 0.0.0.0" in conf and conf.count("\nlistener ") == 1  # no anonymous listener
    coord = (work / "coordinator" / "coordinator.toml").read_text()
    assert 'mqtt_host = "127.0.0.1"' in coord and "mqtt_port = 8883" in coord and "coordinator.crt" in coord
    # --bind exposes the broker only: the API stays on loopback (--http-bind), behind a token file of mode 0600
    assert 'http_host = "127.0.0.1"' in coord and "api-token" in coord
    assert (work / "coordinator" / "api-token").stat().st_mode & 0o777 == 0o600
    assert "mosquitto_dynamic_security.so" in conf and (work / "mosquitto" / "data" / "dynamic-security.json").exists()
    assert not any(l.startswith("persistence_location") for l in shipped.splitlines())  # Debian's mosquitto.conf sets it; a second one stops the broker
    assert "persistence true" in conf
    assert (REPO / "deploy" / "mosquitto" / "haarvest.acl").read_text() in (work / "mosquitto" / "haarvest.acl").read_text()
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((work / "pki" / "broker.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "mosquitto" in san.get_values_for_type(x509.DNSName)
    for dev in ("dev-1", "dev-2"):
        out = _hv("agent", "check-config", "-c", str(work / "agents" / dev / "agent.toml"), "--no-source-check")
        summary = json.loads(out.stdout)
        assert summary["secrets"] == "ok" and summary["mqtt"].startswith("mosquitto:8883")
        assert set(summary["streams"]) == set(STREAMS)
    devices = json.loads(_hv("coordinator", "devices", "--db", str(work / "coordinator" / "coordinator.db")).stdout)
    assert [d["device_id"] for d in devices] == ["dev-1", "dev-2"]
    params = json.loads((work / "round.json").read_text())
    assert set(params["streams"]) == set(STREAMS)
    assert not any(work.rglob("*.pid"))


def test_compose_file_consistent_with_script():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((STACK / "compose.yaml").read_text())
    services = compose["services"]
    init = services["init"]["command"]
    assert init[:3] == ["bash", "deploy/stack/up.sh", "--prepare-only"]
    usage = subprocess.run(["bash", str(STACK / "up.sh"), "--help"], capture_output=True, text=True).stdout
    for opt in (o for o in init if o.startswith("--")):
        assert opt in usage, opt
    n_agents = int(init[init.index("--agents") + 1])
    agents = sorted(s for s in services if s.startswith("dev-"))
    assert agents == [f"dev-{i}" for i in range(1, n_agents + 1)]
    for name in agents:
        assert services[name]["command"] == ["haarvest", "agent", "run", "--config", f"/stack/agents/{name}/agent.toml"]
    coord = services["coordinator"]
    assert coord["network_mode"] == "service:mosquitto"
    cmd = coord["command"]
    assert cmd == ["haarvest", "coordinator", "run", "--config", "/stack/coordinator/coordinator.toml"]
    assert init[init.index("--work") + 1] == "/stack"
    run_help = subprocess.run([str(HAARVEST), "coordinator", "run", "--help"], capture_output=True, text=True).stdout
    for opt in (o for o in cmd if o.startswith("--")):
        assert opt in run_help, opt
    assert services["mosquitto"]["command"] == ["mosquitto", "-c", "/stack/mosquitto/mosquitto.conf"]
    tls_port = init[init.index("--tls-port") + 1]
    assert f"{tls_port}:{tls_port}" in services["mosquitto"]["ports"]
    dockerfile = (STACK / "Dockerfile").read_text()
    assert "COPY deploy deploy" in dockerfile and "pip install" in dockerfile


def _documented_commands(text: str) -> list[list[str]]:
    """Every `haarvest …` command line in shell code (continuations joined, variables replaced by a word)."""
    import re

    text = re.sub(r"\\\n\s*#?\s*", " ", text)  # continuations, also inside comment blocks
    text = text.replace("\\$", "$")  # \$VAR inside here-documents
    out = []
    for line in text.splitlines():
        line = line.split(" #")[0]
        line = re.sub(r"\d*[<>]+&?\s*\S*", " ", line)  # redirections
        for part in re.split(r"\|\||&&|;|\||&", line):
            part = part.replace("$HAARVEST", "haarvest")
            part = re.sub(r'"?\$\{?[A-Za-z_]+\}?"?', "1", part)  # ports, paths, ids: any word
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            idx = [i for i, w in enumerate(words) if w == "haarvest" or w.endswith("/bin/haarvest")]
            idx = [i for i in idx if i + 1 < len(words) and words[i + 1] in ("agent", "coordinator", "pki")]
            if idx:
                out.append(words[idx[0] + 1:])
    return out


def test_documented_commands_parse():
    """Every haarvest command in deploy/README.md, the compose file, up.sh and the agent unit parses with the CLI."""
    from haarvest.cli import build_parser

    parser = build_parser()
    sources = {p: p.read_text() for p in (REPO / "deploy" / "README.md", STACK / "compose.yaml", STACK / "up.sh",
                                          REPO / "deploy" / "systemd" / "haarvest-agent.service",
                                          REPO / "deploy" / "systemd" / "haarvest-coordinator.service",
                                          REPO / "deploy" / "systemd" / "coordinator.toml.example")}
    seen = 0
    for path, text in sources.items():
        for argv in _documented_commands(text.replace("@/", "/").replace("ExecStart=", " ")):
            try:
                parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"{path.name}: `haarvest {' '.join(argv)}` does not parse")
            seen += 1
    assert seen >= 29


def test_coordinator_unit_execstart_parses():
    from haarvest.cli import build_parser

    unit = (REPO / "deploy" / "systemd" / "haarvest-coordinator.service").read_text()
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart="))[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the unit's ExecStart does not parse: {argv}")
    from coordinator.run_config import load_options

    # the file it names, as shipped (deploy/systemd/coordinator.toml.example), is a valid configuration
    assert argv[argv.index("--config") + 1] == "/etc/haarvest/coordinator.toml"
    assert load_options(REPO / "deploy" / "systemd" / "coordinator.toml.example").mqtt_cert is not None
