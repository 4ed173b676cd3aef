"""The whole system over several rounds with faults injected — broker restart, coordinator SIGKILL, agent SIGKILL,
outbox overflow while the broker is down — on a real mosquitto (plain TCP; TLS is covered by tests/deploy).

Processes: mosquitto; `haarvest coordinator run` (a subprocess, killed and restarted); three `haarvest agent run`
subprocesses (one is SIGKILLed mid-round); an in-process fleet of embedded agents on one stepping thread; and one
embedded agent with ``max_pending = 2`` that reports while the broker is down. Rounds are opened by this test on the
coordinator's database (like `haarvest coordinator rounds open` in another process) and published retained.

Invariants checked at the end:
* no accepted report lost: the coordinator's stored (device, seq) set equals the union of the agents' outbox rows
  marked ``sent`` (acknowledged), and no outbox row is left pending;
* none double-counted: UNIQUE (device, seq) and (device, round, stream) in the store, the ``accepted`` counter equals
  the stored rows, and every rejection the coordinator counted is a ``duplicate`` (QoS 1 redelivery);
* every ledger within its caps and equal to the ε of the reports it enqueued (``State.check_invariants``), and the
  refused reports of the overflowing agent cost nothing;
* every round's estimates contain the truth (the mean/frequencies of the devices whose reports were stored) at level
  1 − 10⁻⁶ with worst-case variance.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from coordinator.estimate import estimate_round
from coordinator.rounds import RoundManager
from coordinator.service import load_or_create_key
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from edge_agent.agent import Agent, run_fleet
from edge_agent.config import create_secrets, load_config
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from edge_agent.state import State
from protocols import wire
from tests.processes import ChildProcess
from tests.brokers import Mosquitto

pytestmark = [pytest.mark.fault, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
N_PROC, N_FLEET, K = 3, 30, 3
EPS = 1.0
LEVEL = 1 - 1e-6
PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": EPS}, "dims": ["cpu"],
            "bounds": [[0, 100]]},
    "mode": {"kind": "frequency", "mechanism": "grr", "params": {"epsilon": EPS, "k": K}, "dims": ["mode"]},
}}
STREAMS = tuple(PARAMS["streams"])
CAPS = {"total_cap": 12.0, "stream_cap": 6.0}


# --- helpers ----------------------------------------------------------------------------------------------------


def _rows(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Read-only query of a live SQLite database (agents and coordinator keep writing it)."""
    if not db.exists():  # an agent not started yet
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # an agent process still creating its schema
            return []
        raise
    finally:
        con.close()


class Publisher:
    """The test's MQTT client for round configs (reconnects by itself after a broker restart)."""

    def __init__(self, port: int) -> None:
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="fault-test-rounds", protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        deadline = time.monotonic() + 20
        while not self.client.is_connected():
            assert time.monotonic() < deadline, "round publisher did not reconnect"
            time.sleep(0.05)
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class CoordinatorProcess(ChildProcess):
    """`haarvest coordinator run` as a child process."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.db, self.key, self.port = tmp / "coordinator.db", tmp / "coordinator.key", port
        self.log = tmp / "coordinator.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "haarvest", "coordinator", "run", "--db", str(self.db), "--key", str(self.key),
             "--mqtt-port", str(self.port), "--batch-ms", "10"],
            stdout=subprocess.PIPE, stderr=open(self.log, "ab"), cwd=ROOT, text=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(line)["status"] == "ready", line


class AgentProcess(ChildProcess):
    """`haarvest agent run` with a TOML config and a constant replayed reading."""

    def __init__(self, tmp: Path, device_id: str, port: int, coord_pub: str, cpu: float, mode: int) -> None:
        self.device_id, self.cpu, self.mode = device_id, cpu, mode
        d = tmp / device_id
        d.mkdir()
        (d / "reading.csv").write_text(f"cpu,mode\n{cpu},{mode}\n")
        self.conf = d / "agent.toml"
        self.conf.write_text(f"""
device_id = "{device_id}"
state_dir = "{d / 'state'}"
coordinator_public_key = "{coord_pub}"
schedule = "rounds"
sample_interval_s = 3600

[privacy]
epsilon = {EPS}
max_round_epsilon = {2 * EPS}

[ledger]
total_cap = {CAPS['total_cap']}
stream_cap = {CAPS['stream_cap']}

[[dimensions]]
name = "cpu"
kind = "numeric"
lo = 0.0
hi = 100.0

[[dimensions]]
name = "mode"
kind = "categorical"
k = {K}

[[streams]]
name = "cpu"
dimensions = ["cpu"]
mechanism = "hybrid"

[[streams]]
name = "mode"
dimensions = ["mode"]
mechanism = "grr"

[[sources]]
kind = "replay"
path = "reading.csv"
loop = true

[mqtt]
host = "127.0.0.1"
port = {port}
reconnect_min_s = 1
reconnect_max_s = 2
""")
        self.cfg = load_config(self.conf)
        self.public_key = create_secrets(self.cfg).public_key_b64
        self.db = self.cfg.database_path
        self.log = d / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "haarvest", "agent", "run", "-c", str(self.conf),
                                      "--drain-timeout", "5"], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"), cwd=ROOT)

    def answered(self, round_id: str) -> bool:
        return bool(_rows(self.db, "SELECT 1 FROM rounds WHERE round_id = ?", (round_id,)))


class System:
    """Everything the test runs, with the truth of every device's (constant) reading."""

    def __init__(self, tmp: Path) -> None:
        rng = np.random.default_rng(20240611)
        self.broker = Mosquitto(tmp / "broker").start()
        port = self.broker.port
        self.coordinator = CoordinatorProcess(tmp, port)
        coord_key = load_or_create_key(tmp / "coordinator.key")
        coord_pub = wire.public_key_b64(coord_key)
        self.truth: dict[str, tuple[float, int]] = {}
        self.procs = []
        for i in range(N_PROC):
            cpu, mode = float(np.round(rng.uniform(5, 95), 3)), int(rng.integers(K))
            self.procs.append(AgentProcess(tmp, f"proc-{i}", port, coord_pub, cpu, mode))
            self.truth[f"proc-{i}"] = (cpu, mode)
        mqtt_cfg = {"host": "127.0.0.1", "port": port, "reconnect_min_s": 1, "reconnect_max_s": 2}
        dims = [numeric("cpu", 0, 100), categorical("mode", K)]
        streams = [{"name": "cpu", "dimensions": ["cpu"], "mechanism": "hybrid"},
                   {"name": "mode", "dimensions": ["mode"], "mechanism": "grr"}]
        self.fleet: list[Agent] = []
        enrol = [(p.device_id, p.public_key) for p in self.procs]
        for i in range(N_FLEET):
            dev = f"fleet-{i:02d}"
            cpu, mode = float(rng.uniform(5, 95)), int(rng.integers(K))
            self.truth[dev] = (cpu, mode)
            ident = new_identity()
            cfg = simple_config(dev, tmp / "fleet" / dev, dims, streams, epsilon=EPS, mqtt=mqtt_cfg,
                                coordinator_public_key=coord_pub, ledger=CAPS,
                                privacy={"max_round_epsilon": 2 * EPS})
            self.fleet.append(Agent(cfg, CallableSource(lambda c=cpu, m=mode: {"cpu": c, "mode": m}),
                                    secrets=ident))
            enrol.append((dev, ident.public_key_b64))
        # the overflowing device: no coordinator key (reports only when this test calls report()), 2 pending max
        cpu, mode = 61.5, 2
        self.truth["overflow"] = (cpu, mode)
        ident = new_identity()
        cfg = simple_config("overflow", tmp / "overflow", dims, streams, epsilon=EPS, mqtt=mqtt_cfg, ledger=CAPS,
                            report_interval_s=1e9, outbox={"max_pending": 2})
        self.overflow = Agent(cfg, CallableSource(lambda: {"cpu": cpu, "mode": mode}), secrets=ident)
        enrol.append(("overflow", ident.public_key_b64))

        store = SQLiteStore(str(self.coordinator.db))
        for dev, pub in enrol:
            store.upsert_device(dev, pub, "active")
        self.store = store
        self.publisher = Publisher(port)
        self._outgoing: list[tuple[str, bytes, bool]] = []
        self.rounds = RoundManager(store, coord_key, publish=lambda t, p, r: self._outgoing.append((t, p, r)))
        self.stop_fleet = threading.Event()
        self.fleet_thread = threading.Thread(target=run_fleet, args=(self.fleet,),
                                             kwargs={"stop": self.stop_fleet, "drain_timeout": 5.0}, daemon=True)

    # --- lifecycle ---
    def start(self) -> None:
        self.coordinator.start()
        for p in self.procs:
            p.start()
        self.overflow.open()
        self.fleet_thread.start()

    def close(self) -> None:
        self.stop_fleet.set()
        self.fleet_thread.join(60)
        if self.overflow.state is not None:
            self.overflow.close(drain_timeout=2)
        for p in self.procs:
            p.stop()
        self.coordinator.stop()
        self.publisher.close()
        self.store.close()
        self.broker.stop()

    # --- rounds ---
    def open_round(self, round_id: str, publish: bool = True) -> None:
        """Open on the database (another process than the running coordinator, like `coordinator rounds open`) and
        publish (retained) at once: the coordinator looks up a round it does not know in the store when the first
        report names it (``test_round_opened_elsewhere_is_known_to_the_validator``)."""
        self.rounds.open_round(round_id, 2 * EPS, PARAMS)
        if publish:
            self.publish_pending()

    def publish_pending(self) -> None:
        out, self._outgoing = self._outgoing, []
        for topic, payload, retain in out:
            self.publisher.publish(topic, payload, retain)

    def close_round(self, round_id: str) -> None:
        self.rounds.close_round(round_id)
        self.publish_pending()

    # --- observation ---
    def stored(self) -> set[tuple[str, int]]:
        return set(_rows(self.coordinator.db, "SELECT device_id, seq FROM reports"))

    def agent_dbs(self) -> dict[str, Path]:
        out = {p.device_id: p.db for p in self.procs}
        out.update({a.config.device_id: a.config.database_path for a in [*self.fleet, self.overflow]})
        return out

    def outbox(self) -> dict[str, dict[int, str]]:
        return {dev: dict(_rows(db, "SELECT seq, status FROM outbox")) for dev, db in self.agent_dbs().items()}

    def settle(self, round_id: str, timeout: float = 45.0) -> None:
        """Until every agent answered ``round_id``, nothing is pending and the store holds every sent report."""
        deadline = time.monotonic() + timeout
        while True:
            self.overflow.step()
            boxes = self.outbox()
            pending = {d: p for d, box in boxes.items() if (p := [s for s, st in box.items() if st == "pending"])}
            sent = {(d, s) for d, box in boxes.items() for s, st in box.items() if st == "sent"}
            missing = sent - self.stored()
            unanswered = [p.device_id for p in self.procs if not p.answered(round_id)] + [
                a.config.device_id for a in self.fleet
                if not _rows(a.config.database_path, "SELECT 1 FROM rounds WHERE round_id = ?", (round_id,))]
            if not pending and not missing and not unanswered:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"round {round_id} did not settle: pending {pending}, "
                                     f"sent but not stored {sorted(missing)[:10]}, unanswered {unanswered}")
            time.sleep(0.25)


# --- the test ---------------------------------------------------------------------------------------------------


def test_faults_lose_nothing_and_count_nothing_twice(tmp_path):
    sysm = System(tmp_path)
    rng = np.random.default_rng(7)
    timeline: list[str] = []
    try:
        sysm.start()

        # r1: all healthy
        sysm.open_round("r1")
        sysm.overflow.report("r1")
        sysm.settle("r1")
        timeline.append("r1 healthy")

        # r2: SIGKILL an agent process while the round is being answered, restart it
        sysm.close_round("r1")
        sysm.open_round("r2")
        sysm.overflow.report("r2")
        time.sleep(rng.uniform(0.0, 0.3))
        victim = sysm.procs[0]
        victim.kill()
        victim.start()
        sysm.settle("r2")
        timeline.append("r2 agent SIGKILL")

        # r3: restart the broker in the middle of the round
        sysm.close_round("r2")
        sysm.open_round("r3")
        sysm.overflow.report("r3")
        time.sleep(rng.uniform(0.05, 0.3))
        sysm.broker.stop()
        time.sleep(1.0)
        sysm.broker.start()
        sysm.settle("r3")
        timeline.append("r3 broker restart")

        # r4: SIGKILL the coordinator while it ingests, restart it (the broker queues for its session meanwhile)
        sysm.close_round("r3")
        sysm.open_round("r4")
        sysm.overflow.report("r4")
        time.sleep(rng.uniform(0.0, 0.2))
        sysm.coordinator.kill()
        time.sleep(1.0)
        sysm.coordinator.start()
        sysm.settle("r4")
        timeline.append("r4 coordinator SIGKILL")

        # r5: the broker is down; the overflowing agent keeps reporting: 2 reports queue, the rest is refused
        sysm.close_round("r4")
        sysm.broker.stop()
        sysm.open_round("r5", publish=False)
        first = sysm.overflow.report("r5")
        spent = _spent(sysm.overflow)
        later = [sysm.overflow.report("r5") for _ in range(3)]
        assert len(first.commits) == 2 and sysm.overflow.state.pending_count() == 2  # type: ignore[union-attr]
        assert all(not o.commits and sorted(o.refused) == [("cpu", "outbox_full"), ("mode", "outbox_full")]
                   for o in later), later
        assert _spent(sysm.overflow) == spent  # refused reports cost nothing
        time.sleep(1.0)
        sysm.broker.start()
        sysm.publish_pending()
        sysm.settle("r5")
        timeline.append("r5 broker down + outbox overflow")

        # r6: healthy again
        sysm.close_round("r5")
        sysm.open_round("r6")
        sysm.overflow.report("r6")
        sysm.settle("r6")
        timeline.append("r6 healthy")
    except BaseException:
        sysm.close()
        raise
    sysm.close()

    with State(sysm.overflow.config.database_path) as st:
        refusals = sum(v for k, v in st.counters().items() if "outbox_full" in k)
    assert refusals == 6, "the overflowing agent refused 3 reports × 2 streams (counted durably)"
    # the faults happened: the victim booted twice, every embedded agent reconnected after both broker outages
    assert _rows(sysm.procs[0].db, "SELECT value FROM meta WHERE key = 'boot'") == [(2,)]
    assert all(a.transport is not None and a.transport.connects >= 3 for a in [*sysm.fleet, sysm.overflow])
    _check_invariants(sysm, timeline)


def _spent(agent: Agent) -> float:
    return agent.state.spent()  # type: ignore[union-attr]


def _check_invariants(sysm: System, timeline: list[str]) -> None:
    db = sysm.coordinator.db
    stored = _rows(db, "SELECT device_id, seq, round_id, stream FROM reports")
    assert len(stored) == len({(d, s) for d, s, _, _ in stored}) == len({(d, r, st) for d, _, r, st in stored})

    # no accepted report lost, none stored that no agent sent
    sent: set[tuple[str, int]] = set()
    for dev, path in sysm.agent_dbs().items():
        with State(path) as st:
            inv = st.check_invariants()
            assert inv["ok"], (dev, inv)
            box = st.outbox_totals()
            if not set(box) <= {"sent", "compacted"}:  # nothing pending, nothing rejected: say why if so
                log = path.parents[1] / "agent.log"
                why = [line for line in (log.read_text().splitlines() if log.exists() else [])
                       if "rejected" in line][-5:]
                raise AssertionError((dev, box, dict(_rows(db, "SELECT name, value FROM counters")), why, timeline))
            assert st.spent() <= CAPS["total_cap"] + 1e-9
            assert all(v <= CAPS["stream_cap"] + 1e-9 for v in st.spent_by_stream().values())
        sent |= {(dev, s) for (s,) in _rows(path, "SELECT seq FROM outbox WHERE status = 'sent'")}
    assert {(d, s) for d, s, _, _ in stored} == sent

    counters = dict(_rows(db, "SELECT name, value FROM counters"))
    assert counters.get("accepted") == len(stored), counters
    assert set(counters) <= {"accepted", "duplicate"}, f"unexpected rejections: {counters}"

    # every round: all devices that answered are in, estimates contain the truth
    store = SQLiteStore(str(db))
    try:
        for rid in ("r1", "r2", "r3", "r4", "r5", "r6"):
            by_stream = {s: [d for d, _, r, st in stored if r == rid and st == s] for s in STREAMS}
            n_expected = N_PROC + N_FLEET + 1
            for s in STREAMS:  # at most the victim of r2 may lack a report (killed between answer and commit)
                assert n_expected - (1 if rid == "r2" else 0) <= len(by_stream[s]) <= n_expected, (rid, s, timeline)
            est = estimate_round(store, rid, level=LEVEL, variance="worst")
            cpu_truth = np.mean([sysm.truth[d][0] for d in by_stream["cpu"]])
            e = est["cpu"]
            assert e.n == len(by_stream["cpu"])
            assert e.ci_low[0] <= cpu_truth <= e.ci_high[0], (rid, cpu_truth, e.to_dict())
            modes = np.bincount([sysm.truth[d][1] for d in by_stream["mode"]], minlength=K) / len(by_stream["mode"])
            f = est["mode"]
            assert f.n == len(by_stream["mode"])
            assert all(lo <= t <= hi for lo, t, hi in zip(f.ci_low, modes, f.ci_high)), (rid, modes, f.to_dict())
    finally:
        store.close()


def test_round_opened_elsewhere_is_known_to_the_validator(tmp_path):
    from coordinator.simfleet import SimFleet

    store = SQLiteStore(str(tmp_path / "c.db"))
    other = SQLiteStore(str(tmp_path / "c.db"))  # the CLI's connection
    fleet = SimFleet(1)
    for dev in fleet.enrollment():
        store.upsert_device(dev["device_id"], dev["public_key"], "active")
    cli = RoundManager(other, wire.generate_signing_key())
    spec = {"streams": {"a": {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 0.5}, "dims": ["a"],
                              "bounds": [[0, 1]]}}}
    try:
        cli.open_round("r1", 1.0, spec)
        validator = Validator(store)
        validator.check(*fleet.devices[0].report("r1", "a", "duchi", {"report": 1}))
        cli.open_round("r2", 1.0, spec)  # committed before any device can see it
        rep = validator.check(*fleet.devices[0].report("r2", "a", "duchi", {"report": 1}))
        assert rep.round_id == "r2"
    finally:
        store.close()
        other.close()


def test_empty_retained_round_is_not_malformed(tmp_path):
    """Closing the last open round clears the retained ``rounds/current`` with an empty payload; agents must treat
    that as 'no round', not as a malformed config."""
    ident = new_identity()
    cfg = simple_config("dev-e", tmp_path / "dev-e", [numeric("cpu", 0, 100)],
                        coordinator_public_key=wire.public_key_b64(wire.generate_signing_key()))
    agent = Agent(cfg, CallableSource(lambda: {"cpu": 1.0}), secrets=ident, transport=False).open()
    try:
        assert agent.handle_round(b"") is None
        counters = dict(agent.stats)
        persisted = agent.state.counters()  # type: ignore[union-attr]
    finally:
        agent.close()
    assert not any("malformed" in k for k in [*counters, *persisted]), (counters, persisted)
    assert counters.get("rounds.cleared") == 1
