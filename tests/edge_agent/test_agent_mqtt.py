"""The agent against a real mosquitto: signed reports, each (device, seq) exactly once across a broker restart."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.agent import Agent
from edge_agent.embed import new_identity, numeric, categorical, simple_config
from edge_agent.sources import CallableSource
from protocols import wire

pytestmark = pytest.mark.integration


class Collector:
    """A paho subscriber with a persistent session: verifies signatures, dedupes by (device, seq)."""

    def __init__(self, port: int, pubkeys: dict[str, object]) -> None:
        self.pubkeys = pubkeys
        self.seen: dict[tuple[str, int], wire.Report] = {}
        self.deliveries = 0
        self.bad: list[str] = []
        self.status: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="test-collector", protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(1, 2)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600
        self.client.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.client.loop_start()
        assert self.subscribed.wait(10)

    def _on_connect(self, client, _u, _f, reason, _p):
        client.subscribe([(wire.REPORTS_WILDCARD, 1), (f"{wire.TOPIC_PREFIX}/status/+", 1)])

    def _on_message(self, _c, _u, msg):
        import json

        if "/status/" in msg.topic:
            self.status[msg.topic.rsplit("/", 1)[1]] = json.loads(msg.payload)
            return
        try:
            device = wire.device_id_from_topic(msg.topic)
            report = wire.decode_report(msg.payload)
            assert report.device_id == device
            wire.verify_report(report, msg.topic, self.pubkeys[device])
        except Exception as exc:  # noqa: BLE001
            self.bad.append(f"{msg.topic}: {exc}")
            return
        with self.lock:
            self.deliveries += 1
            self.seen[(device, report.seq)] = report

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def _round(key, round_id: str, epsilon: float, **params) -> bytes:
    rc = wire.RoundConfig(round_id=round_id, protocol="telemetry", epsilon=epsilon, params=params)
    return wire.sign_round(rc, key).to_bytes()


def _publish_round(port: int, payload: bytes) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    c.publish(wire.ROUNDS_CURRENT_TOPIC, payload, qos=1, retain=True).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()


def _step_until(agents, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for a in agents:
            a.step()
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_reports_survive_broker_restart(mosquitto, tmp_path):
    coord = wire.generate_signing_key()
    n_agents, n_rounds = 3, 8
    agents, pubkeys = [], {}
    rng_state = {"i": 0}

    def reading():
        rng_state["i"] += 1
        i = rng_state["i"]
        return {"cpu": (i * 7.3) % 100, "temp": 40 + (i % 5), "mode": i % 3}

    for i in range(n_agents):
        ident = new_identity()
        cfg = simple_config(
            f"dev-{i}",
            tmp_path / f"dev-{i}",
            [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)],
            [
                {"name": "cpu", "dimensions": ["cpu"], "mechanism": "hybrid"},
                {"name": "env", "dimensions": ["cpu", "temp"], "mechanism": "ksampling", "epsilon": 0.5},
                {"name": "mode", "dimensions": ["mode"], "mechanism": "grr"},
            ],
            mqtt={"receipts": False, "port": mosquitto.port, "host": "127.0.0.1", "reconnect_min_s": 1, "reconnect_max_s": 2,
                  "max_inflight": 4},
            coordinator_public_key=wire.public_key_b64(coord),
        )
        agents.append(Agent(cfg, CallableSource(reading), secrets=ident))
        pubkeys[cfg.device_id] = ident.signing_key.public_key()
    collector = Collector(mosquitto.port, pubkeys)
    try:
        for a in agents:
            a.open()
        assert _step_until(agents, lambda: all(a.transport.connected.is_set() for a in agents))
        for r in range(n_rounds):
            if r == 3:
                mosquitto.stop()  # rounds 3.. are committed while the broker is down (outbox keeps them)
            if r == 5:
                mosquitto.start()
            if mosquitto.proc is not None:
                _publish_round(mosquitto.port, _round(coord, f"round-{r}", 2.0))
                assert _step_until(agents, lambda: all(a.rounds_answered >= r + 1 for a in agents)), f"round {r}"
            else:  # broker down: the coordinator cannot publish; devices still sample and report locally
                for a in agents:
                    a.report(f"offline-{r}")
                _step_until(agents, lambda: False, timeout=0.3)  # handed to paho while disconnected
                assert all(not a.transport.connected.is_set() for a in agents)
                assert all(a.state.pending_count() > 0 for a in agents)
        assert _step_until(agents, lambda: all(a.state.pending_count() == 0 for a in agents), timeout=30)
        expected = {(a.config.device_id, s) for a in agents for s in range(a.state.next_seq)}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not expected <= set(collector.seen):
            time.sleep(0.05)
        assert not collector.bad
        missing = sorted(expected - set(collector.seen))
        assert not missing, f"missing (device, seq): {missing[:10]}"
        assert set(collector.seen) == expected
        for a in agents:
            assert a.transport.connects >= 2  # it did reconnect after the restart
            inv = a.state.check_invariants()
            assert inv["ok"], inv
            # every report seen carries the agent's boot and a stream it has
            reps = [rep for (d, _), rep in collector.seen.items() if d == a.config.device_id]
            assert {rep.stream for rep in reps} == {"cpu", "env", "mode"}
            assert all(rep.boot == a.boot for rep in reps)
        assert collector.deliveries >= len(expected)
    finally:
        for a in agents:
            a.close(drain_timeout=2)
        collector.close()
    assert all(s.get("state") == "offline" for s in collector.status.values()) or collector.status == {}


def test_pending_reports_resent_after_agent_restart(mosquitto, tmp_path):
    """Reports committed while the broker was down and the agent then stopped are sent by the next agent run."""
    ident = new_identity()
    cfg = simple_config(
        "dev-r",
        tmp_path / "dev-r",
        [numeric("cpu", 0, 100)],
        mqtt={"receipts": False, "port": mosquitto.port, "host": "127.0.0.1", "reconnect_min_s": 1, "reconnect_max_s": 1},
        report_interval_s=3600.0,
    )
    values = iter(float(v) for v in range(1000))
    collector = Collector(mosquitto.port, {"dev-r": ident.signing_key.public_key()})
    try:
        mosquitto.stop()
        first = Agent(cfg, CallableSource(lambda: {"cpu": next(values)}), secrets=ident)
        first.open()
        for r in range(5):
            first.report(f"r{r}")
        _step_until([first], lambda: False, timeout=0.2)
        first.transport.kill()  # crash-like: no goodbye, unacked rows stay pending
        first.transport = None
        first.close()
        mosquitto.start()
        second = Agent(cfg, CallableSource(lambda: {"cpu": next(values)}), secrets=ident)
        second.open()
        assert second.boot == 2
        second.report("r5")
        assert _step_until([second], lambda: second.state.pending_count() == 0, timeout=20)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(collector.seen) < 6:
            time.sleep(0.05)
        assert sorted(s for _, s in collector.seen) == list(range(6))
        assert [collector.seen[("dev-r", s)].boot for s in range(6)] == [1] * 5 + [2]
        assert not collector.bad
        second.close(drain_timeout=2)
    finally:
        collector.close()
