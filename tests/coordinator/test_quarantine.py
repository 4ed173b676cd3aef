"""Per-device contracts, rejections counted per device, and the flood quarantine (guard, store status,
validator, dynamic-security commands). The broker side runs on a real mosquitto in
tests/deploy/test_broker_identity.py."""

from __future__ import annotations

import json

import pytest

from coordinator import cli
from coordinator.quarantine import BrokerQuarantine, FloodGuard, dynsec_commands
from coordinator.rounds import RoundManager
from coordinator.service import Coordinator, CoordinatorConfig, read_device_records
from coordinator.simfleet import SimFleet
from coordinator.store import SQLiteStore
from coordinator.validate import Validator, per_device_counters
from protocols import wire

PARAMS = {"streams": {
    "cpu": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["cpu"], "bounds": [[0, 100]]},
    "temp": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["t"], "bounds": [[0, 100]]},
}}


@pytest.fixture
def setup(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    fleet = SimFleet(3)
    contracts = [{"cpu": "auto"}, {"cpu": "duchi"}, None]
    for rec, contract in zip(fleet.enrollment(), contracts):
        store.upsert_device(rec["device_id"], rec["public_key"], contract=contract)
    validator = Validator(store)
    rounds = RoundManager(store, wire.generate_signing_key(), on_change=validator.set_round)
    rounds.open_round("r1", 2.0, PARAMS)
    yield store, fleet, validator
    store.close()


def test_an_off_contract_stream_or_mechanism_is_rejected_with_its_own_reason(setup):
    """The finding: one device's single report on a stream it was never configured for became the estimate."""
    store, fleet, v = setup
    bound, wrong_mech, unbound = fleet.devices
    results = v.check_batch([bound.report("r1", "temp", "hybrid", {"report": 57}),   # not in its contract
                             bound.report("r1", "cpu", "hybrid", {"report": 57}),    # in it (auto)
                             wrong_mech.report("r1", "cpu", "hybrid", {"report": 57}),  # enrolled for duchi
                             unbound.report("r1", "temp", "hybrid", {"report": 57})])  # no contract: any stream
    assert [getattr(r, "reason", "stored") for r in results] == ["off_contract", "stored", "off_contract", "stored"]
    assert per_device_counters(results) == {f"off_contract.{bound.device_id}": 1,
                                            f"off_contract.{wrong_mech.device_id}": 1}


def test_every_rejection_that_names_an_enrolled_device_is_counted_per_device(setup):
    store, fleet, v = setup
    dev = fleet.devices[0]
    topic, good = dev.report("r1", "cpu", "hybrid", {"report": 17})
    forged = wire.decode_report(good).model_copy(update={"seq": 99}).to_bytes()
    results = v.check_batch([(topic, b"{not json"), (topic, forged),
                             ("haarvest/v1/reports/not-enrolled", b"{not json")])
    assert [r.reason for r in results] == ["malformed", "bad_signature", "malformed"]
    # charged to the device its topic names (the broker's ACL binds a device to its own topic); not to unknown ids
    assert per_device_counters(results) == {f"malformed.{dev.device_id}": 1, f"bad_signature.{dev.device_id}": 1}
    assert all(r.seq is None for r in results)  # unauthenticated: no receipt names them


def test_device_records_carry_the_contract_and_agent_enrolment_prints_it(tmp_path):
    recs = read_device_records([{"device_id": "a", "public_key": "k", "streams": {"cpu": "auto"}},
                                {"device_id": "b", "public_key": "k", "streams": ["cpu", "mem"]},
                                {"device_id": "c", "public_key": "k"}])
    assert [r.contract for r in recs] == [{"cpu": "auto"}, {"cpu": "auto", "mem": "auto"}, None]
    with pytest.raises(ValueError):
        read_device_records([{"device_id": "a", "public_key": "k", "streams": {"bad/name": "auto"}}])
    from edge_agent.config import AgentConfig
    from edge_agent.embed import enrolment, new_identity

    cfg = AgentConfig.model_validate({"device_id": "d1", "state_dir": str(tmp_path), "ledger": {"total_cap": 10},
                                      "dimensions": [{"name": "cpu", "kind": "numeric", "lo": 0, "hi": 100},
                                                     {"name": "mode", "kind": "categorical", "k": 3}]})
    assert enrolment(cfg, new_identity())["streams"] == {"cpu": "auto", "mode": "auto"}


def test_flood_guard_flags_each_device_once_per_window_and_not_honest_rejections():
    now = [0.0]
    guard = FloodGuard(max_messages=5, max_rejections=2, window_s=10, clock=lambda: now[0])
    late = [wire.WireError("round_closed", device_id="honest", seq=i) for i in range(4)]
    assert guard.observe(late) == []  # round_closed / duplicate: what an honest device back from offline sends
    bad = [wire.WireError("bad_body", device_id="x", seq=i) for i in range(3)]
    assert guard.observe(bad) == [("x", "more than 2 rejected messages in 10 s")]
    assert guard.observe(bad) == []  # reported once
    many = [wire.WireError("duplicate", device_id="y", seq=i) for i in range(6)]
    assert guard.observe(many) == [("y", "more than 5 messages in 10 s")]
    now[0] = 11.0  # a new window
    assert guard.observe([wire.WireError("round_closed", device_id="honest", seq=9)] * 2) == []
    guard.forget("x")
    assert guard.observe(bad) == [("x", "more than 2 rejected messages in 10 s")]


def test_dynsec_commands_cut_off_and_release():
    cmds = json.loads(dynsec_commands(["d1"], ["d2"]))["commands"]
    names = [c["command"] for c in cmds]
    assert names == ["createRole", "createClient", "addClientRole", "disableClient", "deleteClient"]
    assert all(not acl["allow"] for acl in cmds[0]["acls"])
    assert cmds[1]["username"] == "d1" and cmds[-1]["username"] == "d2"


def test_quarantine_rejects_the_device_is_listed_and_released_by_the_cli(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    fleet = SimFleet(2)
    coord = Coordinator(CoordinatorConfig(db=db, mqtt=False))
    for rec in fleet.enrollment():
        coord.enroll(rec["device_id"], rec["public_key"], streams=["cpu"])
    coord.open_round("r1", 2.0, PARAMS)
    flooder, honest = fleet.devices
    coord._quarantine([(flooder.device_id, "test")])
    sent: list[bytes] = []
    bq = BrokerQuarantine(coord.store, lambda topic, payload: sent.append(payload))
    assert bq.sync() == ([flooder.device_id], [])
    results = coord.validator.check_batch([flooder.report("r1", "cpu", "hybrid", {"report": 17}),
                                           honest.report("r1", "cpu", "hybrid", {"report": 17})])
    assert [getattr(r, "reason", "stored") for r in results] == ["quarantined", "stored"]
    coord.close()
    assert cli.main(["coordinator", "devices", "--db", db, "--release", flooder.device_id]) == 0
    rows = {r["device_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[flooder.device_id]["status"] == "active" and rows[flooder.device_id]["quarantines"] == 1
    assert rows[honest.device_id]["streams"] == {"cpu": "auto"}
    store = SQLiteStore(db)
    bq.store = store
    assert bq.sync() == ([], [flooder.device_id])  # the running coordinator lifts the broker cut-off
    assert json.loads(sent[-1])["commands"] == [{"command": "deleteClient", "username": flooder.device_id}]
    store.close()
    assert cli.main(["coordinator", "devices", "--db", db, "--release", "nobody"]) == 2


def test_a_distribution_auto_contract_admits_the_rounds_distribution_mechanism_only(tmp_path):
    """The demo's finding: a device configured with ``distribution_auto`` enrols with that name, and every one of
    its distribution reports was rejected as off_contract (the validator only knew ``auto``)."""
    import numpy as np

    from coordinator.estimate import estimate_round
    from edge_agent.agent import Agent
    from edge_agent.embed import enrolment, new_identity, numeric, simple_config
    from edge_agent.sources import IterableSource

    key = wire.generate_signing_key()
    store = SQLiteStore(tmp_path / "c.db")
    v = Validator(store)
    rounds = RoundManager(store, key, on_change=v.set_round)
    agents = []
    for i, lat in enumerate(np.linspace(20.0, 180.0, 40)):
        cfg = simple_config(f"d{i}", tmp_path / f"d{i}", [numeric("lat", 0, 200, units="ms")],
                            [{"name": "lat", "dimensions": ["lat"], "mechanism": "distribution_auto", "epsilon": 2.0,
                              "params": {"D": 8}}], total_cap=100.0, coordinator_public_key=wire.public_key_b64(key))
        a = Agent(cfg, IterableSource([{"lat": float(lat)}]), secrets=new_identity(), transport=False).open()
        rec = enrolment(cfg, a.secrets)
        assert rec["streams"] == {"lat": "distribution_auto"}
        store.upsert_device(rec["device_id"], rec["public_key"], contract=rec["streams"])
        agents.append(a)
    v.refresh_devices()
    rc = rounds.open_round("r1", 5.0, {"streams": agents[0].stream_specs()})
    assert rc.params["streams"]["lat"]["mechanism"].startswith("distribution_")
    results = [v.check(wire.report_topic(a.config.device_id), a.handle_round(rc.to_bytes()).commits[0].payload)
               for a in agents]
    assert not [r for r in results if isinstance(r, wire.WireError)]
    store.commit_batch(results, {}, v.statistics)
    assert estimate_round(store, "r1")["lat"].n == len(agents)
    # the same name does not admit a non-distribution mechanism on that stream
    numeric_spec = {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["lat"],
                    "bounds": [[0, 200]]}
    rounds.open_round("r2", 5.0, {"streams": {"lat": numeric_spec}})
    sim = SimFleet(1)
    (dev,) = sim.devices
    (rec,) = sim.enrollment()
    store.upsert_device(rec["device_id"], rec["public_key"], contract={"lat": "distribution_auto"})
    v.refresh_devices()
    (res,) = v.check_batch([dev.report("r2", "lat", "hybrid", {"report": 57})])
    assert res.reason == "off_contract"
    for a in agents:
        a.close()
    store.close()
