"""Stream plans (edge_agent/plans.py): how each configured stream is reported — the mechanism the ``auto`` policy
or the configuration picks, configuration errors, the resolved parameters a stream spec carries, the δ cap an
(ε, δ) mechanism needs."""

from __future__ import annotations

import pytest

from edge_agent.config import ConfigError
from edge_agent.embed import categorical, numeric, simple_config
from edge_agent.pipeline import Pipeline
from edge_agent.plans import stream_specs
from protocols import catalogue
from protocols.catalogue import Family, Role
from protocols.contract import parse_round_params
from protocols.pipeline import HaarRecord, choose_mechanism
from tests.edge_agent.signed_rounds import CONTRACT_DIMS, CONTRACT_STREAMS, GAUSS_LOAD, round_config

SECRET = bytes(range(32))


def _cfg(tmp_path, streams=None, dims=None, **kw):
    dims = dims or [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)]
    return simple_config("dev-p", tmp_path / "state", dims, streams, **kw)


def test_auto_policy_picks_the_lowest_variance(tmp_path):
    cfg = _cfg(
        tmp_path,
        dims=[numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("small", 3), categorical("big", 1000)],
        streams=[
            {"name": "cpu", "dimensions": ["cpu"]},
            {"name": "env", "dimensions": ["cpu", "temp"]},
            {"name": "small", "dimensions": ["small"]},
            {"name": "big", "dimensions": ["big"]},
        ],
    )
    p = Pipeline(cfg, SECRET)
    assert p.streams["cpu"].mechanism_name == "hybrid"
    assert p.streams["small"].mechanism_name == "grr"
    assert p.streams["big"].mechanism_name == "oue"
    env = p.streams["env"]
    assert env.mechanism_name in catalogue.names(Role.AUTO, Family.VECTOR) + catalogue.names(Role.AUTO, Family.HAAR)
    chosen = env.mechanism.worst_case_variance()
    for name in ("ksampling", "duchi_md"):
        assert chosen <= catalogue.build(name, epsilon=1.0, d=2).worst_case_variance() + 1e-12


def test_explicit_mechanism_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown mechanism"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["cpu"], "mechanism": "gpm"}]), SECRET)
    with pytest.raises(ConfigError, match="bad parameters"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["cpu"], "mechanism": "hybrid",
                                          "params": {"nope": 1}}]), SECRET)
    with pytest.raises(ConfigError, match="explicit mechanism"):
        Pipeline(_cfg(tmp_path, streams=[{"name": "s", "dimensions": ["mode"], "epsilon_1": 0.5,
                                          "epsilon_inf": 1.0}]), SECRET)


def test_hadamard_design_is_pinned_in_the_stream_spec(tmp_path):
    """HR picks its design (rows, hence its output space) automatically; the device's stream spec carries the
    choice, so the coordinator decodes with the device's design whatever version of the rule it runs."""
    from edge_agent.plans import build_stream_plan
    from protocols.contract import StreamSpec

    cfg = _cfg(tmp_path, streams=[{"name": "big", "dimensions": ["big"], "mechanism": "hr", "epsilon": 6.0}],
               dims=[categorical("big", 100)], privacy={"max_round_epsilon": 6.0},
               ledger={"total_cap": 100.0})
    plan = build_stream_plan(cfg, cfg.effective_streams()[0])
    spec = plan.stream_spec()
    assert spec["params"]["rows"] == plan.mechanism.rows
    rebuilt = StreamSpec.model_validate(spec).build()
    assert (rebuilt.rows, rebuilt.K) == (plan.mechanism.rows, plan.mechanism.K)


def test_gaussian_stream_needs_a_delta_cap(tmp_path):
    with pytest.raises(ConfigError, match="delta_cap"):
        Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], GAUSS_LOAD), SECRET)


def test_stream_specs_are_valid_coordinator_specs_and_resolve_every_choice(tmp_path):
    specs = stream_specs(round_config(tmp_path, CONTRACT_DIMS, CONTRACT_STREAMS, unit="value"))
    parsed = parse_round_params({"streams": specs})
    prof = parsed.streams["profile"]
    assert prof.kind == "haar" and prof.bounds == [(17, 90), (1, 99), (1, 16)]
    assert set(prof.params) == {"epsilon", "d", "mean_mechanism", "detail_mechanism", "split"}
    mech = prof.build()
    assert isinstance(mech, HaarRecord) and mech.d == 3 and mech.epsilon == 2.0
    assert parsed.streams["app"].kind == "longitudinal" and parsed.streams["app"].params["g"] == 3
    assert parsed.streams["app"].epsilon == 2.0  # ε∞ counts towards the round's ε
    assert parsed.streams["sex"].kind == "frequency"
    # auto delegates to the one chooser of the project
    ch = choose_mechanism(1.0, 1, "frequency", k=2)
    assert specs["sex"]["mechanism"] == ch.name and specs["sex"]["params"] == ch.params
