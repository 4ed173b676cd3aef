"""Past one machine: two `haarvest coordinator run` workers on one MQTT shared subscription (``--share-group``) of a
real mosquitto, over one real PostgreSQL database (docs/scale.md).

The workers start together on an empty database; devices are enrolled and the round opened afterwards through
another connection (as `haarvest coordinator enroll-device` / `rounds open` would). Signed reports of an enrolled
fleet arrive as:

1. every report published twice back to back: mosquitto hands a shared subscription's messages to its members in
   turn, so the two copies reach the two workers, which both accept it (neither has seen the device) and commit it
   — the duplicate delivered to the *other* worker, which its database insert finds stored and does not count;
2. the second stream's reports while worker 0 is killed (SIGKILL) and restarted: the broker redelivers what it had
   not acknowledged and queues its share meanwhile;
3. replays of earlier reports (the same signed bytes), several copies each, spread over both workers.

Checked: every report stored once; ``accepted`` = stored rows and every other count a ``duplicate`` (no
rejection); the aggregates summed over the workers' writer rows agree with the statistics recomputed from the stored
reports (``check_aggregates``), and the estimate from the aggregates equals the estimate from the bodies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from coordinator.aggregates import check_aggregates
from coordinator.decode import StreamDecoder
from coordinator.estimate import estimate_round, estimate_stream
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimFleet
from coordinator.store import PostgresStore
from protocols import wire
from protocols.contract import parse_round_params
from simulations.broker import free_port
from tests.brokers import wait_until
from tests.processes import ChildProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
N = 150
PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 1.0}, "dims": ["cpu"], "bounds": [[0, 100]]},
    "mode": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": 1.0, "k": 3}, "dims": ["mode"]},
}}


class Worker(ChildProcess):
    """One `haarvest coordinator run` on the shared subscription, with its HTTP API (for its own ingest counters)."""

    def __init__(self, tmp: Path, i: int, dsn: str, port: int) -> None:
        self.name, self.dsn, self.port = f"worker-{i}", dsn, port
        self.tokens = tmp / f"{self.name}.tokens"
        self.tokens.write_text("shared-subscription-test-token\n")
        self.log = tmp / f"{self.name}.log"
        self.key = tmp / "coordinator.key"  # one round-signing key file for both, created by whichever starts first
        self.proc: subprocess.Popen | None = None
        self.http = ""

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "haarvest", "coordinator", "run", "--db", self.dsn, "--key", str(self.key),
             "--mqtt-port", str(self.port),
             "--client-id", self.name, "--share-group", "ingest", "--batch-ms", "10", "--http-port", str(free_port()),
             "--api-tokens", str(self.tokens)],
            stdout=subprocess.PIPE, stderr=open(self.log, "ab"), cwd=ROOT, text=True)

    def ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line and json.loads(line)["status"] == "ready", (line, self.log.read_text()[-2000:])
        self.http = json.loads(line)["http"]

    def metrics(self) -> dict:
        req = urllib.request.Request(f"{self.http}/api/metrics",
                                     headers={"Authorization": "Bearer shared-subscription-test-token"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)


def _publish(port: int, messages: list[tuple[str, bytes]]) -> None:
    """Publish in this order (QoS 1, one connection) and wait for every PUBACK."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-{time.monotonic_ns()}", protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(100)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(t, p, qos=1) for t, p in messages]
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def test_two_workers_on_a_shared_subscription_over_postgres(mosquitto, postgres_server, tmp_path):
    dsn = postgres_server.create_database("shared_ingest")
    workers = [Worker(tmp_path, i, dsn, mosquitto.port) for i in (0, 1)]
    try:
        for w in workers:  # both at once, on the empty database
            w.spawn()
        for w in workers:
            w.ready()
        store = PostgresStore(dsn)
        fleet = SimFleet(N, prefix="shared")
        for rec in fleet.enrollment():
            store.upsert_device(rec["device_id"], rec["public_key"])
        RoundManager(store, wire.generate_signing_key()).open_round("fleet", 2.0, PARAMS)
        time.sleep(1.2)  # a worker re-reads the devices for an unknown one at most once a second (Validator)
        rng = np.random.default_rng(20261126)
        specs = parse_round_params(PARAMS).streams
        duchi, grr = specs["cpu"].build(), specs["mode"].build()
        cpu = fleet.reports("fleet", "cpu", "duchi", duchi.privatize(rng.uniform(-1, 1, N), rng), duchi)
        mode = fleet.reports("fleet", "mode", "grr", grr.privatize(rng.integers(0, 3, N), rng), grr)

        def counters() -> dict[str, int]:
            return {k: v for k, v in store.counters().items() if "." not in k}

        # 1. each report twice, back to back: one copy to each worker; which one stores it is a race
        _publish(mosquitto.port, [m for m in cpu for _ in (0, 1)])
        assert wait_until(lambda: sum(counters().values()) >= 2 * N, 60), counters()
        assert counters() == {"accepted": N, "duplicate": N}
        seen = [w.metrics() for w in workers]
        assert [m["received"] for m in seen] == [N, N], seen  # every report reached both workers ...
        assert sum(m["accepted"] for m in seen) == N and sum(m["duplicates"] for m in seen) == N, seen  # ... once

        # 2. the second stream while worker 0 dies and comes back (same client id: its session is redelivered)
        half = N // 2
        _publish(mosquitto.port, mode[:half])
        workers[0].kill()
        _publish(mosquitto.port, mode[half:])
        workers[0].spawn()
        workers[0].ready()
        assert wait_until(lambda: store.report_counts() == {("fleet", "cpu"): N, ("fleet", "mode"): N}, 60), \
            store.report_counts()

        # 3. replays of earlier reports, three copies each, to whichever worker is next
        replayed = [cpu[i] for i in rng.choice(N, 40, replace=False)] + [mode[i] for i in rng.choice(N, 40, False)]
        before = counters()["duplicate"]
        _publish(mosquitto.port, [m for m in replayed for _ in range(3)])
        assert wait_until(lambda: counters()["duplicate"] >= before + 3 * len(replayed), 60), counters()
    finally:
        for w in workers:
            w.stop()

    final = counters()
    assert final["accepted"] == 2 * N and set(final) == {"accepted", "duplicate"}, final
    stored = {(r.device_id, r.seq) for r in store.iter_reports("fleet")}
    assert stored == {(d.device_id, s) for d in fleet.devices for s in (1, 2)}
    writers = store._exec("SELECT stream, writer, n FROM aggregates WHERE round_id = 'fleet'")
    for stream in PARAMS["streams"]:
        assert sum(n for s, _, n in writers if s == stream) == N, writers  # merged over the workers' rows
    assert len([n for s, _, n in writers if s == "mode" and n > 0]) >= 2, writers  # the reports sent once: split
    assert [c.status for c in check_aggregates(store, ["fleet"])] == ["agree", "agree"]
    kept = estimate_round(store, "fleet")
    for stream, spec in specs.items():
        bodies = StreamDecoder.for_spec(spec).from_bodies(store.report_bodies("fleet", stream))
        assert bodies.reports is not None and bodies.dropped == 0
        from_bodies = estimate_stream(spec, bodies)
        assert kept[stream].n == N
        assert np.allclose(kept[stream].raw, from_bodies.raw) and np.allclose(kept[stream].stderr, from_bodies.stderr)
    store.close()
