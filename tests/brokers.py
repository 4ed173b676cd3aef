"""Spawn a real mosquitto on a free loopback port for integration tests (and stop/restart it on demand)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from simulations.broker import DEPLOY, dynsec_plugin, free_port, wait_port  # noqa: F401 - re-exported
from simulations.broker import shipped_tls_conf as _shipped_tls_conf


def wait_until(pred, timeout: float, poll: float = 0.05) -> bool:
    """Poll ``pred`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll)
    return bool(pred())


def shipped_tls_conf(tmp: Path, ca: Path, port: int) -> str:
    """:func:`simulations.broker.shipped_tls_conf`; the test skips without the dynamic-security plugin."""
    if dynsec_plugin() is None:
        pytest.skip("mosquitto's dynamic-security plugin is not installed")
    return _shipped_tls_conf(tmp, ca, port)


class Mosquitto:
    """A mosquitto process with persistence in ``workdir``; ``restart()`` keeps sessions and queued messages."""

    def __init__(self, workdir: Path, port: int | None = None, extra_conf: str = "") -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does this)")
        self.exe = exe
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.conf = self.workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            # tests run as root with 0700 temp dirs: keep mosquitto from dropping to the mosquitto user
            "user root\n"
            "persistence true\n"
            f"persistence_location {self.workdir}/\n"
            "autosave_interval 1\n"
            "max_queued_messages 100000\n"
            "log_dest stderr\n"
            "log_type error\n" + extra_conf
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mosquitto":
        log = open(self.workdir / "mosquitto.log", "ab")
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stdout=log, stderr=log)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()
