"""A throwaway MQTT broker on a free loopback port, for demos: mosquitto if installed, else an embedded amqtt.

    broker = start_broker(workdir)           # mosquitto (MQTT 5) or amqtt (MQTT 3.1.1 only)
    ... broker.host, broker.port, broker.protocol ("5" or "3.1.1") ...
    broker.stop()

mosquitto runs with an empty, anonymous, loopback-only configuration written to ``workdir`` (or the one given as
``MosquittoOptions.conf``, e.g. the shipped TLS configuration of :func:`shipped_tls_conf`); amqtt runs in a child
Python process: the interpreter named by ``HAARVEST_AMQTT_PYTHON``, else this one if it can import amqtt, else the
separate environment ``make broker-venv`` creates (``.venv-broker``: amqtt's pins conflict with Flower's, so
``make demo`` never installs it beside haarvest). Both children die with their parent (``PR_SET_PDEATHSIG`` on
Linux), so a demo killed by any signal leaves no broker behind. Both are stopped (SIGTERM,
then SIGKILL) by :meth:`Broker.stop`. amqtt speaks MQTT 3.1.1 only, so clients of an amqtt broker must use 3.1.1
(the coordinator's ``mqtt_protocol="3.1.1"``; the agents' ``protocol = "auto"`` falls back by itself, ``"3.1.1"``
skips the two failed MQTT 5 attempts).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from protocols.errors import BrokerUnavailable

__all__ = ["Broker", "BrokerUnavailable", "MosquittoOptions", "shipped_option", "start_broker", "free_port",
           "wait_port", "mosquitto_path", "amqtt_python", "die_with_parent", "dynsec_plugin", "shipped_tls_conf"]

Kind = Literal["auto", "mosquitto", "amqtt"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it back)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1", proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts connections on ``host:port`` (TimeoutError; RuntimeError if ``proc`` died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the broker exited with status {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def mosquitto_path() -> str | None:
    """The mosquitto executable (PATH, then /usr/sbin where Debian installs it), or None."""
    exe = shutil.which("mosquitto")
    if exe:
        return exe
    return "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None


#: The repository's deploy/ folder (the shipped mosquitto configuration, ACL and dynamic-security state).
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def dynsec_plugin() -> str | None:
    """Where this system's mosquitto dynamic-security plugin is (Debian: /usr/lib/<multiarch>/), or None."""
    found = sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so")) + sorted(
        Path("/usr/lib").glob("mosquitto_dynamic_security.so"))
    return str(found[0]) if found else None


def shipped_option(name: str) -> str:
    """The value of option ``name`` in the shipped broker configuration (deploy/mosquitto/haarvest.conf);
    KeyError if it does not set it."""
    for line in (DEPLOY / "mosquitto" / "haarvest.conf").read_text().splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == name:
            return words[1].strip()
    raise KeyError(f"deploy/mosquitto/haarvest.conf does not set {name}")


def shipped_tls_conf(workdir: Path, pki: Path, port: int, host: str = "127.0.0.1") -> str:
    """deploy/mosquitto/haarvest.conf (TLS, client certificates, the shipped ACL, dynamic security) with local
    paths: the PKI in ``pki`` (``haarvest pki``), a copy of the shipped dynamic-security state in ``workdir``, a
    listener on ``host:port``. Without the dynamic-security plugin the plugin lines are left out (quarantine then
    cannot cut a device off at the broker)."""
    workdir = Path(workdir)
    shutil.copy(DEPLOY / "mosquitto" / "dynamic-security.json", workdir / "dynamic-security.json")
    conf = (DEPLOY / "mosquitto" / "haarvest.conf").read_text()
    plugin = dynsec_plugin()
    if plugin is None:
        conf = "\n".join(ln for ln in conf.splitlines() if not ln.startswith(("plugin ", "plugin_opt_")))
    else:
        conf = conf.replace("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so", plugin)
    conf = (conf.replace("/etc/haarvest/pki", str(pki))
            .replace("/etc/mosquitto/haarvest.acl", str(DEPLOY / "mosquitto" / "haarvest.acl"))
            .replace("/var/lib/mosquitto/", f"{workdir}/")
            .replace("listener 8883", f"listener {port} {host}"))
    return conf


#: The environment ``make broker-venv`` creates for amqtt (relative to the repository).
BROKER_VENV = Path(__file__).resolve().parents[1] / ".venv-broker"


def amqtt_python() -> str | None:
    """An interpreter that can run amqtt: ``HAARVEST_AMQTT_PYTHON``, this one, or ``.venv-broker``'s; else None."""
    env = os.environ.get("HAARVEST_AMQTT_PYTHON")
    if env:
        return env
    if importlib.util.find_spec("amqtt") is not None:
        return sys.executable
    exe = BROKER_VENV / "bin" / "python"
    return str(exe) if exe.exists() else None


def die_with_parent() -> None:
    """Ask Linux to SIGTERM the calling process when its parent dies (a broker child before exec, a demo worker at
    start): nothing is orphaned when the parent is killed outright. A no-op elsewhere."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: stop() still terminates it
        pass


@dataclass
class Broker:
    """A running broker process. ``protocol`` is the newest MQTT version it speaks ("5" or "3.1.1")."""

    kind: str
    host: str
    port: int
    protocol: str
    proc: subprocess.Popen
    workdir: Path
    log_path: Path
    _log: object = field(default=None, repr=False)
    #: the command that started it (:meth:`restart` runs it again)
    cmd: list[str] = field(default_factory=list, repr=False)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def start(self) -> "Broker":
        """Start the broker again with its configuration (a stopped broker only); with persistence on, sessions and
        queued messages survive a :meth:`stop`/:meth:`start`. :class:`BrokerUnavailable` if it does not listen."""
        if self.proc.poll() is None:
            return self
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent)
        _await_listening(self)
        return self

    def restart(self) -> None:
        """:meth:`stop`, then :meth:`start`."""
        self.stop()
        self.start()

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _await_listening(broker: Broker, timeout: float = 10.0) -> None:
    try:
        wait_port(broker.port, timeout=timeout, host=broker.host, proc=broker.proc)
    except (TimeoutError, RuntimeError) as exc:
        broker.stop()
        raise BrokerUnavailable(f"{broker.kind} did not start: {exc} (log: {broker.log_path})") from None


def _start_mosquitto(exe: str, workdir: Path, host: str, port: int, options: "MosquittoOptions") -> Broker:
    conf = workdir / "mosquitto.conf"
    persistence = (["persistence true", f"persistence_location {workdir}/",
                    f"autosave_interval {options.autosave_interval}"]
                   if options.persistence else ["persistence false"])
    if options.conf is None:
        lines = [
            f"listener {port} {host}",
            "allow_anonymous true",
            *persistence,
            f"max_queued_messages {options.max_queued}",
            f"max_inflight_messages {options.max_inflight}",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
        ]
    else:
        lines = [*persistence, options.conf.rstrip("\n")]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        lines.insert(0, "user root")  # as root, mosquitto would otherwise switch to the 'mosquitto' user
    conf.write_text("\n".join(lines) + "\n" + options.extra_conf)
    log_path = workdir / "mosquitto.log"
    log = open(log_path, "ab")
    cmd = [exe, "-c", str(conf)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    broker = Broker("mosquitto", host, port, "5", proc, workdir, log_path, log, cmd)
    _await_listening(broker)
    return broker


@dataclass(frozen=True)
class MosquittoOptions:
    """mosquitto settings of a throwaway broker: ``persistence`` keeps sessions and queued messages across a restart
    (in the broker's work directory), ``max_queued`` messages per offline session, ``max_inflight`` QoS 1/2
    messages per client (0: no limit), and ``extra_conf`` lines appended to the generated mosquitto.conf. With
    persistence, the broker writes its whole state (sessions and every queued message) every ``autosave_interval``
    seconds when something changed: 1 s by default, so that a test's restart finds what was just queued; the
    shipped configuration's value (:func:`shipped_option`) for a run that measures the broker as deployed — a
    save of a million queued reports every second costs the broker more CPU than delivering them.

    ``conf``: a whole configuration (e.g. :func:`shipped_tls_conf`) used instead of the generated listener,
    anonymous-access, queue and log lines (``max_queued``/``max_inflight`` then do not apply); it must open a
    listener on the broker's host and port. The launcher still adds ``user root`` (when run as root), the
    persistence lines and ``extra_conf``."""

    persistence: bool = False
    max_queued: int = 100_000
    max_inflight: int = 100
    autosave_interval: int = 1
    extra_conf: str = ""
    conf: str | None = None


_AMQTT_MAIN = (
    "import sys\n"
    "from amqtt.scripts.broker_script import main\n"
    "sys.argv = ['amqtt', '-c', sys.argv[1]]\n"
    "main()\n"
)


def _start_amqtt(python: str, workdir: Path, host: str, port: int) -> Broker:
    conf = workdir / "amqtt.yaml"
    conf.write_text(
        "listeners:\n"
        "  default:\n"
        "    type: tcp\n"
        f"    bind: {host}:{port}\n"
        "    max_connections: 10000\n"
        "plugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
        "    allow_anonymous: true\n"
    )
    log_path = workdir / "amqtt.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen([python, "-c", _AMQTT_MAIN, str(conf)], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    broker = Broker("amqtt", host, port, "3.1.1", proc, workdir, log_path, log, [python, "-c", _AMQTT_MAIN, str(conf)])
    _await_listening(broker, timeout=20.0)
    return broker


def start_broker(workdir: str | Path, kind: Kind = "auto", host: str = "127.0.0.1", port: int | None = None,
                 options: MosquittoOptions | None = None) -> Broker:
    """Start a broker listening on ``host:port`` (a free port by default) with its files in ``workdir``: the one
    launcher of the demo, the tests and the benchmarks.

    ``kind="auto"``: mosquitto if its executable exists, else amqtt if an interpreter can run it
    (:func:`amqtt_python`); :class:`BrokerUnavailable` (with what to install) when neither is. ``options``
    (:class:`MosquittoOptions`) need mosquitto: with them, amqtt is not a fall-back.
    """
    if kind not in ("auto", "mosquitto", "amqtt"):
        raise ValueError(f"kind must be auto, mosquitto or amqtt, got {kind!r}")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port(host) if port is None else int(port)
    exe = mosquitto_path()
    if kind in ("auto", "mosquitto") and exe is not None:
        return _start_mosquitto(exe, workdir, host, port, options or MosquittoOptions())
    if kind == "mosquitto" or options is not None:
        raise BrokerUnavailable("mosquitto is not installed (apt-get install mosquitto)")
    python = amqtt_python()
    if python is None:
        raise BrokerUnavailable(
            "no MQTT broker available: install mosquitto (apt-get install mosquitto) "
            "or the embedded broker in its own environment (make broker-venv)"
        )
    return _start_amqtt(python, workdir, host, port)
