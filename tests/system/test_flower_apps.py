"""ServerApp and ClientApp without Ray: round verification and ε clamping on the device, validation on the
coordinator, stragglers, tampered reports, interactive planning (a loopback Grid short-circuits the SuperLink)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from coordinator.flower_app import FlowerCoordinator, FlowerSettings  # noqa: E402
from coordinator.rounds import plan_round  # noqa: E402
from protocols.contract import parse_round_params  # noqa: E402
from coordinator.store import open_store  # noqa: E402
from edge_agent.agent import Agent  # noqa: E402
from edge_agent.embed import new_identity  # noqa: E402
from edge_agent.flower_app import (  # noqa: E402
    OPEN_AGENTS,
    DeviceShard,
    DeviceSpec,
    make_client_app,
    raise_fd_limit,
)
from edge_agent.rounds import RoundCheck, answer_round  # noqa: E402
from edge_agent.sources import IterableSource  # noqa: E402
from protocols import wire  # noqa: E402
from simulations.flower_sim import SimFleetSpec, SimHostFactory, device_config, round_params  # noqa: E402

from .loopback import LoopbackGrid  # noqa: E402

pytestmark = pytest.mark.integration


def _spec(fast_path, key, n=40, shard=10, **kw) -> SimFleetSpec:
    return SimFleetSpec(run_id=f"t-{fast_path.name}", n_devices=n, shard_size=shard, state_root=str(fast_path / "dev"),
                        coordinator_public_key=wire.public_key_b64(key), **kw)


@pytest.fixture(autouse=True)
def _close_agents():
    yield
    OPEN_AGENTS.close_all()


def _round(key, round_id="r1", epsilon=3.0, params=None, **kw) -> bytes:
    rc = wire.RoundConfig(round_id=round_id, protocol="flower", epsilon=epsilon, params=params or {}, **kw)
    return wire.sign_round(rc, key).to_bytes()


def _agent(fast_path, key, **privacy) -> Agent:
    spec = _spec(fast_path, key)
    cfg = device_config(spec, 7)
    if privacy:
        cfg = cfg.model_copy(update={"privacy": cfg.privacy.model_copy(update=privacy)})
    agent = Agent(cfg, source=IterableSource([{"age": 5, "edu": 3, "syn": 100}] * 20), secrets=new_identity(),
                  transport=False)
    return agent.open()


def test_device_verifies_and_answers_once(fast_path):
    key = wire.generate_signing_key()
    params = round_params(_spec(fast_path, key))
    agent = _agent(fast_path, key)
    try:
        status, outcome = answer_round(agent, _round(key, params=params))
        assert status == "answered" and len(outcome.commits) == 3
        assert sum(c.charged for c in outcome.commits) == pytest.approx(3.0)
        assert answer_round(agent, _round(key, params=params))[0] == "seen"  # a round is answered at most once
        forged = _round(wire.generate_signing_key(), "r2", params=params)
        assert answer_round(agent, forged) == ("bad_signature", None)
        tampered = json.loads(_round(key, "r3", params=params))
        tampered["epsilon"] = 0.5
        assert answer_round(agent, json.dumps(tampered).encode()) == ("bad_signature", None)
        assert answer_round(agent, b"{not json") == ("malformed", None)
        assert answer_round(agent, _round(key, "r4", params=params, not_after=1.0))[0] == "expired"
        assert agent.state.spent() == pytest.approx(3.0)
    finally:
        agent.close()


def test_device_clamps_epsilon_to_its_maximum(fast_path):
    key = wire.generate_signing_key()
    params = round_params(_spec(fast_path, key))
    agent = _agent(fast_path, key, max_round_epsilon=2.0)
    try:
        status, outcome = answer_round(agent, _round(key, epsilon=50.0, params=params))
        assert status == "answered_clamped"
        assert sum(c.charged for c in outcome.commits) == pytest.approx(2.0)  # the third stream exceeds the clamp
        assert [reason for _, reason in outcome.refused] == ["round_budget"]
    finally:
        agent.close()
    refusing = _agent(fast_path / "b", key, max_round_epsilon=2.0, round_policy="refuse")
    try:
        assert answer_round(refusing, _round(key, epsilon=50.0, params=params)) == ("refused_epsilon", None)
        assert refusing.state.spent() == 0.0
    finally:
        refusing.close()


def test_device_skips_streams_it_would_misreport(fast_path):
    key = wire.generate_signing_key()
    params = round_params(_spec(fast_path, key))
    params["streams"]["age"]["params"] = {"epsilon": 2.0}  # more than the device's ε
    params["streams"]["edu"]["mechanism"] = "grr"  # another oracle within the device's ε: followed (one contract)
    params["streams"]["syn"]["mechanism"] = "hybrid"  # a numeric mechanism for a categorical stream
    agent = _agent(fast_path, key)
    try:
        status, outcome = answer_round(agent, _round(key, params=params))
        assert status == "answered"
        assert [c.topic for c in outcome.commits] == [wire.report_topic(agent.config.device_id)]
        assert wire.decode_report(outcome.commits[0].payload).mechanism == "grr"
        assert sorted(outcome.refused) == [("age", "spec_epsilon"), ("syn", "spec_mechanism")]
        assert agent.state.spent() == pytest.approx(1.0)
        bounds = round_params(_spec(fast_path, key))
        bounds["streams"] = {"age": {**bounds["streams"]["age"], "bounds": [[0.0, 100.0]]}}
        status, outcome = answer_round(agent, _round(key, "r2", params=bounds))
        assert status == "no_streams" and not outcome.commits and outcome.refused == [("age", "spec_bounds")]
    finally:
        agent.close()


def _coordinator(fast_path, spec_factory, rounds=2, **kw):
    key = wire.generate_signing_key()
    spec = spec_factory(key)
    store = open_store(fast_path / "coord.sqlite3")
    settings = FlowerSettings(base_params=round_params(spec), rounds=rounds, epsilon=spec.max_round_epsilon,
                              enroll="announce", send_time=True, timeout=kw.pop("timeout", 30.0), node_wait=0, **kw)
    return spec, store, FlowerCoordinator(store, key, settings)


@pytest.mark.parametrize("signature", ["ed25519", "hmac-sha256"])
def test_rounds_over_loopback_grid(fast_path, signature):
    # the value unit (memoized reports): the memo-hit path over Flower; the device unit is the default elsewhere
    spec, store, coord = _coordinator(fast_path, lambda k: _spec(fast_path, k, n=40, shard=10, signature=signature,
                                                                 unit="value"))
    grid = LoopbackGrid(make_client_app(SimHostFactory(spec)), {100 + p: {"partition-id": p} for p in range(4)})
    try:
        s1, s2 = coord.run(grid)
        assert (s1.nodes_replied, s1.accepted, dict(s1.rejected)) == (4, 120, {})
        assert s1.device_counters["status.answered"] == 40 and s1.device_counters["charged_reports"] == 120
        # round 2 was planned from round 1's published aggregates only
        assert s2.config.depends_on == [s1.round_id]
        planned = plan_round(parse_round_params(round_params(spec)), [(s1.round_id, s1.estimates)])
        assert s2.config.params == planned.model_dump(mode="json", exclude_none=True)
        # edu is static: served from the memo at no cost; age is reported on round 2's planned α-rounding grid
        # (devices follow the rounds' nested rounding steps): one new memo entry, the same one in later rounds
        assert s2.device_counters["memo_hits"] >= 40
        for s in (s1, s2):
            assert all(e.error is None and e.n == 40 for e in s.estimates.values())
        # device ledgers: round 1 charged ε for each of 3 streams; round 2 only for new memo entries
        agent = OPEN_AGENTS.agents[str(device_config(spec, 0).state_dir)]
        assert agent.state.spent() <= 6.0 + 1e-9 and agent.state.check_invariants()["ok"]
        # the devices' report keys: what the coordinator enrolled from the announcement checks their reports
        assert agent.secrets.algorithm == signature
        assert store.devices()[agent.config.device_id][0] == agent.secrets.public_key_b64
    finally:
        store.close()


def test_stragglers_tampering_and_node_errors(fast_path):
    spec, store, coord = _coordinator(fast_path, lambda k: _spec(fast_path, k, n=30, shard=10), rounds=1, timeout=1.0)
    app = make_client_app(SimHostFactory(spec))
    grid = LoopbackGrid(app, {1: {"partition-id": 0}, 2: {"partition-id": 1}, 3: {"partition-id": 2}})
    try:
        coord.announce(grid, [1, 2, 3])
        grid.slow = {3}  # node 3 never answers: the round goes on without it after the timeout
        summary = coord.run_round(grid, 0, [1, 2, 3])
        assert (summary.nodes_asked, summary.nodes_replied, summary.accepted) == (3, 2, 60)
        assert summary.estimates["age"].n == 20
        # a report altered in transit fails the device signature; a replayed one is a duplicate
        agent = OPEN_AGENTS.get(SimHostFactory(spec)({"partition-id": 0}).devices[0])
        good = [r for r in agent.state.ledger_rows()][0]
        assert good["round_id"] == summary.round_id
        cfg2 = coord.open_round(1)
        status, outcome = answer_round(agent, cfg2.to_bytes())
        commit = outcome.commits[0]
        body = json.loads(commit.payload)
        body["body"]["report"] = 0.0 if not isinstance(body["body"]["report"], list) else body["body"]["report"]
        body["seq"] += 1000
        accepted, rejected = coord.ingest([commit.topic, commit.topic, commit.topic],
                                          [json.dumps(body).encode(), commit.payload, commit.payload])
        assert accepted == 1 and rejected["bad_signature"] == 1 and rejected["duplicate"] == 1
        # a node whose ClientApp fails is counted, not fatal
        bad = LoopbackGrid(make_client_app(lambda cfg: (_ for _ in ()).throw(RuntimeError("disk full"))), {9: {}})
        s = coord.run_round(bad, 2, [9])
        assert s.node_errors == 1 and s.accepted == 0
    finally:
        store.close()


def test_shard_reply_resends_pending_reports(fast_path):
    key = wire.generate_signing_key()
    spec = _spec(fast_path, key, n=2, shard=2)
    shard = SimHostFactory(spec)({"partition-id": 0})
    agents = shard.agents()
    params = round_params(spec)
    # a report committed but never sent (e.g. a crash before the reply) goes out with the next reply
    answer_round(agents[0], _round(key, "r0", params=params))
    answer = shard.answer(_round(key, "r1", params=params), t=1)
    assert len(answer.payloads) == 3 + 3 + 3 and answer.counters["status.answered"] == 2
    ids = {wire.decode_report(p).device_id for p in answer.payloads}
    assert ids == {a.config.device_id for a in agents}
    rounds = sorted({wire.decode_report(p).round_id for p in answer.payloads})
    assert rounds == ["r0", "r1"]
    assert dataclasses.is_dataclass(answer) and np.all([isinstance(p, bytes) for p in answer.payloads])
    # the replied rows are marked sent in each device's next transaction (one commit per device round)
    assert [a.sent_unmarked for a in agents] == [6, 3] and [a.state.pending_count() for a in agents] == [6, 3]
    answer2 = shard.answer(_round(key, "r2", params=params), t=2)
    assert len(answer2.payloads) == 6 and {wire.decode_report(p).round_id for p in answer2.payloads} == {"r2"}
    assert [a.state.pending_count() for a in agents] == [3, 3]
    # a crash before the marks were written: the next reply carries those reports again (the coordinator drops
    # the copies as duplicates); no report is lost and none is charged twice
    lost = agents[1]
    spent = lost.state.spent()
    OPEN_AGENTS.agents.pop(str(lost.config.state_dir))
    lost.state.close()  # the process died: the in-memory marks are gone
    answer3 = shard.answer(_round(key, "r3", params=params), t=3)
    again = [wire.decode_report(p) for p in answer3.payloads if wire.decode_report(p).device_id == lost.config.device_id]
    assert sorted(r.round_id for r in again) == ["r2"] * 3 + ["r3"] * 3
    reborn = OPEN_AGENTS.get(shard.devices[1])
    assert reborn is not lost and reborn.boot == 2 and reborn.state.check_invariants()["ok"]
    assert reborn.state.spent() >= spent  # r3 may charge (new readings); nothing was refunded or charged twice
    for a in (agents[0], reborn):  # close writes the last marks
        a.flush_sent()
        assert a.state.pending_count() == 0 and a.sent_unmarked == 0


def test_shard_without_deferral_marks_replied_reports_sent_at_once(fast_path):
    key = wire.generate_signing_key()
    spec = _spec(fast_path, key, n=2, shard=2)
    shard = DeviceShard([DeviceSpec(device_config(spec, i), create_identity=True,
                                    source=lambda: IterableSource([{"age": 5, "edu": 3, "syn": 100}] * 5))
                         for i in range(2)])
    agents = shard.agents()
    answer = shard.answer(_round(key, "r1", params=round_params(spec)))
    assert len(answer.payloads) == 6
    assert all(a.state.pending_count() == 0 and a.sent_unmarked == 0 for a in agents)


def test_shard_verifies_a_round_once_and_every_device_answers(fast_path):
    key = wire.generate_signing_key()
    spec = _spec(fast_path, key, n=6, shard=6)
    shard = SimHostFactory(spec)({"partition-id": 0})
    params = round_params(spec)
    answer = shard.answer(_round(key, "r1", params=params), t=0)
    assert answer.counters["status.answered"] == 6 and len(answer.payloads) == 18
    forged = shard.answer(_round(wire.generate_signing_key(), "r2", params=params), t=1)
    assert forged.counters["status.bad_signature"] == 6 and not forged.payloads
    # one decode + verification per (coordinator key, payload) stands for every device of the shard
    check = RoundCheck()
    payload = _round(key, "r3", params=params)
    statuses = [answer_round(a, payload, check=check)[0] for a in shard.agents()]
    assert statuses == ["answered"] * 6 and check.verified == 1
    # the shared check hands every device the same validated stream specs: the same plans as a fresh check
    a = shard.agents()[0]
    _, _, shared = check(payload, a.coordinator_key)
    assert a.pipeline.round_plans(shared).plans.keys() == a.pipeline.round_plans(params).plans.keys()
    assert RoundCheck(memo=False)(payload, None)[0] == "no_coordinator_key"


def test_agents_beyond_capacity_are_suspended_not_rebooted(fast_path):
    key = wire.generate_signing_key()
    spec = _spec(fast_path, key, n=8, shard=8)
    saved = (OPEN_AGENTS.max_open, OPEN_AGENTS.capacity)
    try:
        assert OPEN_AGENTS.configure(devices=8, max_open=3) == 3
        opened, reattached = OPEN_AGENTS.opened, OPEN_AGENTS.reattached
        shard = SimHostFactory(spec)({"partition-id": 0})
        shard.announce()
        params = round_params(spec)
        for r in range(3):
            answer = shard.answer(_round(key, f"r{r}", params=params), t=r)
            assert answer.counters["status.answered"] == 8 and len(answer.payloads) == 24
        assert OPEN_AGENTS.opened - opened == 8  # every agent built and opened once: its pipeline survives suspension
        assert OPEN_AGENTS.reattached - reattached == 5 * 3  # the 5 beyond capacity reattach their database each round
        suspended = [a for a in OPEN_AGENTS.agents.values() if a.state is None]
        assert len(suspended) == 5
        for spec_ in shard.devices:
            agent = OPEN_AGENTS.get(spec_)
            assert agent.state.boot == 1 and agent.boot == 1  # a reattachment is not a reboot
            assert agent.state.check_invariants()["ok"] and agent.state.pending_count() == agent.sent_unmarked == 3
            assert agent.state.round_seen("r2") == "answered"
            OPEN_AGENTS.release(agent)
    finally:
        OPEN_AGENTS.close_all()
        OPEN_AGENTS.max_open, OPEN_AGENTS.capacity = saved


def test_hosted_suspended_agents_reattach_for_one_round_and_resident_ones_keep_their_bounds(fast_path):
    from edge_agent.state import HOSTED_CACHE_PAGES

    key = wire.generate_signing_key()
    spec = _spec(fast_path, key, n=3, shard=3)
    saved = (OPEN_AGENTS.max_open, OPEN_AGENTS.capacity, OPEN_AGENTS.hosted)
    try:
        assert OPEN_AGENTS.configure(devices=3, max_open=1, hosted=True) == 1
        shard = SimHostFactory(spec)({"partition-id": 0})
        shard.announce()
        answer = shard.answer(_round(key, "r0", params=round_params(spec)), t=0)
        assert answer.counters["status.answered"] == 3
        assert len(OPEN_AGENTS.resident & {s.key for s in shard.devices}) == 1  # the other two are suspended
        for spec_ in shard.devices:
            agent = OPEN_AGENTS.get(spec_)  # a suspended agent: a one-round connection (State transient)
            db = agent.state._db
            pragmas = {p: db.execute(f"PRAGMA {p}").fetchone()[0]
                       for p in ("cache_size", "synchronous", "locking_mode", "journal_mode")}
            assert pragmas["synchronous"] == 2 and pragmas["journal_mode"] == "wal"
            assert pragmas["locking_mode"] == "exclusive"
            if spec_.key in OPEN_AGENTS.resident:  # kept open: its page cache and WAL stay bounded
                assert pragmas["cache_size"] == HOSTED_CACHE_PAGES
            else:
                assert pragmas["cache_size"] != HOSTED_CACHE_PAGES
            OPEN_AGENTS.release(agent, spec_.key)
    finally:
        OPEN_AGENTS.close_all()
        OPEN_AGENTS.max_open, OPEN_AGENTS.capacity, OPEN_AGENTS.hosted = saved


def test_descriptor_limit_and_memory_policy():
    import resource

    from simulations.flower_sim import (MEMORY_SHARE, SIM_OVERHEAD_BYTES, DeviceFootprint, default_max_open,
                                        memory_needed)

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_fd_limit(64) >= min(64, soft if soft != resource.RLIM_INFINITY else 64)
    gib, kib = 1 << 30, 1 << 10
    fp = DeviceFootprint(open_rss=250 * kib, open_files=150 * kib, closed_rss=20 * kib, closed_files=80 * kib,
                         devices=400, rounds=2)
    assert default_max_open(10_000, 2, fp, 24 * gib) == 5_000  # 10,000 open databases fit the share of 24 GiB
    assert memory_needed(10_000, 2, 5_000, fp) <= MEMORY_SHARE * 24 * gib
    # 100,000 do not: one stays open per host (a reattachment's cost grows with the databases held open)
    assert default_max_open(100_000, 2, fp, 24 * gib) == 1
    assert memory_needed(100_000, 2, 1, fp) < 24 * gib
    assert default_max_open(100_000, 2, fp, 100 * gib) == 50_000
    assert SIM_OVERHEAD_BYTES + 100_000 * fp.open_bytes <= MEMORY_SHARE * 100 * gib


@pytest.mark.slow
def test_measured_footprint_open_costs_more_than_closed():
    from simulations.flower_sim import measure_footprint

    fp = measure_footprint(devices=40, rounds=1)
    assert fp.open_rss > fp.closed_rss  # an open device holds its SQLite connection
    assert fp.open_files > fp.closed_files > 0  # and its WAL
