"""Round configs: signatures verified with the coordinator key, ε clamped or refused, one answer per round."""

from __future__ import annotations

import time

import pytest

from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from protocols import wire
from tests.edge_agent.signed_rounds import GAUSS_LOAD, HYBRID_LOAD, round_config, signed_round

COORD = wire.generate_signing_key()


def _agent(tmp_path, policy="clamp", key=COORD):
    cfg = simple_config(
        "dev-r", tmp_path / "s",
        [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)],
        [{"name": "cpu", "dimensions": ["cpu"]}, {"name": "temp", "dimensions": ["temp"]},
         {"name": "mode", "dimensions": ["mode"]}],
        coordinator_public_key=wire.public_key_b64(key),
        privacy={"max_round_epsilon": 2.0, "round_policy": policy},
    )
    i = iter(range(10_000))
    return Agent(cfg, CallableSource(lambda: {"cpu": float(next(i)), "temp": 20.0, "mode": 1}),
                 secrets=new_identity(), transport=False).open()


def _round(rid, eps=1.5, key=COORD, **kw):
    params = kw.pop("params", {})
    return wire.sign_round(wire.RoundConfig(round_id=rid, protocol="t", epsilon=eps, params=params, **kw), key).to_bytes()


def test_valid_round_is_answered_once(tmp_path):
    a = _agent(tmp_path)
    out = a.handle_round(_round("r1", eps=3.0 - 1.0))
    assert out is not None and len(out.commits) == 2 and out.refused == [("mode", "round_budget")]
    assert {wire.decode_report(c.payload).round_id for c in out.commits} == {"r1"}
    assert a.handle_round(_round("r1", eps=2.0)) is None  # retained redelivery: not answered twice
    assert a.state.round_seen("r1") == "answered" and a.state.next_seq == 2
    a.close()


def test_round_epsilon_above_device_maximum_is_clamped(tmp_path):
    a = _agent(tmp_path, policy="clamp")
    out = a.handle_round(_round("big", eps=50.0))
    assert out.charged == 2.0  # clamped to max_round_epsilon, not the server's 50
    assert out.refused == [("mode", "round_budget")]
    a._flush_counters()
    assert a.state.counters()["rounds.clamped"] == 1
    a.close()


def test_round_epsilon_above_device_maximum_is_refused(tmp_path):
    a = _agent(tmp_path, policy="refuse")
    assert a.handle_round(_round("big", eps=2.5)) is None
    assert a.state.round_seen("big") == "refused" and a.state.next_seq == 0 and a.state.spent() == 0


def test_bad_signatures_and_malformed_rounds_are_ignored(tmp_path):
    a = _agent(tmp_path)
    other = wire.generate_signing_key()
    assert a.handle_round(_round("x1", key=other)) is None
    unsigned = wire.RoundConfig(round_id="x2", protocol="t", epsilon=1.0).to_bytes()
    assert a.handle_round(unsigned) is None
    tampered = _round("x3").replace(b'"epsilon":1.5', b'"epsilon":1.0')
    assert a.handle_round(tampered) is None
    assert a.handle_round(b"not json") is None
    assert a.handle_round(_round("x4", params={"streams": "cpu"})) is None
    assert a.state.next_seq == 0 and a.state.spent() == 0
    a._flush_counters()
    c = a.state.counters()
    assert c["rounds.bad_signature"] == 3 and c["rounds.malformed"] == 2
    a.close()


def test_expired_round_and_stream_subset(tmp_path):
    a = _agent(tmp_path)
    assert a.handle_round(_round("old", not_after=time.time() - 10)) is None
    assert a.state.round_seen("old") == "expired"
    out = a.handle_round(_round("sub", params={"streams": ["temp", "unknown"]}))
    assert [wire.decode_report(c.payload).stream for c in out.commits] == ["temp"]
    a.close()


def test_no_coordinator_key_means_no_rounds(tmp_path):
    cfg = simple_config("dev-n", tmp_path / "n", [numeric("cpu", 0, 100)])
    a = Agent(cfg, CallableSource(lambda: {"cpu": 1.0}), secrets=new_identity(), transport=False).open()
    assert a.handle_round(_round("r")) is None and a.state.next_seq == 0
    a.close()


def test_coordinator_stream_specs_are_followed_within_the_device_budget(tmp_path):
    a = _agent(tmp_path)
    specs = {
        "cpu": {"kind": "numeric", "mechanism": "piecewise", "params": {"epsilon": 0.5}, "dims": ["cpu"],
                "bounds": [[0, 100]]},
        "mode": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 1.0, "k": 3}, "dims": ["mode"]},
        "temp": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 5.0}, "dims": ["temp"],
                 "bounds": [[0, 90]]},  # above the device's ε
        "other": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}},  # not on this device
    }
    out = a.handle_round(_round("spec", eps=2.0, params={"streams": specs}))
    reps = {wire.decode_report(c.payload).stream: wire.decode_report(c.payload) for c in out.commits}
    assert set(reps) == {"cpu", "mode"}
    assert reps["cpu"].mechanism == "piecewise" and reps["mode"].mechanism == "oue"
    assert len(reps["mode"].body["report"]) == 3
    assert out.charged == 1.5
    assert ("temp", "spec_epsilon") in out.refused
    bad = {"mode": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 1.0, "k": 4}, "dims": ["mode"]}}
    out2 = a.handle_round(_round("spec2", eps=2.0, params={"streams": bad}))
    assert not out2.commits
    a.close()


def test_mqtt_and_flower_rounds_take_one_path(tmp_path):
    """The MQTT agent (handle_round) and the Flower shard (answer_round) answer through edge_agent.rounds:
    the same refusals (spec_<reason>, unknown streams included), statuses and persisted counters."""
    from edge_agent.rounds import RoundCheck, answer_round

    specs = {"mode": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 1.0, "k": 4},
                      "dims": ["mode"]},
             "other": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}}}
    mqtt, flower = _agent(tmp_path / "m"), _agent(tmp_path / "f")
    out_m = mqtt.handle_round(_round("r", params={"streams": specs}))
    status, out_f = answer_round(flower, _round("r", params={"streams": specs}), check=RoundCheck())
    assert status == "no_streams"
    assert sorted(out_m.refused) == sorted(out_f.refused) == [("mode", "spec_shape"), ("other", "spec_unknown")]
    assert not out_m.commits and not out_f.commits
    assert mqtt.state.round_seen("r") == flower.state.round_seen("r") == "refused"
    for a in (mqtt, flower):
        a._flush_counters()
    assert mqtt.state.counters() == flower.state.counters()
    assert mqtt.state.counters()["rounds.stream_refused.unknown"] == 1
    assert mqtt.state.counters()["rounds.no_streams"] == 1
    mqtt.close()
    flower.close()


# (ε, δ) mechanisms: a round cannot raise δ; the ledger records and caps the device's own


def test_gaussian_device_refuses_a_larger_delta_and_records_and_caps_its_own(tmp_path):
    values = iter(range(100))
    cfg = round_config(tmp_path, [numeric("load", 0, 100, rounding={"enabled": False})], GAUSS_LOAD,
                       ledger={"total_cap": 1e6, "delta_cap": 3.5e-6})
    a = Agent(cfg, CallableSource(lambda: {"load": float(next(values))}), secrets=new_identity(),
              transport=False).open()
    own = a.stream_specs()["load"]
    assert own["params"]["delta"] == 1e-6
    larger = dict(own, params={**own["params"], "delta": 1e-3})
    out = a.handle_round(signed_round("r0", {"streams": {"load": larger}}))
    assert out.refused == [("load", "spec_delta")] and a.state.spent() == 0
    charged = []
    for i in range(5):  # a new value each time: a new memo entry each time
        out = a.handle_round(signed_round(f"r{i + 1}", {"streams": {"load": own}}))
        charged.append(out.charged)
        if i >= 3:
            assert out.refused == [("load", "delta_cap")]
    assert charged == [0.5, 0.5, 0.5, 0.0, 0.0]
    rows = list(a.state.ledger_rows())
    assert [r["delta"] for r in rows] == [1e-6] * 3 and a.state.spent_delta() == pytest.approx(3e-6)
    a.close()


# The Flower client follows the same round contract (Haar streams, rounding steps)


def test_flower_answer_round_uses_the_pipeline_contract(tmp_path):
    from edge_agent.rounds import answer_round

    dims = [numeric("a", 0, 10), numeric("b", 0, 10), numeric("load", 0, 100)]
    streams = [{"name": "rec", "dimensions": ["a", "b"], "mechanism": "haar", "epsilon": 1.0,
                "params": {"split": 0.5, "mean_mechanism": "hybrid"}}] + HYBRID_LOAD
    a = Agent(round_config(tmp_path, dims, streams), CallableSource(lambda: {"a": 1.0, "b": 2.0, "load": 50.3}),
              secrets=new_identity(), transport=False).open()
    specs = a.stream_specs()
    specs["load"]["rounding"] = [16.0]
    status, out = answer_round(a, signed_round("r1", {"streams": specs}))
    assert status == "answered" and not out.refused
    bodies = {wire.decode_report(c.payload).stream: c.body["report"] for c in out.commits}
    assert set(bodies["rec"]) == {"mean", "detail"}  # Haar streams are answered
    assert bodies["load"] is not None
    specs["load"]["rounding"] = [None]  # the exact value of a rounded dimension: refused like over MQTT
    status, out = answer_round(a, signed_round("r2", {"streams": specs}))
    assert status == "answered" and out.refused == [("load", "spec_rounding")]
    a.close()
