"""The agent over TLS with a client certificate, against the shipped mosquitto config and ACL (from `haarvest pki`)."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pytest

from edge_agent.agent import Agent
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from protocols import wire
from tests.deploy.test_tls_acl import _client, tls_broker  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_agent_reports_over_tls_with_client_certificate(tls_broker):  # noqa: F811
    port, ca = tls_broker
    coord_key = wire.generate_signing_key()
    ident = new_identity()
    cfg = simple_config(
        "dev-1", ca.parent / "agent-state", [numeric("cpu", 0, 100)],
        mqtt={"receipts": False, "host": "localhost", "port": port, "tls": True, "ca_file": str(ca / "ca.crt"),
              "cert_file": str(ca / "clients" / "dev-1.crt"), "key_file": str(ca / "clients" / "dev-1.key"),
              "protocol": "5", "reconnect_min_s": 1, "reconnect_max_s": 2},
        coordinator_public_key=wire.public_key_b64(coord_key),
    )
    got: list[wire.Report] = []
    status: list[bytes] = []
    subscribed = threading.Event()
    coord = _client(port, ca, "coordinator")

    def on_message(_c, _u, m):
        if m.topic.startswith("haarvest/v1/status/"):
            status.append(m.payload)
            return
        rep = wire.decode_report(m.payload)
        wire.verify_report(rep, m.topic, ident.signing_key.public_key())
        got.append(rep)

    coord.on_message = on_message
    coord.on_subscribe = lambda *a: subscribed.set()
    coord.connect("127.0.0.1", port)
    coord.loop_start()
    coord.subscribe([("haarvest/v1/reports/#", 1), ("haarvest/v1/status/#", 1)])
    assert subscribed.wait(10)
    agent = Agent(cfg, CallableSource(lambda: {"cpu": 42.0}), secrets=ident).open()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not agent.transport.connected.is_set():
            agent.step()
            time.sleep(0.02)
        assert agent.transport.connected.is_set()
        rc = wire.sign_round(wire.RoundConfig(round_id="tls-1", protocol="t", epsilon=1.0), coord_key)
        coord.publish(wire.ROUNDS_CURRENT_TOPIC, rc.to_bytes(), qos=1, retain=True).wait_for_publish(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (got and agent.state.pending_count() == 0):
            agent.step()
            time.sleep(0.02)
        assert [(r.device_id, r.round_id, r.seq) for r in got] == [("dev-1", "tls-1", 0)]
        assert any(b'"online"' in s for s in status)
    finally:
        agent.close(drain_timeout=2)
        coord.disconnect()
        coord.loop_stop()
