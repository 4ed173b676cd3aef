"""Spawn a real mosquitto on a free loopback port for integration tests (and stop/restart it on demand)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from simulations.broker import Broker, MosquittoOptions, dynsec_plugin, free_port, mosquitto_path, start_broker
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
    """A mosquitto with persistence in ``workdir`` (:func:`simulations.broker.start_broker`); ``restart()`` keeps
    sessions and queued messages. The test skips when mosquitto is not installed."""

    def __init__(self, workdir: Path, port: int | None = None, extra_conf: str = "") -> None:
        if mosquitto_path() is None:
            pytest.skip("mosquitto is not installed (apt-get install mosquitto; .ci/run does this)")
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.options = MosquittoOptions(persistence=True, extra_conf=extra_conf)
        self.broker: Broker | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        return None if self.broker is None or self.broker.proc.poll() is not None else self.broker.proc

    def start(self) -> "Mosquitto":
        if self.broker is None:
            self.broker = start_broker(self.workdir, "mosquitto", port=self.port, options=self.options)
        else:
            self.broker.start()
        return self

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    def restart(self) -> None:
        """:meth:`simulations.broker.Broker.restart` (starts the broker if it never ran)."""
        if self.broker is None:
            self.start()
        else:
            self.broker.restart()


@pytest.fixture
def mosquitto(tmp_path):
    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()
