"""Coordinator ingest throughput through a real mosquitto, against the broker's raw rate for the same payloads.

Measured in one run, on one spawned mosquitto (persistence on, loopback):

* **raw, mosquitto_pub** — ``mosquitto_pub -l -q 1`` publishing the signed report lines, ``mosquitto_sub -q 1 -C N``
  counting them: the rate of the broker path with C clients at both ends;
* **raw, paho** — the same payloads on their per-device topics from a paho (Python) publisher, mosquitto_sub counting;
* **coordinator, drain** — the reports are queued in the coordinator's persistent session while it is offline,
  then it starts: validate (decode, topic binding, registry, Ed25519 signature, round, replay) + durable SQLite
  commit + PUBACK after commit, from the first message to the last commit;
* **coordinator, live** — the paho publisher and the coordinator run at the same time (end to end).

Ratios are coordinator rate / raw mosquitto_pub rate (the brief's target is ≥ 50 %) and / raw paho rate.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from coordinator.rounds import RoundManager
from coordinator.service import Coordinator, CoordinatorConfig
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from protocols import wire

STREAMS = ("s0", "s1", "s2", "s3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Broker:
    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            raise RuntimeError("mosquitto is not installed")
        self.port = _free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                        f"persistence_location {workdir}/\nmax_queued_messages 1000000\nmax_inflight_messages 0\n"
                        "log_dest stderr\nlog_type error\n")
        self.proc = subprocess.Popen([exe, "-c", str(conf)], stderr=open(workdir / "log", "ab"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _params() -> dict:
    return {"streams": {s: {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 0.25}, "dims": [s],
                            "bounds": [[0, 100]]} for s in STREAMS}}


def _reports(fleet: SimFleet, round_id: str) -> list[tuple[str, bytes]]:
    body = {"report": -2.0408}  # a Duchi report, ε = 0.25 (the value does not matter to ingest)
    return [dev.report(round_id, s, "duchi", body) for s in STREAMS for dev in fleet.devices]


def _sub_counter(port: int, n: int) -> subprocess.Popen:
    proc = subprocess.Popen(["mosquitto_sub", "-p", str(port), "-t", wire.REPORTS_WILDCARD, "-q", "1", "-C", str(n)],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc


def _raw_mosquitto_pub(port: int, payloads: list[bytes], work: Path) -> float:
    lines = work / "lines.txt"
    lines.write_bytes(b"\n".join(payloads) + b"\n")
    sub = _sub_counter(port, len(payloads))
    t0 = time.perf_counter()
    with open(lines, "rb") as fh:
        subprocess.run(["mosquitto_pub", "-p", str(port), "-t", wire.report_topic("raw"), "-q", "1", "-l"],
                       stdin=fh, check=True)
    sub.wait(300)
    return len(payloads) / (time.perf_counter() - t0)


def _paho_publisher(port: int) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{os.getpid()}-{time.monotonic_ns()}",
                         protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def _publish_all(client: mqtt.Client, reports: list[tuple[str, bytes]]) -> None:
    infos = [client.publish(t, p, qos=1) for t, p in reports]
    for info in infos[-100:]:
        info.wait_for_publish(300)


def _raw_paho(port: int, reports: list[tuple[str, bytes]]) -> float:
    sub = _sub_counter(port, len(reports))
    client = _paho_publisher(port)
    t0 = time.perf_counter()
    _publish_all(client, reports)
    sub.wait(300)
    rate = len(reports) / (time.perf_counter() - t0)
    client.disconnect()
    client.loop_stop()
    return rate


def _wait_accepted(coord: Coordinator, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while coord.metrics.snapshot()["accepted"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"coordinator accepted only {coord.metrics.snapshot()['accepted']} of {n}")
        time.sleep(0.005)


def _start_worker(port: int, db: Path, work: Path, i: int) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "coordinator", "run", "--db", str(db), "--key", str(work / "key"),
         "--mqtt-port", str(port), "--share-group", "bench", "--client-id", f"bench-worker-{i}",
         "--batch-size", "2000", "--batch-ms", "20"],
        stdout=subprocess.PIPE, stderr=open(work / f"worker-{i}.log", "ab"), cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)))
    if b"ready" not in proc.stdout.readline():
        raise RuntimeError(f"worker {i} did not start; see {work}/worker-{i}.log")
    return proc


def _shared_workers_drain(port: int, db: Path, work: Path, fleet: SimFleet, workers: int) -> float:
    """Reports queued for a shared subscription of ``workers`` coordinator processes (one SQLite file), then drained.

    The rate is measured over the reports' validation timestamps (first to last), which leaves out the processes'
    start-up (imports) but not their competition for the cores."""
    store = SQLiteStore(db)
    RoundManager(store, wire.generate_signing_key()).open_round("shared", 1.0, _params())
    store.close()
    reports = _reports(fleet, "shared")
    procs = [_start_worker(port, db, work, i) for i in range(workers)]
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    pub = _paho_publisher(port)
    _publish_all(pub, reports)
    pub.disconnect()
    pub.loop_stop()
    procs = [_start_worker(port, db, work, i) for i in range(workers)]
    try:
        deadline = time.monotonic() + 600
        while True:
            conn = sqlite3.connect(db, timeout=30)
            count, t_first, t_last = conn.execute(
                "SELECT COUNT(*), MIN(received_at), MAX(received_at) FROM reports WHERE round_id = 'shared'").fetchone()
            conn.close()
            if count >= len(reports):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"shared workers stored {count} of {len(reports)}")
            time.sleep(0.05)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    return len(reports) / max(t_last - t_first, 1e-9)


def run(quick: bool = False) -> str:
    n_devices = 1000 if quick else 6000
    work = Path(tempfile.mkdtemp(prefix="haarvest-bench-ingest-"))
    broker = _Broker(work / "broker")
    try:
        fleet = SimFleet(n_devices)
        t0 = time.perf_counter()
        drain_reports = _reports(fleet, "drain")
        live_reports = _reports(fleet, "live")
        sign_rate = (len(drain_reports) + len(live_reports)) / (time.perf_counter() - t0)
        n = len(drain_reports)
        size = sum(len(p) for _, p in drain_reports) / n

        raw_pub = _raw_mosquitto_pub(broker.port, [p for _, p in drain_reports], work)
        raw_paho = _raw_paho(broker.port, drain_reports)

        db = work / "coord.db"
        store = SQLiteStore(db)
        for rec in fleet.enrollment():
            store.upsert_device(rec["device_id"], rec["public_key"])
        manager = RoundManager(store, wire.generate_signing_key())
        manager.open_round("drain", 1.0, _params())
        manager.open_round("live", 1.0, _params())
        store.close()
        config = CoordinatorConfig(db=str(db), mqtt_port=broker.port, client_id="bench-coordinator",
                                   batch_size=2000, batch_ms=20)
        # register the persistent session, go offline, queue the reports, then measure the drain
        Coordinator(config).start().close()
        pub = _paho_publisher(broker.port)
        _publish_all(pub, drain_reports)
        coord = Coordinator(config)
        t0 = time.perf_counter()
        coord.start()
        _wait_accepted(coord, n)
        drain = n / (time.perf_counter() - t0)
        # live: publisher and coordinator at once
        base = coord.metrics.snapshot()["accepted"]
        t0 = time.perf_counter()
        _publish_all(pub, live_reports)
        _wait_accepted(coord, base + len(live_reports))
        live = len(live_reports) / (time.perf_counter() - t0)
        snap = coord.metrics_snapshot()
        coord.close()
        pub.disconnect()
        pub.loop_stop()
        assert snap["stored_reports"] == 2 * n and not snap["rejected"], snap
        shared = _shared_workers_drain(broker.port, db, work, fleet, 2)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("raw: mosquitto_pub -l → mosquitto_sub (QoS 1)", raw_pub, "100 %", f"{100 * raw_paho / raw_pub:.0f} %"),
        ("raw: paho publisher → mosquitto_sub (QoS 1)", raw_paho, f"{100 * raw_paho / raw_pub:.0f} %", "100 %"),
        ("coordinator drain (queued session → SQLite, ack after commit)", drain,
         f"{100 * drain / raw_pub:.0f} %", f"{100 * drain / raw_paho:.0f} %"),
        ("coordinator live (paho publisher running concurrently)", live,
         f"{100 * live / raw_pub:.0f} %", f"{100 * live / raw_paho:.0f} %"),
        ("2 coordinator processes, shared subscription, drain", shared,
         f"{100 * shared / raw_pub:.0f} %", f"{100 * shared / raw_paho:.0f} %"),
    ]
    out = [
        "## Coordinator ingest",
        "",
        f"{n} signed reports per measurement ({size:.0f} bytes each, {n_devices} devices × {len(STREAMS)} streams), "
        f"one mosquitto on loopback, QoS 1, SQLite WAL synchronous=FULL, batch ≤ 2000 / 20 ms. "
        f"(Signing, for reference: {sign_rate:,.0f} reports/s.)",
        "",
        "| path | reports/s | vs mosquitto_pub | vs paho publisher |",
        "|---|---:|---:|---:|",
    ]
    out += [f"| {name} | {rate:,.0f} | {a} | {b} |" for name, rate, a, b in rows]
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv))
