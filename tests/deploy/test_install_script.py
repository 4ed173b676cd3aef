"""deploy/pi/install.sh in a fake root (no systemd, no useradd): virtual environment with the local source tree,
config skeleton, TLS files, device identity, systemd unit — `haarvest agent check-config` passes on the result,
and a second run keeps the identity and the configuration.

The test venv is created from the current interpreter without pip; a ``.pth`` file exposes this interpreter's
site-packages to it, so `pip install --no-deps` of the source tree downloads nothing but (if this interpreter's
setuptools cannot build wheels by itself) the build backend.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from coordinator import pki
from edge_agent.config import load_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "pi" / "install.sh"
EXAMPLE = REPO / "deploy" / "pi" / "agent.toml.example"
PACKAGES = ("protocols", "edge_agent", "coordinator", "simulations", "haarvest")


def _thermal_zone() -> bool:
    for t in Path("/sys/class/thermal").glob("thermal_zone*/temp"):
        try:
            t.read_text()
            return True
        except OSError:
            continue
    return False


def _offline_build_possible() -> bool:
    """True when this interpreter's setuptools builds wheels without downloading anything (≥70.1 or `wheel`)."""
    if importlib.util.find_spec("wheel") is not None:
        return True
    try:
        from importlib.metadata import version

        major, minor = (int(p) for p in version("setuptools").split(".")[:2])
        return (major, minor) >= (70, 1)
    except Exception:  # noqa: BLE001
        return False


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("cwd", "/")
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=240, **kw)


@pytest.fixture(scope="module")
def install(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pi")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = next(venv.glob("lib/python3*/site-packages"))
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_haarvest_test_parent.pth").write_text("".join(f"{p}\n" for p in paths))

    ca = tmp / "pki"
    pki.init_ca(ca)
    pki.issue_certificate(ca, "pi-test", ca / "clients")
    coord_pub = pki.coordinator_key(tmp / "coordinator.key")
    (tmp / "coordinator.pub").write_text(coord_pub + "\n")

    pip = ["--pip-option=--no-deps"]
    if _offline_build_possible():
        pip += ["--pip-option=--no-index", "--pip-option=--no-build-isolation"]
    root = tmp / "root"
    args = ["--root", str(root), "--no-systemd", "--no-useradd", "--venv", str(venv), "--device-id", "pi-test",
            "--broker", "127.0.0.1", "--port", "18883", "--ca", str(ca / "ca.crt"),
            "--cert", str(ca / "clients" / "pi-test.crt"), "--key", str(ca / "clients" / "pi-test.key"),
            "--coordinator-pubkey", str(tmp / "coordinator.pub"), *pip, str(src)]
    res = _run(args)
    if res.returncode != 0 and "pip" in res.stderr and (
        "No matching distribution found for setuptools" in res.stderr or "NewConnectionError" in res.stderr
    ):
        pytest.skip("no package index to fetch the build backend (setuptools/wheel) from")
    assert res.returncode == 0, res.stderr[-4000:]
    return {"tmp": tmp, "root": root, "venv": venv, "result": res, "coord_pub": coord_pub, "args": args}


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_fresh_install_layout(install):
    root, venv = install["root"], install["venv"]
    etc, state = root / "etc" / "haarvest", root / "var" / "lib" / "haarvest"
    assert _mode(etc) == 0o750 and _mode(state) == 0o700
    assert _mode(etc / "agent.toml") == 0o640
    assert _mode(etc / "device.key.pem") == 0o600
    assert _mode(state / "device.key") == 0o600 and _mode(state / "hmac.secret") == 0o600
    for name in ("ca.crt", "device.crt"):
        assert (etc / name).read_bytes() == (install["tmp"] / "pki" / ("ca.crt" if name == "ca.crt" else
                                                                      "clients/pi-test.crt")).read_bytes()
    assert (etc / "coordinator.pub").read_text().strip() == install["coord_pub"]
    enrol = json.loads((etc / "enrollment.json").read_text())
    assert enrol["device_id"] == "pi-test" and enrol["algorithm"] == "ed25519" and len(enrol["public_key"]) == 44
    # the package really is installed in the venv (not the editable checkout)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import edge_agent; print(edge_agent.__file__)"],
                         capture_output=True, text=True, check=True, cwd=install["tmp"]).stdout
    assert str(venv) in out


def test_installed_config_passes_check_config(install):
    root, venv = install["root"], install["venv"]
    conf = root / "etc" / "haarvest" / "agent.toml"
    res = subprocess.run([str(venv / "bin" / "haarvest"), "agent", "check-config", "-c", str(conf)],
                         capture_output=True, text=True, timeout=60, cwd=install["tmp"])
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["ok"] and summary["secrets"] == "ok" and summary["warnings"] == []
    assert summary["device_id"] == "pi-test"
    assert summary["mqtt"].startswith("127.0.0.1:18883")
    expected = {"cpu", "mem", "load"} | ({"temp"} if _thermal_zone() else set())
    assert set(summary["streams"]) == expected
    cfg = load_config(conf)
    assert cfg.mqtt is not None and cfg.mqtt.tls and cfg.mqtt.cert_file == root / "etc/haarvest/device.crt"
    assert cfg.state_dir == root / "var/lib/haarvest"
    assert cfg.coordinator_key() is not None


def test_unit_installed(install):
    root, venv = install["root"], install["venv"]
    unit = root / "etc" / "systemd" / "system" / "haarvest-agent.service"
    text = unit.read_text()
    assert f"ExecStart={venv}/bin/haarvest agent run --config {root}/etc/haarvest/agent.toml" in text
    unit_section = text.split("[Service]")[0]
    assert not [ln for ln in unit_section.splitlines() if "time-sync" in ln and not ln.startswith("#")]
    assert "Type=notify" in text and "WatchdogSec=" in text
    analyze = shutil.which("systemd-analyze")
    if analyze:
        res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr


def test_second_run_keeps_identity_and_config(install):
    root, tmp = install["root"], install["tmp"]
    etc = root / "etc" / "haarvest"
    before_key = (root / "var/lib/haarvest/device.key").read_bytes()
    before_conf = (etc / "agent.toml").read_text()
    pub = json.loads((etc / "enrollment.json").read_text())["public_key"]
    res = _run(["--root", str(root), "--no-systemd", "--no-useradd", "--venv", str(install["venv"]), "--skip-pip",
                "--broker", "10.1.2.3"])
    assert res.returncode == 0, res.stderr
    assert (root / "var/lib/haarvest/device.key").read_bytes() == before_key
    assert json.loads((etc / "enrollment.json").read_text())["public_key"] == pub
    after_conf = (etc / "agent.toml").read_text()
    assert 'host = "10.1.2.3"' in after_conf and 'device_id = "pi-test"' in after_conf
    assert after_conf == before_conf.replace('host = "127.0.0.1"', 'host = "10.1.2.3"')
    assert not (etc / "agent.toml.bak").exists()
    # another device id on the same config is refused instead of silently ignored
    res = _run(["--root", str(root), "--no-systemd", "--no-useradd", "--venv", str(install["venv"]), "--skip-pip",
                "--device-id", "pi-other"])
    assert res.returncode == 1 and "--force-config" in res.stderr
    assert (tmp / "root").exists()


def test_hmac_identity_enrolment_is_private(install, tmp_path):
    """``--signature hmac-sha256``: the enrolment JSON holds the HMAC report key, so it is written 0600."""
    root = tmp_path / "root"
    res = _run(["--root", str(root), "--no-systemd", "--no-useradd", "--venv", str(install["venv"]), "--skip-pip",
                "--device-id", "pi-mac", "--signature", "hmac-sha256"])
    assert res.returncode == 0, res.stderr[-4000:]
    enrol_file = root / "etc" / "haarvest" / "enrollment.json"
    enrol = json.loads(enrol_file.read_text())
    assert enrol["algorithm"] == "hmac-sha256" and enrol["public_key"].startswith("hmac-sha256:")
    assert _mode(enrol_file) == 0o600


def test_bad_arguments(tmp_path):
    res = _run(["--no-such-option"])
    assert res.returncode == 2 and "unknown option" in res.stderr
    base = ["--root", str(tmp_path / "r"), "--no-useradd", "--skip-pip"]
    for extra, msg in ((["--device-id", "bad/id"], "must match"), (["--port", "70000"], "1..65535"),
                       (["--cert", str(SCRIPT)], "together"), (["--broker", "a b"], "not a host name")):
        res = _run(base + extra)
        assert res.returncode == 1 and msg in res.stderr, (extra, res.stderr)


def test_example_config_is_valid():
    cfg = load_config(EXAMPLE)
    dims = {d.name: (d.lo, d.hi, d.source) for d in cfg.dimensions}
    assert dims == {"cpu": (0.0, 100.0, "cpu_percent"), "mem": (0.0, 100.0, "mem_percent"),
                    "temp": (20.0, 90.0, "temp_c"), "load": (0.0, 8.0, "load1")}
    assert [s.kind for s in cfg.sources] == ["system"]
    assert cfg.mqtt is not None and cfg.mqtt.tls and cfg.mqtt.port == 8883 and cfg.mqtt.cert_file is not None
    # one round may ask every stream for its ε
    assert cfg.privacy.max_round_epsilon >= sum(cfg.privacy.epsilon for _ in cfg.effective_streams())


def test_shellcheck():
    sc = shutil.which("shellcheck")
    if sc is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    scripts = [SCRIPT, *sorted((REPO / "deploy" / "stack").glob("*.sh"))]
    res = subprocess.run([sc, "-S", "warning", *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_requires_root_without_no_useradd(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root")
    res = _run(["--root", str(tmp_path / "r"), "--skip-pip"])
    assert res.returncode == 1 and "run as root" in res.stderr
