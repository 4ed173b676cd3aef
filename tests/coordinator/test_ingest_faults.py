"""The coordinator's MQTT receiver process under faults: a broker that is down, bad TLS files, a receiver that dies
just before a stop, a publish while a batch keeps failing to commit."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from coordinator.ingest import IngestSettings, IngestWorker
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from simulations.broker import free_port

pytestmark = [pytest.mark.fault, pytest.mark.integration]


def _children() -> list[str]:
    return subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "coordinator.mqtt_receiver"], capture_output=True,
                          text=True).stdout.split()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def _worker(tmp_path, **settings) -> IngestWorker:
    store = SQLiteStore(tmp_path / "coord.db")
    return IngestWorker(IngestSettings(**settings), store, Validator(store))


@pytest.mark.parametrize("protocol", ["5", "3.1.1", "auto"])
def test_broker_down_at_start_times_out_promptly_and_leaves_nothing_running(tmp_path, protocol):
    worker = _worker(tmp_path, port=free_port(), protocol=protocol)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="could not subscribe"):
        worker.start(wait=2)
    assert time.monotonic() - t0 < 8
    assert _children() == []


def test_bad_tls_file_raises_in_the_coordinator(tmp_path):
    worker = _worker(tmp_path, port=free_port(), tls_ca=str(tmp_path / "missing-ca.pem"))
    with pytest.raises((FileNotFoundError, OSError)):
        worker.start(wait=5)
    assert _children() == []


def test_a_receiver_dying_before_it_subscribes_is_reported(tmp_path, monkeypatch):
    worker = _worker(tmp_path, port=free_port())
    monkeypatch.setattr("coordinator.ingest.sys.executable", "/bin/false")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        worker.start(wait=10)
    assert time.monotonic() - t0 < 5


def test_stop_right_after_the_receiver_died_is_prompt(mosquitto, tmp_path):
    worker = _worker(tmp_path, port=mosquitto.port, protocol="3.1.1")
    worker.start()
    os.kill(worker._run.link.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    worker.stop()
    assert time.monotonic() - t0 < 5
    assert _children() == []


def _client(port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def _stuck_worker(tmp_path, port: int, **settings) -> tuple[IngestWorker, mqtt.Client]:
    """A started worker whose store refuses every commit, with one report already in its retry loop; and the
    publisher that sent it."""
    worker = _worker(tmp_path, port=port, protocol="3.1.1", **settings)
    failing = threading.Event()

    def refuse(*args, **kwargs):
        failing.set()
        raise OSError("disk full")

    worker.store.commit_batch = refuse
    worker.start()
    pub = _client(port)
    pub.publish("haarvest/v1/reports/d1", b"{}", qos=1).wait_for_publish(5)
    assert failing.wait(10)
    return worker, pub


def test_publish_is_confirmed_while_a_batch_keeps_failing(mosquitto, tmp_path):
    """Publish confirmations do not queue behind a batch the store refuses (it is retried meanwhile)."""
    got = []
    sub = _client(mosquitto.port)
    sub.on_message = lambda c, u, m: got.append(m.payload)
    sub.subscribe("test/round", qos=1)
    worker, pub = _stuck_worker(tmp_path, mosquitto.port)
    try:
        t0 = time.monotonic()
        worker.publish("test/round", b"round-config", retain=True, timeout=5)
        assert time.monotonic() - t0 < 3
    finally:
        worker.stop(drain=False)
        for client in (sub, pub):
            client.disconnect()
            client.loop_stop()
    assert wait_for(lambda: b"round-config" in got)


def test_a_draining_stop_gives_up_on_a_batch_the_store_refuses(mosquitto, tmp_path):
    """The receiver waits ``drain_timeout`` for the commit; then the batch is abandoned (not acknowledged)."""
    worker, pub = _stuck_worker(tmp_path, mosquitto.port, drain_timeout=1.0)
    try:
        t0 = time.monotonic()
        worker.stop()
        assert time.monotonic() - t0 < 6
    finally:
        pub.disconnect()
        pub.loop_stop()
    assert _children() == []


def test_auto_protocol_keeps_mqtt5_after_a_connection_dropped_before_connack(tmp_path):
    """A broker going down (one connection closed without CONNACK, then nothing listening) is not taken for a
    broker that refuses MQTT 5: once an MQTT 5 broker is back, the receiver uses MQTT 5."""
    import socket
    from pathlib import Path

    from tests.brokers import Mosquitto

    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()

    def accept_once_and_go_down():
        conn, _ = server.accept()
        time.sleep(0.3)
        conn.close()
        server.close()

    threading.Thread(target=accept_once_and_go_down, daemon=True).start()
    worker = _worker(tmp_path, port=port, protocol="auto")
    worker.start(wait=0)
    time.sleep(5)  # longer than the 3 s CONNACK timeout, with the broker down
    broker = Mosquitto(Path(tmp_path) / "broker", port=port).start()
    try:
        assert worker._run.subscribed.wait(15)
        assert worker.protocol == 5
    finally:
        worker.stop()
        broker.stop()


def test_a_restart_voids_the_reservations_of_a_batch_validated_ahead_and_abandoned(tmp_path):
    """The validate thread reserves batch k+1 while batch k commits; a stop that abandons k+1 leaves its
    reservations in the worker's validator. The next start reloads the validator from the store, so the broker's
    redelivery of k+1 is accepted and stored — not taken for a duplicate (receipted as stored, never stored)."""
    import types

    from coordinator.rounds import RoundManager
    from coordinator.simfleet import SimFleet
    from protocols import catalogue, wire

    worker = _worker(tmp_path, port=free_port())
    fleet = SimFleet(3)
    for rec in fleet.enrollment():
        worker.store.upsert_device(rec["device_id"], rec["public_key"])
    params = {"streams": {"a": {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 0.5}, "dims": ["a"],
                                "bounds": [[0, 1]]}}}
    RoundManager(worker.store, wire.generate_signing_key()).open_round("r1", 1.5, params)
    worker.validator.reload()
    duchi = catalogue.build("duchi", epsilon=0.5)
    batch = fleet.reports("r1", "a", "duchi", [1] * 3, duchi)
    with pytest.raises(TimeoutError):  # a first run (no broker here: it stops at once)
        worker.start(wait=1)
    ahead = worker._check(types.SimpleNamespace(epoch=0), batch)  # validated ahead in that run, then abandoned
    assert len(ahead.accepted) == 3
    with pytest.raises(TimeoutError):  # the next run starts from the store's state
        worker.start(wait=1)
    again = worker._check(types.SimpleNamespace(epoch=0), batch)
    assert len(again.accepted) == 3 and again.duplicates == 0
