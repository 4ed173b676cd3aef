"""The device side of the round contract (edge_agent/round_contract.py): which round specs a device follows and
which it refuses — δ, rounding steps, the mechanism's class, category labels, the privacy unit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_agent.embed import categorical, numeric, simple_config
from edge_agent.pipeline import Pipeline
from tests.edge_agent.signed_rounds import HYBRID_LOAD, round_config

SECRET = bytes(range(32))
GRR_STREAM = {"name": "x", "dimensions": ["x"], "mechanism": "grr", "epsilon": 1.0}


def test_round_cannot_select_a_gaussian_mechanism_on_a_pure_device(tmp_path):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = {"kind": "numeric", "mechanism": "gaussian", "dims": ["load"], "bounds": [[0, 100]],
            "params": {"epsilon": 1.0, "delta": 0.999999, "calibration": "analytic"}}
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "delta")]


@pytest.mark.parametrize("step", [None, 1e-9, 0.5, 0.999, 3.0, 1.5, 200.0])
def test_rounded_dimension_refuses_exact_fine_and_non_nested_steps(tmp_path, step):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)  # K_base = 100: base step 1
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == [] and rp.refused == [("load", "rounding")]


@pytest.mark.parametrize("step", [1.0, 1.0 + 1e-12, 2.0, 16.0, 64.0])
def test_rounded_dimension_follows_nested_steps_and_shares_memo_entries(tmp_path, step):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    spec = dict(p.stream_specs()["load"], rounding=[step])
    rp = p.round_plans({"streams": {"load": spec}})
    assert rp.streams == ["load"] and rp.plans["load"].rounding == (float(2 ** round(np.log2(step))),)
    keys = {p.prepare(p.observe({"load": x}), rp.streams, rp.plans)[0].memo_key for x in (50.0, 50.0001, 50.0002)}
    assert len(keys) <= 2  # three readings within 0.0002 fall on at most two points of a grid of step >= 1


def test_unrounded_dimension_reports_exact_values_whatever_the_step(tmp_path):
    cfg = round_config(tmp_path, [numeric("load", 0, 100, rounding={"enabled": False})], HYBRID_LOAD)
    p = Pipeline(cfg, SECRET)
    for step in (None, 0.37):
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"]
    rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[500.0])}})
    assert rp.refused == [("load", "rounding")]


def test_planner_steps_are_nested_steps_devices_follow(tmp_path):
    from coordinator.rounds import plan_rounding_steps

    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), SECRET)
    wild = [[0.0], [100.0], [0.0]]  # very volatile: the planner's step hits its cap
    for max_fraction in (0.25, 1.0):
        step = float(plan_rounding_steps(wild, [[0.1]] * 3, [0.0], [100.0], max_fraction=max_fraction)[0])
        rp = p.round_plans({"streams": {"load": dict(p.stream_specs()["load"], rounding=[step])}})
        assert rp.streams == ["load"], (max_fraction, step)


def test_numeric_stream_refuses_a_frequency_oracle_and_vice_versa(tmp_path):
    dims = [numeric("load", 0, 100), categorical("os", 3)]
    streams = HYBRID_LOAD + [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(round_config(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    grr_on_load = dict(specs["load"], mechanism="grr", params={"epsilon": 1.0, "k": 2})
    hybrid_on_os = dict(specs["os"], mechanism="hybrid", params={"epsilon": 1.0})
    rp = p.round_plans({"streams": {"load": grr_on_load, "os": hybrid_on_os}})
    assert rp.streams == [] and sorted(rp.refused) == [("load", "mechanism"), ("os", "mechanism")]


def test_round_labels_must_equal_the_device_categories(tmp_path):
    dims = [categorical("os", 3, categories=["linux", "mac", "win"]), categorical("app", 3)]
    streams = [{"name": "os", "dimensions": ["os"], "mechanism": "grr", "epsilon": 1.0},
               {"name": "app", "dimensions": ["app"], "mechanism": "grr", "epsilon": 1.0}]
    p = Pipeline(round_config(tmp_path, dims, streams), SECRET)
    specs = p.stream_specs()
    assert p.round_plans({"streams": specs}).streams == ["os", "app"]  # the device's own labels (and none)
    swapped = {"os": dict(specs["os"], labels=["win", "mac", "linux"]), "app": dict(specs["app"], labels=["a", "b", "c"])}
    rp = p.round_plans({"streams": swapped})
    assert rp.streams == [] and sorted(rp.refused) == [("app", "labels"), ("os", "labels")]


def test_a_round_cannot_change_the_unit(tmp_path):
    from edge_agent.pipeline import Pipeline
    from protocols.errors import SpecMismatch

    cfg = simple_config("d", tmp_path / "s", [categorical("x", 3)], [GRR_STREAM])
    pipe = Pipeline(cfg, bytes(32))
    spec = dict(pipe.stream_specs()["x"])
    assert spec["unit"] == "device"
    with pytest.raises(SpecMismatch, match="unit"):
        pipe.plan_for("x", {**spec, "unit": "value"})


def test_pipeline_plan_for_another_mechanism_of_the_stream(tmp_path):
    p = Pipeline(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD, unit="value"), SECRET)
    own = p.streams["load"].stream_spec()
    plan = p.plan_for("load", {**own, "mechanism": "piecewise", "params": {"epsilon": 0.5}})
    assert plan.mechanism_name == "piecewise" and plan.epsilon == 0.5
    with pytest.raises(ValueError):
        p.plan_for("load", {**own, "mechanism": "hybrid", "params": {"epsilon": 5.0}})
    assert json.loads(plan.spec) == {"mechanism": "piecewise", "params": {"epsilon": 0.5}}
