"""A Raspberry Pi rehearsal on this machine (``make pi-rehearsal``; needs root, ≈ 7 min the first time).

What it does, in order (docs: deploy/README.md, *Rehearsing a Pi install*):

1. **Tools.** ``mmdebstrap``, ``qemu-user-static`` and ``binfmt-support`` (installed with apt when missing),
   ``binfmt_misc`` mounted and ``qemu-aarch64`` enabled, so arm64 programs run under qemu user-mode emulation.
2. **An arm64 Debian bookworm root** built by ``mmdebstrap`` from the apt mirror this machine is configured with
   (with python3, python3-venv, ca-certificates), cached as a tarball (``--cache``; ``--rebuild`` makes it again)
   and unpacked fresh for every run. The host's trusted CA certificates, pip settings (``/etc/pip.conf``,
   ``/etc/xdg/pip``, ``PIP_*``) and DNS configuration are carried into it, or pip there cannot reach the index.
   The build host has no thermal sensor, so the root gets a fake ``/sys/class/thermal/thermal_zone0/temp``
   (48 °C), as a Pi has; ``/proc`` is the host's.
3. **Host side.** A PKI (``haarvest pki``: CA, broker, ``coordinator`` and device certificates), mosquitto with
   the shipped TLS configuration and ACL on a free loopback port, and a coordinator (MQTT over TLS as
   ``coordinator``).
4. **deploy/pi/install.sh in the root** (chroot, emulated), exactly as on a Pi but with ``--no-systemd`` (no init
   system in a chroot): system user, venv with pip-installed haarvest (aarch64 wheels from the index), config,
   TLS files, enrolment, ``check-config``. Timed.
5. **The agent** (``haarvest agent run`` as the ``haarvest`` user, emulated) against the host broker; the
   coordinator enrols it from the enrolment JSON install.sh wrote and opens ``--rounds`` rounds built from the
   device's own ``round_params`` (``check-config``). Each round must be answered (every stream stored).
6. **Figures:** install time, the agent's start-up time (start to MQTT connection) and peak RSS under emulation,
   time from a round's publication to its last stored report, per report; printed as JSON and written to
   ``OUT/rehearsal.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulations.broker import Broker

REPO = Path(__file__).resolve().parents[2]
DEVICE = "pi-rehearsal"
PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,passwd,util-linux"


def say(msg: str) -> None:
    print(f"pi-rehearsal: {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


# ------------------------------------------------------------------------------------------------ tools


def ensure_tools() -> None:
    if os.geteuid() != 0:
        raise SystemExit("pi-rehearsal: needs root (mmdebstrap, chroot, binfmt_misc)")
    need = [pkg for exe, pkg in (("mmdebstrap", "mmdebstrap"), ("qemu-aarch64-static", "qemu-user-static"),
                                 ("update-binfmts", "binfmt-support"), ("mosquitto", "mosquitto"))
            if shutil.which(exe) is None and not Path(f"/usr/sbin/{exe}").exists()]
    if need:
        say(f"installing {' '.join(need)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", *need], env=env, stdout=subprocess.DEVNULL)
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)])
    if not (binfmt / "qemu-aarch64").exists():
        run(["update-binfmts", "--enable", "qemu-aarch64"])
    if "enabled" not in (binfmt / "qemu-aarch64").read_text():
        raise SystemExit("pi-rehearsal: qemu-aarch64 is registered but disabled in binfmt_misc")


def apt_mirror() -> str:
    """The first Debian mirror this machine's apt uses (deb822 or one-line sources), else deb.debian.org."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split(":", 1)[1].split()[0]
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["deb"] and "security" not in line:
                return next(p for p in parts[1:] if "://" in p)
    return "http://deb.debian.org/debian"


# ------------------------------------------------------------------------------------------------ root


def root_tarball(cache: Path, rebuild: bool) -> Path:
    tar = cache / "bookworm-arm64.tar"
    if tar.exists() and not rebuild:
        say(f"using the cached arm64 root {tar} (--rebuild to make it again)")
        return tar
    cache.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror()
    say(f"building an arm64 bookworm root with mmdebstrap from {mirror} (≈ 4–5 min)")
    t0 = time.monotonic()
    run(["mmdebstrap", "--arch=arm64", "--variant=apt", "--format=tar", f"--include={PACKAGES}", "bookworm",
         str(tar) + ".part", mirror], stdout=subprocess.DEVNULL)
    os.replace(str(tar) + ".part", tar)
    say(f"root built in {time.monotonic() - t0:.0f} s")
    return tar


def prepare_root(tar: Path, root: Path) -> None:
    """Unpack the root and carry the host's trust, pip settings and DNS into it; a fake thermal zone."""
    root.mkdir(parents=True)
    with tarfile.open(tar) as tf:
        if hasattr(tarfile, "fully_trusted_filter"):  # a root file system: devices, absolute links, owners
            tf.extractall(root, filter="fully_trusted")
        else:
            tf.extractall(root)
    for src in ("/etc/ssl/certs/ca-certificates.crt", "/etc/resolv.conf", "/etc/pip.conf"):
        if Path(src).exists():
            dst = root / src.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst, follow_symlinks=True)
    if Path("/etc/xdg/pip").is_dir():
        shutil.copytree("/etc/xdg/pip", root / "etc/xdg/pip", dirs_exist_ok=True)
    zone = root / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "temp").write_text("48000\n")
    (zone / "type").write_text("cpu-thermal\n")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.split(b"\0")
    dest = root / "opt/src/haarvest"
    for rel in filter(None, files):
        src = REPO / rel.decode()
        if src.is_file():
            (dest / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel.decode())


class Mounts:
    """/proc (and /dev) bind-mounted into the root while in use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: list[Path] = []

    def __enter__(self) -> "Mounts":
        for src, args in (("/proc", ["--bind"]), ("/dev", ["--bind"])):
            dst = self.root / src.lstrip("/")
            dst.mkdir(parents=True, exist_ok=True)
            run(["mount", *args, src, str(dst)])
            self.done.append(dst)
        return self

    def __exit__(self, *exc: object) -> None:
        for dst in reversed(self.done):
            subprocess.run(["umount", "-l", str(dst)], check=False)


def chroot_env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
    keep.pop("PIP_FIND_LINKS", None)  # host-only wheel directories
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "HOME": "/root", **keep}


# ------------------------------------------------------------------------------------------------ host side


def host_side(work: Path, port: int) -> tuple[Any, Broker, Path]:
    """PKI, mosquitto with the shipped TLS configuration, and a coordinator connected over TLS."""
    from coordinator.pki import coordinator_key, init_ca, issue_certificate
    from coordinator.service import Coordinator, CoordinatorConfig
    from simulations.broker import MosquittoOptions, shipped_tls_conf, start_broker

    pki = work / "pki"
    init_ca(pki)
    issue_certificate(pki, "broker", pki, server=True, hosts=["127.0.0.1", "localhost"])
    issue_certificate(pki, "coordinator", pki / "clients")
    issue_certificate(pki, DEVICE, pki / "clients")
    coordinator_key(work / "coordinator.key")
    broker_dir = work / "broker"
    broker_dir.mkdir()
    broker = start_broker(broker_dir, "mosquitto", port=port,
                          options=MosquittoOptions(conf=shipped_tls_conf(broker_dir, pki, port)))
    clients = pki / "clients"
    coord = Coordinator(CoordinatorConfig(
        db=str(work / "coordinator.db"), key_file=str(work / "coordinator.key"), mqtt_host="127.0.0.1",
        mqtt_port=port, client_id="coordinator", mqtt_tls_ca=str(pki / "ca.crt"),
        mqtt_tls_cert=str(clients / "coordinator.crt"), mqtt_tls_key=str(clients / "coordinator.key"),
        http_port=None)).start()
    return coord, broker, pki


# ------------------------------------------------------------------------------------------------ rehearsal


def rehearse(args: argparse.Namespace) -> dict[str, Any]:
    from protocols.contract import parse_round_params
    from simulations.broker import free_port

    ensure_tools()
    tar = root_tarball(Path(args.cache), args.rebuild)
    work = Path(tempfile.mkdtemp(prefix="haarvest-pi-", dir=args.workdir))
    root = work / "root"
    out: dict[str, Any] = {"root": str(root), "mirror": apt_mirror()}
    say(f"unpacking the root into {root}")
    prepare_root(tar, root)
    port = free_port()
    coord, broker, pki = host_side(work, port)
    agent: subprocess.Popen | None = None
    try:
        with Mounts(root):
            staged = root / "tmp/pki"
            staged.mkdir(parents=True, exist_ok=True)
            for name in ("ca.crt", f"clients/{DEVICE}.crt", f"clients/{DEVICE}.key"):
                shutil.copy(pki / name, staged / Path(name).name)
            say("running deploy/pi/install.sh in the root under emulation (≈ 2 min)")
            t0 = time.monotonic()
            res = subprocess.run(
                ["chroot", str(root), "/opt/src/haarvest/deploy/pi/install.sh", "--device-id", DEVICE,
                 "--broker", "127.0.0.1", "--port", str(port), "--ca", "/tmp/pki/ca.crt",
                 "--cert", f"/tmp/pki/{DEVICE}.crt", "--key", f"/tmp/pki/{DEVICE}.key",
                 "--coordinator-pubkey", coord.public_key, "--no-systemd"],
                env=chroot_env(), capture_output=True, text=True)
            out["install_seconds"] = round(time.monotonic() - t0, 1)
            (work / "install.log").write_text(res.stdout + res.stderr)
            if res.returncode != 0:
                raise RuntimeError(f"install.sh failed (exit {res.returncode}); log: {work / 'install.log'}\n"
                                   + res.stderr[-3000:])
            say(f"install.sh done in {out['install_seconds']} s")
            haarvest = ["chroot", str(root), "runuser", "-u", "haarvest", "--", "/opt/haarvest/venv/bin/haarvest"]
            check = subprocess.run([*haarvest, "agent", "check-config", "--config", "/etc/haarvest/agent.toml"],
                                   env=chroot_env(), capture_output=True, text=True)
            if check.returncode != 0:
                raise RuntimeError(f"check-config in the root failed: {check.stdout[-2000:]}{check.stderr[-2000:]}")
            summary = json.loads(check.stdout)
            out["check_config_warnings"] = summary["warnings"]
            params = parse_round_params(summary["round_params"])
            enrolment = json.loads((root / "etc/haarvest/enrollment.json").read_text())
            coord.import_devices([enrolment])
            log = open(work / "agent.log", "wb")
            agent = subprocess.Popen([*haarvest, "agent", "run", "--config", "/etc/haarvest/agent.toml",
                                      "--max-rounds", str(args.rounds)], env=chroot_env(), stdout=log,
                                     stderr=subprocess.STDOUT)
            t0, peak = time.monotonic(), 0
            while b'"event":"mqtt_connected"' not in (work / "agent.log").read_bytes():
                peak = max(peak, tree_rss_kib(agent.pid))
                if agent.poll() is not None or time.monotonic() - t0 > args.round_timeout:
                    raise RuntimeError(f"the agent did not connect (exit {agent.poll()}); log: {work / 'agent.log'}")
                time.sleep(0.05)
            out["agent_start_seconds"] = round(time.monotonic() - t0, 1)
            say(f"agent connected to the host broker over TLS {out['agent_start_seconds']} s after it was started")
            out["rounds"] = []
            for r in range(args.rounds):
                rid = f"pi{r + 1}"
                t0 = time.monotonic()
                coord.open_round(rid, params.epsilon, params, protocol="pi-rehearsal")
                want = len(params.streams)
                while sum(coord.store.report_counts(rid).values()) < want:
                    peak = max(peak, tree_rss_kib(agent.pid))
                    if time.monotonic() - t0 > args.round_timeout:
                        raise RuntimeError(f"round {rid}: {sum(coord.store.report_counts(rid).values())}/{want} "
                                           f"reports after {args.round_timeout} s; agent log: {work / 'agent.log'}")
                    time.sleep(0.05)
                took = time.monotonic() - t0
                coord.close_round(rid)
                out["rounds"].append({"round": rid, "reports": want, "seconds": round(took, 2),
                                      "seconds_per_report": round(took / want, 3)})
                say(f"round {rid}: {want}/{want} reports stored {took:.1f} s after it was published")
            agent.wait(60)
            out["agent_exit"] = agent.returncode
            out["agent_peak_rss_mib"] = round(peak / 1024, 1)
            per_report = sorted(r["seconds_per_report"] for r in out["rounds"])
            out["median_seconds_per_report"] = per_report[len(per_report) // 2]
            out["reports_stored"] = sum(sum(coord.store.report_counts(r["round"]).values()) for r in out["rounds"])
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        coord.close()
        broker.stop(timeout=10)
    (Path(args.out) / "rehearsal.json").write_text(json.dumps(out, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def tree_rss_kib(pid: int) -> int:
    """Resident memory (VmRSS, KiB) of ``pid``'s process tree: the emulated agent below chroot/runuser."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - tree
        tree |= frontier
    best = 0
    for p in tree:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    best = max(best, int(line.split()[1]))
        except OSError:
            pass
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pi-rehearsal", description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=str(REPO / ".cache" / "pi-rehearsal"),
                   help="where the arm64 root tarball is kept (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="build the arm64 root again even if it is cached")
    p.add_argument("--workdir", default=None, help="parent of the run's work directory (default: the system's)")
    p.add_argument("--rounds", type=int, default=3, help="rounds the agent answers (default %(default)s)")
    p.add_argument("--round-timeout", type=float, default=300.0,
                   help="seconds a round may take under emulation (default %(default)s)")
    p.add_argument("--out", default=".", help="directory for rehearsal.json (default: the current one)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (root, logs, databases)")
    args = p.parse_args(argv)
    try:
        out = rehearse(args)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        say(f"failed: {exc}")
        return 1
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
