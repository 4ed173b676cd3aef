"""A report is delivered when the coordinator has stored it, not when the broker has PUBACKed it.

On a real mosquitto: the broker loses the coordinator's queued reports (its session wiped while it is down) — the
agents, which saw every PUBACK, re-send what the coordinator never receipted, and every charged report is stored;
without receipts the same run loses them (the negative control). A PUBACK with reason code 0x10 ("no matching
subscribers") never marks a report sent. An agent pointed at a closed port says so at warning level at once."""

from __future__ import annotations

import logging
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from coordinator.service import Coordinator, CoordinatorConfig
from edge_agent import Agent, run_fleet
from edge_agent.embed import enrolment, new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from simulations.broker import free_port
from tests.brokers import mosquitto, wait_until  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

N_AGENTS = 3
CLIENT_ID = "receipts-coordinator"
STREAMS = [{"name": "cpu", "dimensions": ["cpu"], "mechanism": "hybrid", "epsilon": 1.0}]


_wait = wait_until


def _agent(i: int, tmp_path, port: int, pub: str | None, receipts: bool) -> Agent:
    extra = {"coordinator_public_key": pub} if pub else {"schedule": "interval", "report_interval_s": 3600.0}
    cfg = simple_config(f"rc-{i}", tmp_path / f"rc-{i}", [numeric("cpu", 0, 100)], STREAMS, total_cap=100.0,
                        sample_interval_s=86400.0, **extra,
                        mqtt={"host": "127.0.0.1", "port": port, "reconnect_min_s": 1, "reconnect_max_s": 1,
                              "receipts": receipts, "receipt_timeout_s": 1.0, "receipt_timeout_max_s": 2.0})
    return Agent(cfg, CallableSource(lambda: {"cpu": 42.0}), secrets=new_identity())


def _charged(a: Agent) -> int:
    return len(list(a.state.ledger_rows()))


def _wipe_session(port: int, client_id: str) -> None:
    """What a client that may use the coordinator's id can do (without identity binding): clean start, gone."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    done = threading.Event()
    c.on_connect = lambda *a: done.set()
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 0
    c.connect("127.0.0.1", port, clean_start=True, properties=props)
    c.loop_start()
    assert done.wait(10)
    c.disconnect()
    c.loop_stop()


def _lossy_run(tmp_path, port: int, receipts: bool) -> tuple[int, int, int]:
    """Round r1 opened, then the coordinator goes down; the agents report (the broker PUBACKs and queues for the
    coordinator's persistent session); the session is wiped; the coordinator comes back.
    Returns (reports charged, rows the agents count as sent, reports stored)."""
    db = str(tmp_path / "c.db")

    def coordinator() -> Coordinator:
        return Coordinator(CoordinatorConfig(db=db, mqtt_port=port, http_port=None, client_id=CLIENT_ID,
                                             batch_ms=5.0)).start()

    coord = coordinator()
    agents = [_agent(i, tmp_path, port, coord.public_key, receipts) for i in range(N_AGENTS)]
    coord.import_devices([enrolment(a.config, a.secrets) for a in agents])
    for a in agents:
        a.open()
    coord.open_round("r1", 5.0, {"streams": agents[0].stream_specs()})  # retained: the agents find it on connect
    coord.close()  # down: its persistent session queues what the devices send
    stop = threading.Event()
    fleet = threading.Thread(target=run_fleet, args=(agents,), kwargs={"stop": stop, "poll_s": 0.02}, daemon=True)
    fleet.start()
    try:
        # every report charged and PUBACKed by the broker
        assert _wait(lambda: all(_charged(a) and a.transport is not None and a.transport.inflight == 0
                                 and (a.transport.awaiting_receipt if receipts else a.state.pending_count() == 0)
                                 for a in agents), 20)
        charged = sum(_charged(a) for a in agents)
        _wipe_session(port, CLIENT_ID)  # the broker loses every report queued for the ingest
        coord = coordinator()
        if receipts:
            assert _wait(lambda: sum(coord.store.report_counts().values()) >= charged
                         and all(a.state.pending_count() == 0 for a in agents), 30)
        else:
            time.sleep(3)
        sent = sum(a.state.status()["outbox"].get("sent", {}).get("count", 0) for a in agents)
        stored = sum(coord.store.report_counts().values())
        return charged, sent, stored
    finally:
        stop.set()
        fleet.join(30)
        coord.close()


def test_reports_the_broker_loses_are_resent_until_the_coordinator_stores_them(tmp_path, mosquitto):  # noqa: F811
    charged, sent, stored = _lossy_run(tmp_path, mosquitto.port, receipts=True)
    assert charged == N_AGENTS * len(STREAMS)
    assert stored == charged and sent == charged


def test_without_receipts_a_wiped_queue_loses_charged_reports(tmp_path, mosquitto):  # noqa: F811
    """The negative control: broker delivery only (the old contract) — every report PUBACKed, charged, counted
    sent, and none stored."""
    charged, sent, stored = _lossy_run(tmp_path, mosquitto.port, receipts=False)
    assert charged == sent == N_AGENTS * len(STREAMS)
    assert stored == 0


def test_puback_no_matching_subscribers_never_marks_a_report_sent(tmp_path, mosquitto):  # noqa: F811
    """MQTT 5 PUBACK 0x10: the broker took the report and nobody will read it. Even with receipts off the row
    stays pending (re-sent later), never ``sent``."""
    agent = _agent(0, tmp_path, mosquitto.port, None, receipts=False)
    agent.open()
    try:
        assert _wait(lambda: (agent.step(), agent.transport.connected.is_set())[1], 10)
        agent.report("manual-1")
        assert _wait(lambda: (agent.step(), agent.transport.inflight == 0 and agent.state.pending_count() == 1)[1],
                     10)
        time.sleep(0.5)
        agent.step()
        assert agent.state.pending_count() == 1
        assert agent.state.status()["outbox"].get("sent", {}).get("count", 0) == 0
    finally:
        agent.close(drain_timeout=0)


def test_a_wrong_broker_port_is_logged_at_warning_level(tmp_path, caplog):
    port = free_port()  # nothing listens there
    agent = _agent(0, tmp_path, port, None, receipts=True)
    agent.open()
    try:
        with caplog.at_level(logging.WARNING, logger="haarvest.agent.transport"):
            assert _wait(lambda: any("cannot connect" in r.getMessage() for r in caplog.records), 10)
        msg = next(r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage())
        assert f"127.0.0.1:{port}" in msg and "refused" in msg.lower()
        assert agent.transport.link[0] == "disconnected" and "refused" in agent.transport.link[2].lower()
        agent.report("offline-1")  # charged and pending: `agent status` (another process) shows the link and backlog
        agent.step()
        from edge_agent.state import State

        with State(agent.config.database_path) as other:
            status = other.status()
        assert status["link"]["state"] == "disconnected" and "refused" in status["link"]["reason"].lower()
        assert status["link"]["since"] > 0 and status["pending_reports"] == 1
    finally:
        agent.close(drain_timeout=0)
