"""Distribution streams on the device — config (named mechanisms, distribution_auto), clip +
bucketise + privatize + catalogue codec, the ledger's charge per report, the round contract, and the coordinator
accepting and estimating what the agents send."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.config import ConfigError
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.pipeline import Pipeline
from edge_agent.sources import IterableSource
from protocols import catalogue
from protocols.contract import StreamSpec
from protocols.distribution import choose_distribution_mechanism
from protocols.errors import SpecMismatch

SECRET = bytes(range(32))


def _stream(mechanism="distribution_flat", **kw):
    return {"name": "lat", "dimensions": ["lat"], "mechanism": mechanism, "epsilon": 1.5, **kw}


def _cfg(tmp_path, stream=None, name="dev-d", **kw):
    return simple_config(name, tmp_path / name, [numeric("lat", 0, 200, units="ms"), numeric("cpu", 0, 100)],
                         [stream or _stream(params={"D": 16})], total_cap=1e6, **kw)


@pytest.mark.parametrize("mechanism, params", [("distribution_flat", {"D": 16}),
                                               ("distribution_flat", {"D": 16, "oracle": "olh"}),
                                               ("distribution_hierarchical", {"D": 16, "branching": 2}),
                                               ("distribution_haar", {"D": 16}),
                                               ("distribution_square_wave", {"D": 16})])
def test_stream_spec_and_reports_decode_with_the_catalogue(tmp_path, mechanism, params):
    p = Pipeline(_cfg(tmp_path, _stream(mechanism, params=params)), SECRET)
    plan = p.streams["lat"]
    spec = StreamSpec.model_validate(p.stream_specs()["lat"])
    assert spec.kind == "distribution" and spec.mechanism == mechanism and spec.params["D"] == 16
    assert spec.bounds == [(0.0, 200.0)] and spec.units == ["ms"] and spec.epsilon == pytest.approx(1.5)
    assert plan.charge == pytest.approx(1.5)
    rec = p.observe({"lat": 250.0, "cpu": 1.0})  # clipped to the bound
    assert rec.clipped == ("lat",)
    (rep,) = p.prepare(rec)
    body = rep.make_body()
    rows = spec.entry.decode_rows(spec.build(), [body["report"]])
    assert rows.shape == (1, *spec.entry.row_shape(spec.build()))
    assert spec.entry.statistics(spec.build(), rows).n == 1


def test_the_value_is_bucketised_on_the_public_grid(tmp_path, monkeypatch):
    p = Pipeline(_cfg(tmp_path), SECRET)
    plan = p.streams["lat"]
    seen = []
    real = type(plan.mechanism).privatize

    def spy(self, values, rng):
        seen.append(np.asarray(values).tolist())
        return real(self, values, rng)

    monkeypatch.setattr(type(plan.mechanism), "privatize", spy)
    for x, bucket in [(0.0, 0), (12.4, 0), (12.5, 1), (199.0, 15), (200.0, 15), (-5.0, 0), (999.0, 15)]:
        (rep,) = p.prepare(p.observe({"lat": x, "cpu": 1.0}))
        rep.make_body()
        assert seen[-1] == [bucket], x


def test_distribution_auto_follows_choose_distribution_mechanism(tmp_path):
    p = Pipeline(_cfg(tmp_path, _stream("distribution_auto", params={"D": 64, "query": "quantile"})), SECRET)
    plan = p.streams["lat"]
    want = choose_distribution_mechanism(1.5, 64, "quantile").mechanism
    assert type(plan.mechanism) is type(want) and plan.mechanism.method == want.method
    spec = StreamSpec.model_validate(p.stream_specs()["lat"])
    assert spec.build().method == want.method  # the coordinator rebuilds exactly the device's mechanism
    default = Pipeline(_cfg(tmp_path, _stream("distribution_auto"), name="dev-e"), SECRET).streams["lat"]
    assert default.mechanism.D == 64
    # the choice is analytic: a fleet's agents in one process share it (computed once per ε, D, query, length)
    again = Pipeline(_cfg(tmp_path, _stream("distribution_auto", params={"D": 64, "query": "quantile"}),
                          name="dev-f"), SECRET).streams["lat"]
    assert again.mechanism is plan.mechanism


@pytest.mark.parametrize("stream, match", [
    (_stream(params={"D": 12}), "power of two"),
    (_stream(params={"D": True}), "power of two"),
    ({**_stream(), "dimensions": ["lat", "cpu"]}, "exactly one numeric dimension"),
    (_stream("distribution_auto", params={"D": 8, "oracle": "oue"}), "takes only"),
    (_stream("distribution_auto", params={"query": "nope"}), "distribution_auto"),
    (_stream(params={"D": 16, "oracle": "grr"}), "oracle"),
])
def test_bad_distribution_configs_are_refused(tmp_path, stream, match):
    with pytest.raises(ConfigError, match=match):
        Pipeline(_cfg(tmp_path, stream), SECRET)


def test_device_unit_ledger_charges_epsilon_per_report(tmp_path):
    readings = [{"lat": 40.0, "cpu": 1.0}] * 3 + [{"lat": 41.0, "cpu": 1.0}]
    agent = Agent(_cfg(tmp_path), IterableSource(readings), secrets=new_identity(), transport=False).open()
    for t in range(4):
        out = agent.report(f"r{t}")
        assert len(out.commits) == 1 and not out.commits[0].memo_hit
        assert out.commits[0].charged == pytest.approx(1.5)
    assert agent.state.spent() == pytest.approx(6.0) and agent.state.status()["memo_entries"] == 0
    assert agent.state.spent_by_unit() == {"device": pytest.approx(6.0)}
    agent.close()


def test_value_unit_memoizes_by_the_bucket(tmp_path):
    # 40 and 41 share bucket 3 of [0, 200] / 16 (width 12.5); 60 is bucket 4
    readings = [{"lat": 40.0, "cpu": 1.0}, {"lat": 41.0, "cpu": 1.0}, {"lat": 60.0, "cpu": 1.0}]
    cfg = _cfg(tmp_path, _stream(params={"D": 16}, unit="value"))
    agent = Agent(cfg, IterableSource(readings), secrets=new_identity(), transport=False).open()
    hits = [agent.report(f"r{t}").commits[0] for t in range(3)]
    assert [c.memo_hit for c in hits] == [False, True, False]
    assert [c.charged for c in hits] == pytest.approx([1.5, 0.0, 1.5])
    assert agent.state.spent() == pytest.approx(3.0) and agent.state.status()["memo_entries"] == 2
    agent.close()


def test_round_contract_for_a_distribution_stream(tmp_path):
    p = Pipeline(_cfg(tmp_path), SECRET)
    own = p.stream_specs()["lat"]
    assert p.plan_for("lat", own) is p.streams["lat"]
    other = p.plan_for("lat", {**own, "mechanism": "distribution_haar", "params": {"epsilon": 1.0, "D": 32}})
    assert other.mechanism_name == "distribution_haar" and other.mechanism.D == 32 and other.charge == 1.0
    with pytest.raises(SpecMismatch, match="epsilon"):
        p.plan_for("lat", {**own, "params": {**own["params"], "epsilon": 3.0}})
    with pytest.raises(SpecMismatch, match="kind"):
        p.plan_for("lat", {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["lat"],
                           "bounds": [[0, 200]]})
    with pytest.raises(SpecMismatch, match="bounds"):
        p.plan_for("lat", {**own, "bounds": [[0, 100]]})
    numeric_dev = Pipeline(simple_config("n", tmp_path / "n", [numeric("lat", 0, 200)],
                                         [{"name": "lat", "dimensions": ["lat"], "mechanism": "hybrid"}]), SECRET)
    with pytest.raises(SpecMismatch, match="kind"):
        numeric_dev.plan_for("lat", own)


def test_agents_reports_are_accepted_and_estimated_by_the_coordinator(tmp_path):
    from coordinator.estimate import estimate_round
    from coordinator.rounds import RoundManager
    from coordinator.store import SQLiteStore
    from coordinator.validate import Validator
    from protocols import wire

    key = wire.generate_signing_key()
    store = SQLiteStore(tmp_path / "c.db")
    v = Validator(store)
    rounds = RoundManager(store, key, on_change=v.set_round)
    rng = np.random.default_rng(7)
    n = 150
    values = rng.uniform(20, 120, n)
    agents = []
    for i in range(n):
        cfg = _cfg(tmp_path, _stream(params={"D": 8}, epsilon=4.0), name=f"a{i}",
                   coordinator_public_key=wire.public_key_b64(key), privacy={"max_round_epsilon": 10.0})
        a = Agent(cfg, IterableSource([{"lat": float(values[i]), "cpu": 1.0}]), secrets=new_identity(),
                  transport=False).open()
        store.upsert_device(cfg.device_id, a.secrets.public_key_b64)
        agents.append(a)
    v.refresh_devices()  # enrolled after the validator started: as `coordinator enroll-device` notifies it
    rc = rounds.open_round("r1", 50.0, {"streams": agents[0].stream_specs()})
    accepted = [v.check(wire.report_topic(a.config.device_id), a.handle_round(rc.to_bytes()).commits[0].payload)
                for a in agents]
    assert not any(isinstance(r, wire.WireError) for r in accepted)
    store.commit_batch(accepted, {}, v.statistics)
    v.batch_committed()
    est = estimate_round(store, "r1", level=0.99)["lat"]
    assert est.error is None and est.n == n and est.kind == "distribution" and est.units == ["ms"]
    med = next(q for q in est.quantiles if q["q"] == 0.5)
    assert med["low"] <= np.median(values) <= med["high"]
    for a in agents:
        a.close()
