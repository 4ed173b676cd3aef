"""Ingest through a real mosquitto: round publication, durable ingest, and crash-restart without loss or double count."""

from __future__ import annotations

import gc
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from coordinator import ingest
from coordinator.rounds import RoundManager
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from protocols import wire
from tests.brokers import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STREAMS = ("a", "b", "c")
PARAMS = {"streams": {s: {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 0.5}, "dims": [s],
                          "bounds": [[0, 1]]} for s in STREAMS}}


def publisher(port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{time.monotonic_ns()}", protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(200)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def signed_reports(fleet: SimFleet, round_id: str) -> list[tuple[str, bytes]]:
    out = []
    for stream in STREAMS:
        for dev in fleet.devices:
            out.append(dev.report(round_id, stream, "duchi", {"report": 1}))
    return out


@pytest.fixture
def default_gc_thresholds():
    """CPython's default collector thresholds for the test, the process's own afterwards."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_in_process_ingest_and_round_publication(mosquitto, tmp_path, default_gc_thresholds):
    fleet = SimFleet(50)
    cfg = CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt_port=mosquitto.port, batch_ms=5)
    with Coordinator(cfg) as coord:
        assert gc.get_threshold() == (700, 10, ingest.GC_FULL_AFTER)  # the running worker's full collections are rare
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 1.5, PARAMS)
        # a device sees the retained, signed round
        got: list[bytes] = []
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        sub.on_message = lambda c, u, m: got.append(m.payload)
        sub.connect("127.0.0.1", mosquitto.port)
        sub.subscribe(wire.ROUNDS_CURRENT_TOPIC, qos=1)
        sub.loop_start()
        assert wait_until(lambda: got, 5)
        sub.disconnect()
        sub.loop_stop()
        cfg_round = wire.decode_round(got[0])
        wire.verify_round(cfg_round, wire.load_public_key(coord.public_key))
        assert cfg_round.round_id == "r1"

        reports = signed_reports(fleet, "r1")
        pub = publisher(mosquitto.port)
        for topic, payload in reports:
            pub.publish(topic, payload, qos=1)
        pub.publish(reports[0][0], reports[0][1], qos=1)  # a duplicate
        pub.publish(reports[0][0], b"garbage", qos=1)
        assert wait_until(lambda: coord.metrics.snapshot()["received"] >= len(reports) + 2, 20)
        pub.disconnect()
        pub.loop_stop()
        snap = coord.metrics_snapshot()
        assert snap["accepted"] == len(reports) == snap["stored_reports"]
        assert snap["duplicates"] == 1 and snap["rejected"] == {"malformed": 1}
        est = coord.estimate("r1")
        assert all(e.n == len(fleet) and e.error is None for e in est.values())
        # closing the only open round clears the retained "current" round
        coord.close_round("r1")
        got.clear()
        sub = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        sub.on_message = lambda c, u, m: got.append(m.payload)
        sub.connect("127.0.0.1", mosquitto.port)
        sub.subscribe([(wire.ROUNDS_CURRENT_TOPIC, 1), (wire.round_topic("r1"), 1)])
        sub.loop_start()
        time.sleep(0.5)
        sub.disconnect()
        sub.loop_stop()
        assert got == []


def _start_coordinator(db: Path, key: Path, port: int, log: Path, protocol: str = "3.1.1") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "coordinator", "run", "--db", str(db), "--key", str(key),
         "--mqtt-port", str(port), "--batch-size", "200", "--batch-ms", "10", "--mqtt-protocol", protocol],
        stdout=subprocess.PIPE, stderr=open(log, "ab"), env=env, cwd=ROOT,
    )
    line = proc.stdout.readline()
    assert json.loads(line)["status"] == "ready", line
    return proc


def _stored(db: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute("SELECT device_id, seq FROM reports").fetchall()
    finally:
        conn.close()


def _enrolled_round_reports(db: Path, n_devices: int) -> list[tuple[str, bytes]]:
    """Enrol ``n_devices`` simulated devices in the store at ``db``, open round r1; their signed reports for it."""
    fleet = SimFleet(n_devices)
    store = SQLiteStore(db)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 1.5, PARAMS)
    store.close()
    return signed_reports(fleet, "r1")


def _receiver_pids(coordinator_pid: int) -> list[int]:
    """The coordinator's MQTT receiver process(es)."""
    out = subprocess.run(["pgrep", "-P", str(coordinator_pid), "-f", "coordinator.mqtt_receiver"],
                         capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("victim", ["coordinator", "receiver"])
@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_sigkill_mid_stream_loses_nothing_and_counts_nothing_twice(mosquitto, tmp_path, protocol, victim):
    """SIGKILL mid-stream — the coordinator (its receiver must exit with it; a new coordinator is started) or its
    MQTT receiver process alone (the coordinator restarts it): every report stored once, none rejected."""
    db, key = tmp_path / "coord.db", tmp_path / "coord.key"
    reports = _enrolled_round_reports(db, 700)
    published = {(json.loads(p)["device_id"], json.loads(p)["seq"]) for _, p in reports}

    proc = _start_coordinator(db, key, mosquitto.port, tmp_path / "coord.log", protocol)
    (receiver,) = _receiver_pids(proc.pid)
    pub = publisher(mosquitto.port)
    done = threading.Event()

    def publish_all() -> None:
        for i, (topic, payload) in enumerate(reports):
            pub.publish(topic, payload, qos=1)
            if i % 100 == 99:
                time.sleep(0.02)  # a steady stream, so the kill lands mid-stream
        done.set()

    thread = threading.Thread(target=publish_all)
    thread.start()
    try:
        assert wait_until(lambda: len(_stored(db)) >= 300, 30), "coordinator stored nothing"
        if victim == "coordinator":
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            assert wait_until(lambda: not _alive(receiver), 10), "the receiver outlived its coordinator"
        else:
            os.kill(receiver, signal.SIGKILL)
        killed_at = len(_stored(db))
        assert killed_at < len(reports), "the kill must land mid-stream"
        thread.join(60)
        assert done.is_set()
        if victim == "coordinator":
            proc = _start_coordinator(db, key, mosquitto.port, tmp_path / "coord.log", protocol)
        assert wait_until(lambda: len(_stored(db)) >= len(reports), 60)
        time.sleep(0.5)  # anything still redelivered must be recognised as a duplicate
        rows = _stored(db)
        assert len(rows) == len(set(rows)) == len(reports)
        assert set(rows) == published
        conn = sqlite3.connect(db, timeout=30)
        counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
        conn.close()
        assert counters["accepted"] == len(reports)
        assert set(counters) <= {"accepted", "duplicate"}
        if victim == "receiver":
            assert proc.poll() is None
            assert _receiver_pids(proc.pid) not in ([], [receiver])
            assert "restarting it" in (tmp_path / "coord.log").read_text()
    finally:
        pub.disconnect()
        pub.loop_stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)


def test_sigterm_to_the_process_group_stops_in_order(mosquitto, tmp_path):
    """A service manager signals the whole group: the receiver ignores it, the coordinator stops it in order (what
    was received is committed and acknowledged) and exits 0; nothing is left running."""
    db, key = tmp_path / "coord.db", tmp_path / "coord.key"
    reports = _enrolled_round_reports(db, 200)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "coordinator", "run", "--db", str(db), "--key", str(key),
         "--mqtt-port", str(mosquitto.port), "--mqtt-protocol", "3.1.1"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "coord.log", "ab"), env=env, cwd=ROOT, start_new_session=True)
    assert json.loads(proc.stdout.readline())["status"] == "ready"
    (receiver,) = _receiver_pids(proc.pid)
    pub = publisher(mosquitto.port)
    try:
        for topic, payload in reports:
            pub.publish(topic, payload, qos=1)
        assert wait_until(lambda: len(_stored(db)) >= len(reports), 30)
    finally:
        pub.disconnect()
        pub.loop_stop()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    assert wait_until(lambda: not _alive(receiver), 10)
    assert len(_stored(db)) == len(reports)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_broker_restart_mid_stream(mosquitto, tmp_path, protocol):
    fleet = SimFleet(150)
    reports = signed_reports(fleet, "r1")
    cfg = CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt_port=mosquitto.port, batch_ms=5, mqtt_protocol=protocol)
    with Coordinator(cfg) as coord:
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 1.5, PARAMS)
        pub = publisher(mosquitto.port)
        half = len(reports) // 2
        for topic, payload in reports[:half]:
            pub.publish(topic, payload, qos=1).wait_for_publish(10)
        mosquitto.restart()  # persistent sessions and queued messages survive (persistence on)
        for topic, payload in reports[half:]:
            pub.publish(topic, payload, qos=1)
        assert wait_until(lambda: coord.metrics_snapshot()["stored_reports"] >= len(reports), 30)
        pub.disconnect()
        pub.loop_stop()
        snap = coord.metrics_snapshot()
        assert snap["stored_reports"] == snap["store"]["accepted"] == len(reports)
        assert not snap["rejected"]


class _FlakyStore(SQLiteStore):
    """A store whose commits (and, optionally, reads) fail while ``down`` is set: a full disk, a database outage."""

    down = False
    reads_fail = False
    failures = 0

    def commit_batch(self, reports, counters, aggregate=None):
        if self.down:
            self.failures += 1
            raise sqlite3.OperationalError("injected: database or disk is full")
        return super().commit_batch(reports, counters, aggregate)

    def _exec(self, sql, args=(), commit=False):
        if self.down and self.reads_fail:
            raise sqlite3.OperationalError("injected: unable to open database file")
        return super()._exec(sql, args, commit)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
@pytest.mark.parametrize("reads_fail", [False, True], ids=["commit-fails", "store-down"])
def test_store_outage_stalls_ingest_and_loses_nothing(mosquitto, tmp_path, protocol, reads_fail):
    """While the store fails, a batch is retried — never dropped or acknowledged — and nothing later is processed
    (a dropped batch would stay unacknowledged in the broker while later seqs raise the high-water marks past it:
    its redelivery would be rejected as a replay; and more than the broker's in-flight window of stranded messages
    stops delivery). /healthz says stalled. When the store is back every report is stored exactly once."""
    import urllib.error
    import urllib.request

    fleet = SimFleet(30)
    store = _FlakyStore(tmp_path / "c.db")
    store.reads_fail = reads_fail
    cfg = CoordinatorConfig(db=str(tmp_path / "c.db"), mqtt_port=mosquitto.port, batch_ms=5, batch_size=10,
                            mqtt_protocol=protocol, http_port=0)
    coord = Coordinator(cfg, store=store).start()
    pub = publisher(mosquitto.port)
    try:
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 1.5, PARAMS)
        reports = signed_reports(fleet, "r1")  # per device: seq 1, 2, 3 across the three streams
        store.down = True
        for topic, payload in reports[:30]:  # stream a: every device's seq 1
            pub.publish(topic, payload, qos=1)
        assert wait_until(lambda: store.failures >= 2 or coord.ingest.metrics.failed_attempts >= 2, 10)
        for topic, payload in reports[30:]:  # later seqs of the same devices arrive during the outage
            pub.publish(topic, payload, qos=1)
        time.sleep(0.5)
        health = f"{coord.api.url}/healthz"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(health, timeout=5)
        assert err.value.code == 503 and json.loads(err.value.read())["status"] == "stalled"
        store.down = False
        assert wait_until(lambda: len(list(store.iter_reports())) == len(reports), 30)
        time.sleep(0.5)
        stored = [(r.device_id, r.seq) for r in store.iter_reports()]
        assert len(stored) == len(set(stored)) == len(reports)
        counters = store.counters()
        assert counters["accepted"] == len(reports) and not counters.get("seq_regression")
        with urllib.request.urlopen(health, timeout=5) as resp:
            assert json.loads(resp.read())["status"] == "ok"
    finally:
        pub.disconnect()
        pub.loop_stop()
        coord.stop()


class _SlowStore(SQLiteStore):
    """A store that takes ``delay`` seconds per commit: a coordinator far behind a deep queue."""

    delay = 0.5

    def commit_batch(self, reports, counters, aggregate=None):
        time.sleep(self.delay)
        return super().commit_batch(reports, counters, aggregate)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_a_deep_queue_does_not_hold_up_the_start_or_the_round_publications(mosquitto, tmp_path, protocol):
    """A coordinator restarted on a deep queue of reports (its persistent session kept them) must subscribe,
    republish its rounds and publish a new one while it drains — not exit. Its MQTT receiver's network thread once
    waited for the coordinator's commits inside paho's message callback, so the SUBACK and the PUBACKs of round
    publications queued behind the drain ("could not subscribe … in 10.0s", "publish … not confirmed") and the
    coordinator exited and restarted over and over (the fleet-scale bench); here the drain takes ~30 s, the timeouts
    are 10 s."""
    fleet = SimFleet(200)
    db = tmp_path / "c.db"
    cfg = CoordinatorConfig(db=str(db), mqtt_port=mosquitto.port, batch_ms=5, batch_size=10, mqtt_protocol=protocol)
    with Coordinator(cfg) as coord:  # registers the persistent session, opens the round
        coord.import_devices(fleet.enrollment())
        coord.open_round("r1", 1.5, PARAMS)
    reports = signed_reports(fleet, "r1")[:600]
    pub = publisher(mosquitto.port)
    infos = [pub.publish(topic, payload, qos=1) for topic, payload in reports]
    for info in infos:
        info.wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()
    store = _SlowStore(db)
    coord = Coordinator(cfg, store=store).start()  # raised TimeoutError before: SUBACK / PUBACK behind the drain
    try:
        coord.open_round("r2", 1.5, PARAMS)  # published (and confirmed) while the queue drains
        assert store.counters().get("accepted", 0) < len(reports)  # the drain was still going on
    finally:
        coord.ingest.stop(drain=False)
        coord.close()
    store = SQLiteStore(db)
    assert {r["round_id"]: r["status"] for r in store.rounds()} == {"r1": "open", "r2": "open"}
    store.close()
