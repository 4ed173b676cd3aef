"""The shipped mosquitto configuration, with certificates from `haarvest pki`, on a real broker.

A device may publish only to its own report topic; a client without a certificate cannot connect at all.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from coordinator import pki
from simulations.broker import MosquittoOptions, free_port, mosquitto_path, start_broker
from tests.brokers import shipped_tls_conf

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture
def tls_broker(tmp_path):
    if mosquitto_path() is None:
        pytest.skip("mosquitto not installed")
    ca = tmp_path / "pki"
    pki.init_ca(ca)
    pki.issue_certificate(ca, "broker", ca, server=True, hosts=["localhost", "127.0.0.1"])
    for cn in ("coordinator", "coordinator-rounds", "dev-1", "dev-2"):
        pki.issue_certificate(ca, cn, ca / "clients")
    port = free_port()
    conf = shipped_tls_conf(tmp_path, ca, port)
    with start_broker(tmp_path, "mosquitto", port=port, options=MosquittoOptions(conf=conf)):
        yield port, ca


def _client(port: int, ca: Path, cn: str | None) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"t-{cn}-{time.monotonic_ns()}", protocol=mqtt.MQTTv5)
    if cn is None:
        c.tls_set(ca_certs=str(ca / "ca.crt"))
    else:
        c.tls_set(
            ca_certs=str(ca / "ca.crt"),
            certfile=str(ca / "clients" / f"{cn}.crt"),
            keyfile=str(ca / "clients" / f"{cn}.key"),
        )
    return c


@pytest.mark.integration
def test_device_confined_to_own_topic(tls_broker):
    port, ca = tls_broker
    got: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    coord = _client(port, ca, "coordinator")
    coord.on_message = lambda c, u, m: got.append((m.topic, m.payload))
    coord.on_subscribe = lambda *a: subscribed.set()
    coord.connect("127.0.0.1", port)
    coord.loop_start()
    coord.subscribe("haarvest/v1/reports/#", qos=1)
    assert subscribed.wait(10)

    dev = _client(port, ca, "dev-1")
    dev.connect("127.0.0.1", port)
    dev.loop_start()
    dev.publish("haarvest/v1/reports/dev-2", b"spoofed", qos=1).wait_for_publish(10)
    dev.publish("haarvest/v1/reports/dev-1", b"own", qos=1).wait_for_publish(10)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    for c in (dev, coord):
        c.loop_stop()
        c.disconnect()
    assert got == [("haarvest/v1/reports/dev-1", b"own")]


@pytest.mark.integration
def test_client_without_certificate_is_refused(tls_broker):
    port, ca = tls_broker
    c = _client(port, ca, None)
    with pytest.raises((ssl.SSLError, OSError)):
        c.connect("127.0.0.1", port)
        # some OpenSSL versions only fail the handshake on the first read
        for _ in range(20):
            rc = c.loop(0.2)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                raise OSError(f"connection dropped: {rc}")
        if c.is_connected():
            pytest.fail("a client without a certificate connected")
        raise OSError("not connected")


def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not available")
    haarvest = Path(sys.executable).parent / "haarvest"
    for unit in (DEPLOY / "systemd").glob("*.service"):
        text = unit.read_text().replace("/opt/haarvest/venv/bin/haarvest", str(haarvest))
        (tmp_path / unit.name).write_text(text)
        res = subprocess.run([analyze, "verify", str(tmp_path / unit.name)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert "Type=notify" in text or "coordinator" in unit.name
    agent = (DEPLOY / "systemd" / "haarvest-agent.service").read_text()
    assert "WatchdogSec=" in agent and "Restart=always" in agent and "time-sync" not in agent.split("[Service]")[0].replace("# Deliberately not ordered after time-sync.target", "")
