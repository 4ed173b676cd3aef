"""The device ↔ coordinator contract: rounds built from the devices' stream specs, answered by real agents,
validated, stored and decoded by the coordinator with the same mechanism objects (HaarRecord, longitudinal
protocols); bounds are the device's; rounding steps and mechanisms within the device's ε are followed."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.estimate import estimate_round
from coordinator.rounds import RoundManager
from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, simple_config
from edge_agent.sources import CallableSource
from protocols import wire
from protocols.longitudinal import LOLOHA
from protocols.memo_key import slot_key as protocol_memo_key
from protocols.longitudinal.memo import encode_value
from tests.edge_agent.signed_rounds import CONTRACT_DIMS as DIMS, CONTRACT_STREAMS as STREAMS

COORD = wire.generate_signing_key()


def _cfg(i, tmp_path, streams=STREAMS, dims=DIMS, unit="value"):
    """Most tests here check memo keys and memo hits: the ``value`` unit (memoized); the device unit is tested
    where it differs."""
    return simple_config(f"dev-{i:04d}", tmp_path / f"d{i}", dims, streams,
                         coordinator_public_key=wire.public_key_b64(COORD), total_cap=1e6,
                         privacy={"epsilon": 1.0, "max_round_epsilon": 10.0, "unit": unit})


def _round(rid, params, eps=10.0, **kw):
    return wire.sign_round(wire.RoundConfig(round_id=rid, protocol="t", epsilon=eps, params=params, **kw), COORD)


def _fleet(tmp_path, n, rng, unit="value"):
    data = {
        "age": rng.uniform(17, 90, n), "hours": rng.normal(40, 12, n).clip(1, 99), "edu": rng.integers(1, 17, n),
        "load": rng.uniform(10, 60, n), "sex": rng.integers(0, 2, n), "app": rng.choice(6, n, p=[.4, .3, .1, .1, .1, 0]),
    }
    agents = []
    for i in range(n):
        row = {k: (int(v[i]) if k in ("sex", "app") else float(v[i])) for k, v in data.items()}
        agents.append(Agent(_cfg(i, tmp_path, unit=unit), CallableSource(lambda r=row: dict(r)), secrets=new_identity(),
                            transport=False).open())
    return agents, data


@pytest.mark.parametrize("unit", ["device", "value"])
def test_round_from_device_specs_is_answered_validated_and_decoded_within_intervals(tmp_path, unit):
    rng = np.random.default_rng(11)
    n = 240
    agents, data = _fleet(tmp_path, n, rng, unit)
    store = SQLiteStore(tmp_path / "c.db")
    for a in agents:
        store.upsert_device(a.config.device_id, a.secrets.public_key_b64)
    validator = Validator(store)
    rounds = RoundManager(store, COORD, on_change=validator.set_round)
    params = {"streams": agents[0].stream_specs()}
    for rid in ("r1", "r2"):
        rc = rounds.open_round(rid, 7.0, params)
        accepted = []
        for a in agents:
            out = a.handle_round(rc.to_bytes())
            assert out is not None and not out.refused and len(out.commits) == 4
            accepted += [validator.check(wire.report_topic(a.config.device_id), c.payload) for c in out.commits]
        assert store.commit_batch(accepted, {}) == 4 * n
    charges = [c["epsilon"] for c in agents[0].state.ledger_rows(stream="app")]
    if unit == "value":  # the longitudinal stream: ε∞ once per memo slot, a fresh IRR each round
        assert charges == [2.0]
    else:  # every report charged the IRR's ε for an arbitrary input change
        irr = LOLOHA(2.0, 1.0, 6, g=3).epsilon_irr
        assert charges == pytest.approx([irr, irr])
        assert all(r["unit"] == "device" for r in agents[0].state.ledger_rows())
    est = estimate_round(store, "r1", level=0.9999)
    truth = {"profile": [data["age"].mean(), data["hours"].mean(), data["edu"].mean()], "load": [data["load"].mean()],
             "sex": np.bincount(data["sex"], minlength=2) / n, "app": np.bincount(data["app"], minlength=6) / n}
    for stream, t in truth.items():
        e = est[stream]
        assert e.error is None and e.n == n and e.unit == unit, (stream, e.error)
        assert np.all(np.asarray(e.ci_low) <= t) and np.all(np.asarray(t) <= e.ci_high), (stream, t, e)
    assert est["profile"].kind == "haar" and est["app"].kind == "longitudinal"
    for a in agents:
        a.close()


def test_bounds_differing_from_the_device_are_refused_not_adopted(tmp_path):
    a = Agent(_cfg(0, tmp_path), CallableSource(lambda: {"age": 30.0, "hours": 40.0, "edu": 9, "load": 50.0,
                                                         "sex": 1, "app": 2}),
              secrets=new_identity(), transport=False).open()
    specs = a.stream_specs()
    specs["load"]["bounds"] = [[0, 200]]
    specs["profile"]["dims"] = ["hours", "age", "edu"]
    out = a.handle_round(_round("r1", {"streams": specs}).to_bytes())
    assert sorted(out.refused) == [("load", "spec_bounds"), ("profile", "spec_dims")]
    assert {wire.decode_report(c.payload).stream for c in out.commits} == {"sex", "app"}
    assert a.stats["rounds.stream_refused.bounds"] == 1 and a.state.spent(stream="load") == 0
    a.close()


def test_round_rounding_steps_are_followed_with_the_device_offset(tmp_path):
    values: list[float] = []
    a = Agent(_cfg(0, tmp_path), CallableSource(lambda: {"age": 30.0, "hours": 40.0, "edu": 9, "load": values.pop(0),
                                                         "sex": 1, "app": 2}),
              secrets=new_identity(), transport=False).open()
    spec = a.stream_specs()["load"]
    coarse = dict(spec, rounding=[16.0])  # (hi - lo)/K_base · 2^4: the device's own nested grid
    rounder = a.pipeline._rounding["load"].rounder
    # four readings within 0.9 of each other, moved clear of the device's (random) cell boundary on that grid
    for shift in np.arange(0.0, 16.0, 1.0):
        readings = [50.3 + shift, 50.9 + shift, 51.2 + shift, 50.4 + shift]
        expected = [float(rounder.round([x], [16.0])[0]) for x in readings]
        if len(set(expected)) == 1:
            break
    values.extend(readings + [12.0])
    charged = []
    for i in range(4):
        out = a.handle_round(_round(f"r{i}", {"streams": {"load": coarse}}).to_bytes())
        charged.append(out.charged)
    assert len(set(expected)) == 1 and charged == [1.0, 0.0, 0.0, 0.0]  # one grid point: one memo entry
    exact = dict(spec, rounding=[None])  # the device α-rounds 'load': a round may not ask for the exact value
    out = a.handle_round(_round("r9", {"streams": {"load": exact}}).to_bytes())
    assert out.refused == [("load", "spec_rounding")] and out.charged == 0.0
    with pytest.raises(ValueError, match="rounding"):
        a.pipeline.plan_for("load", dict(spec, rounding=[1000.0]))
    a.close()


def test_longitudinal_memo_key_is_the_protocol_key_and_every_report_is_fresh(tmp_path):
    ident = new_identity()
    a = Agent(_cfg(0, tmp_path, streams=[STREAMS[3]], dims=[categorical("app", 6)]),
              CallableSource(lambda: {"app": 4}), secrets=ident, transport=False).open()
    plan = a.pipeline.streams["app"]
    client = a.pipeline._client(plan)
    slot = client._slot(4)
    key = protocol_memo_key(ident.hmac_secret, f"app/LOLOHA/{plan.mechanism.fingerprint()}", encode_value(slot))
    bodies, charges = [], []
    for i in range(40):
        out = a.report(f"r{i}")
        (c,) = out.commits
        bodies.append(tuple(c.body["report"]))
        charges.append(c.charged)
    rows = list(a.state.ledger_rows())
    assert [r["memo_key"] for r in rows] == [key] and charges == [2.0] + [0.0] * 39
    seeds = {b[0] for b in bodies}
    assert len(seeds) == 1  # the hash seed is fixed for life
    assert len({b[1] for b in bodies}) > 1  # fresh IRR: the reported hash value varies
    a.close()
    # a restarted agent keeps the seed (derived from the secret) and the memo (durable)
    b = Agent(_cfg(0, tmp_path, streams=[STREAMS[3]], dims=[categorical("app", 6)]),
              CallableSource(lambda: {"app": 4}), secrets=ident, transport=False).open()
    (c,) = b.report("again").commits
    assert c.charged == 0.0 and c.body["report"][0] in seeds
    b.close()


def test_round_mechanism_within_budget_for_haar_and_longitudinal(tmp_path):
    a = Agent(_cfg(0, tmp_path), CallableSource(lambda: {"age": 30.0, "hours": 40.0, "edu": 9, "load": 5.0,
                                                         "sex": 1, "app": 2}),
              secrets=new_identity(), transport=False).open()
    specs = a.stream_specs()
    specs["profile"]["params"] = {"epsilon": 1.0, "d": 3, "mean_mechanism": "piecewise",
                                  "detail_mechanism": "duchi_md", "split": 0.5}
    specs["app"]["params"] = dict(specs["app"]["params"], epsilon_inf=1.5, epsilon_1=0.5)
    out = a.handle_round(_round("r1", {"streams": specs}).to_bytes())
    reps = {wire.decode_report(c.payload).stream: c for c in out.commits}
    assert not out.refused and reps["profile"].charged == 1.0 and reps["app"].charged == 1.5
    body = reps["profile"].body["report"]
    assert set(body) == {"mean", "detail"} and len(body["detail"]) == 3
    specs["app"]["params"] = dict(specs["app"]["params"], epsilon_inf=3.0)
    specs["profile"]["kind"] = "vector"
    specs["profile"]["mechanism"] = "ksampling"
    specs["profile"]["params"] = {"epsilon": 5.0, "d": 3}
    out = a.handle_round(_round("r2", {"streams": specs}).to_bytes())
    assert ("app", "spec_epsilon") in out.refused and ("profile", "spec_epsilon") in out.refused
    a.close()


def test_heavy_hitter_rounds_map_values_to_the_rounds_items(tmp_path):
    from protocols.contract import HeavyHitterSpec, heavy_hitter_items

    dims = [categorical("country", 41)]
    streams = [{"name": "country", "dimensions": ["country"], "mechanism": "oue", "epsilon": 1.0}]
    a = Agent(_cfg(0, tmp_path, streams=streams, dims=dims), CallableSource(lambda: {"country": 38}),
              secrets=new_identity(), transport=False).open()
    spec = a.stream_specs()["country"]
    first = HeavyHitterSpec(bits=6, prefix_bits=0, step_bits=2, candidates=[0])
    second = HeavyHitterSpec(bits=6, prefix_bits=2, step_bits=2, candidates=[1, 2])  # 38 = 0b100110: prefix 0b10
    charged = []
    for rid, hh in (("h1", first), ("h1b", first), ("h2", second)):
        s = dict(spec, params={"epsilon": 1.0, "k": hh.k}, heavy_hitters=hh.model_dump())
        out = a.handle_round(_round(rid, {"streams": {"country": s}}).to_bytes())
        (c,) = out.commits
        assert len(c.body["report"]) == hh.k  # OUE over the round's items
        charged.append(c.charged)
    assert charged == [1.0, 0.0, 1.0]  # same round spec: memo hit; new candidates: a new memo entry
    assert int(heavy_hitter_items(second, [38])[0]) == 1 * 4 + 0b01
    bad = dict(spec, params={"epsilon": 1.0, "k": 5},
               heavy_hitters=HeavyHitterSpec(bits=5, prefix_bits=0, step_bits=2, candidates=[0]).model_dump())
    out = a.handle_round(_round("h3", {"streams": {"country": bad}}).to_bytes())
    assert out.refused == [("country", "spec_shape")]
    a.close()
