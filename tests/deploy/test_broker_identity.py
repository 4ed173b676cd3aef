"""On the shipped mosquitto configuration with TLS client certificates from `haarvest pki`: a client id is
bound to the certificate's identity (``use_identity_as_username`` + ``use_username_as_clientid``), so an enrolled
device cannot take over or wipe another client's session, and the broker refuses payloads above the coordinator's
cap. Each test fails on a configuration without the binding (or without ``message_size_limit``)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from coordinator import pki
from protocols.wire import MAX_PAYLOAD as MAX_PAYLOAD_BYTES
from simulations.broker import Broker, MosquittoOptions, free_port, mosquitto_path, start_broker
from tests.brokers import shipped_tls_conf

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IDENTITIES = ("coordinator", "coordinator-rounds", "dev-1", "dev-2")

pytestmark = pytest.mark.integration


class TlsBroker:
    def __init__(self, tmp_path: Path) -> None:
        if mosquitto_path() is None:
            pytest.skip("mosquitto not installed")
        self.tmp = tmp_path
        self.ca = tmp_path / "pki"
        pki.init_ca(self.ca)
        pki.issue_certificate(self.ca, "broker", self.ca, server=True, hosts=["localhost", "127.0.0.1"])
        for cn in IDENTITIES:
            pki.issue_certificate(self.ca, cn, self.ca / "clients")
        self.port = free_port()
        self.options = MosquittoOptions(persistence=True, conf=shipped_tls_conf(tmp_path, self.ca, self.port))
        self.broker: Broker | None = None

    def start(self) -> TlsBroker:
        if self.broker is None:
            self.broker = start_broker(self.tmp, "mosquitto", port=self.port, options=self.options)
        else:
            self.broker.start()
        return self

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    def client(self, cn: str, client_id: str, *, clean: bool = False, on_message=None) -> mqtt.Client:
        """A connected MQTT 5 client with ``cn``'s certificate asking for ``client_id``."""
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=str(self.ca / "ca.crt"), certfile=str(self.ca / "clients" / f"{cn}.crt"),
                  keyfile=str(self.ca / "clients" / f"{cn}.key"))
        connected = threading.Event()
        c.on_connect = lambda *a: connected.set()
        if on_message is not None:
            c.on_message = on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        c.connect("127.0.0.1", self.port, clean_start=clean, properties=props)
        c.loop_start()
        assert connected.wait(10), f"{cn} could not connect"
        return c


@pytest.fixture
def broker(tmp_path):
    b = TlsBroker(tmp_path).start()
    try:
        yield b
    finally:
        b.stop()


def _close(*clients: mqtt.Client) -> None:
    for c in clients:
        c.disconnect()
        c.loop_stop()


def test_a_device_cannot_wipe_the_coordinators_session(broker):
    """A device certificate connecting with the coordinator's client id and clean start: the coordinator's queued
    reports survive (without the client-id binding the broker would drop all of them)."""
    got: list[bytes] = []
    coord = broker.client("coordinator", "haarvest-coordinator", clean=True)
    coord.subscribe("haarvest/v1/reports/+", qos=1)
    time.sleep(0.3)
    _close(coord)  # persistent session: the broker queues reports for it
    dev = broker.client("dev-1", "dev-1")
    for i in range(9):
        dev.publish("haarvest/v1/reports/dev-1", f"r{i}".encode(), qos=1).wait_for_publish(5)
    for asked in ("haarvest-coordinator", "coordinator"):  # whatever id it asks for, it gets its own
        attacker = broker.client("dev-2", asked, clean=True)
        _close(attacker)
    coord = broker.client("coordinator", "haarvest-coordinator", on_message=lambda c, u, m: got.append(m.payload))
    deadline = time.monotonic() + 10
    while len(got) < 9 and time.monotonic() < deadline:
        time.sleep(0.05)
    _close(coord, dev)
    assert sorted(got) == sorted(f"r{i}".encode() for i in range(9))


def test_a_device_cannot_kick_another_device(broker):
    """dev-2 asking for dev-1's client id does not disconnect dev-1."""
    drops = threading.Event()
    victim = broker.client("dev-1", "dev-1")
    victim.on_disconnect = lambda *a: drops.set()
    attacker = broker.client("dev-2", "dev-1", clean=True)
    assert not drops.wait(1.5)
    assert victim.is_connected()
    _close(attacker, victim)


def test_the_broker_refuses_payloads_above_the_coordinators_cap(broker):
    """message_size_limit = the coordinator's MAX_PAYLOAD_BYTES: a larger publish never reaches the coordinator."""
    conf = (DEPLOY / "mosquitto" / "haarvest.conf").read_text()
    limit = int(re.search(r"^message_size_limit (\d+)", conf, re.M).group(1))
    assert limit == MAX_PAYLOAD_BYTES
    got: list[int] = []
    coord = broker.client("coordinator", "coordinator", on_message=lambda c, u, m: got.append(len(m.payload)))
    coord.subscribe("haarvest/v1/reports/+", qos=1)
    time.sleep(0.3)
    dev = broker.client("dev-1", "dev-1")
    dev.publish("haarvest/v1/reports/dev-1", b"x" * (limit + 1), qos=1)
    dev.publish("haarvest/v1/reports/dev-1", b"y" * 100, qos=1).wait_for_publish(5)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    _close(coord, dev)
    # the broker drops the oversized report (and disconnects its sender: paho re-sends its in-flight QoS 1
    # messages on reconnect, so the small one may arrive more than once — at-least-once)
    assert got and set(got) == {100}


PARAMS = {"streams": {"cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0},
                              "dims": ["cpu"], "bounds": [[0, 100]]}}}


def test_a_flooding_device_is_quarantined_at_the_broker_while_others_are_stored(broker):
    """A bounded flood (≤ 20,000 junk messages, ≤ 10 s, loopback) from one enrolled device: the coordinator
    quarantines it — the broker then refuses its publishes (dynamic-security) — and a legitimate device's reports
    sent during the flood are all stored, and its report on a stream outside its contract is rejected as
    ``off_contract``. Fails without the flood guard (nothing is quarantined) or the contract."""
    from coordinator.service import device_rows
    from coordinator.service import Coordinator, CoordinatorConfig
    from coordinator.simfleet import SimDevice
    from protocols import wire
    from tests.brokers import wait_until

    flooder, honest = (SimDevice(d, wire.generate_device_key("ed25519")) for d in ("dev-1", "dev-2"))
    clients = broker.ca / "clients"
    coord = Coordinator(CoordinatorConfig(
        db=str(broker.tmp / "c.db"), mqtt_port=broker.port, client_id="coordinator", mqtt_tls_ca=str(broker.ca / "ca.crt"),
        mqtt_tls_cert=str(clients / "coordinator.crt"), mqtt_tls_key=str(clients / "coordinator.key"),
        flood_max_messages=2000, flood_max_rejections=500, flood_window_s=60))
    for dev in (flooder, honest):
        coord.enroll(dev.device_id, dev.public_key, streams=["cpu"])
    coord.start()
    for i in range(5):
        coord.open_round(f"r{i}", 1.0, PARAMS)
    flood = broker.client("dev-1", "dev-1")
    good = broker.client("dev-2", "dev-2")
    try:
        sent, t0 = 0, time.monotonic()
        while sent < 20_000 and time.monotonic() - t0 < 10:
            if flood.is_connected():
                flood.publish("haarvest/v1/reports/dev-1", b"{junk", qos=0)
            sent += 1
            if sent % 4000 == 0:  # the legitimate device reports in the middle of the flood
                good.publish(*honest.report(f"r{sent // 4000 - 1}", "cpu", "hybrid", {"report": 57}), qos=1)
        # off-contract: dev-2 was enrolled for "cpu" only; a "temp" report is rejected with its own reason
        good.publish(*honest.report("r0", "temp", "hybrid", {"report": 57}), qos=1)
        assert wait_until(lambda: coord.store.reports_by_device().get("dev-2") == 5, 30), coord.metrics_snapshot()
        assert wait_until(lambda: coord.store.device_records()["dev-1"]["status"] == "quarantined", 10)
        # the broker now refuses dev-1 (it was disconnected and comes back): a QoS 1 publish is not authorized
        codes: list = []
        flood.on_publish = lambda c, u, mid, rc, props: codes.append(rc)
        assert wait_until(lambda: flood.is_connected(), 10)
        assert wait_until(lambda: (flood.publish("haarvest/v1/reports/dev-1", b"{junk", qos=1) and False)
                          or any(getattr(rc, "value", 0) == 0x87 for rc in codes), 10, poll=0.5), codes
        rows = {r["device_id"]: r for r in device_rows(coord.store)}
        assert rows["dev-1"]["status"] == "quarantined" and rows["dev-1"]["quarantines"] == 1
        assert rows["dev-1"]["rejected"]["malformed"] >= 500 and rows["dev-2"]["stored_reports"] == 5
        assert wait_until(lambda: coord.store.device_counters().get("dev-2", {}).get("off_contract") == 1, 10)
        rows = {r["device_id"]: r for r in device_rows(coord.store)}
        assert rows["dev-2"]["status"] == "active" and rows["dev-2"]["rejected"] == {"off_contract": 1}
        assert rows["dev-2"]["receipted_reports"] == 6  # 5 stored + 1 rejected for good: none is re-sent
        reached = coord.metrics_snapshot()["received"]
        print(f"flood: {sent} sent in {time.monotonic() - t0:.1f} s, {reached} reached ingest")
        assert reached < sent  # the broker stopped forwarding dev-1's flood once it was cut off
    finally:
        _close(flood, good)
        coord.close()
