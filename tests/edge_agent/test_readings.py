"""Reading validation (edge_agent/readings.py): a reading's dimensions must be present, typed, finite and in their
domain (or one of the categories' labels); anything else is an InvalidRecord naming the dimension and the reason."""

from __future__ import annotations

import pytest

from edge_agent.embed import categorical, numeric, simple_config
from edge_agent.pipeline import Pipeline
from protocols.errors import InvalidRecord

SECRET = bytes(range(32))


def _cfg(tmp_path, streams=None, dims=None, **kw):
    dims = dims or [numeric("cpu", 0, 100), numeric("temp", 0, 90), categorical("mode", 3)]
    return simple_config("dev-p", tmp_path / "state", dims, streams, **kw)


@pytest.mark.parametrize(
    "reading, reason, dim",
    [
        ({"cpu": float("nan"), "temp": 1, "mode": 0}, "not_finite", "cpu"),
        ({"cpu": float("inf"), "temp": 1, "mode": 0}, "not_finite", "cpu"),
        ({"cpu": "12", "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"cpu": True, "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"cpu": [1.0], "temp": 1, "mode": 0}, "wrong_type", "cpu"),
        ({"temp": 1, "mode": 0}, "missing", "cpu"),
        ({"cpu": None, "temp": 1, "mode": 0}, "missing", "cpu"),
        ({"cpu": 1, "temp": 1, "mode": 3}, "out_of_domain", "mode"),
        ({"cpu": 1, "temp": 1, "mode": -1}, "out_of_domain", "mode"),
        ({"cpu": 1, "temp": 1, "mode": 1.5}, "wrong_type", "mode"),
        ({"cpu": 1, "temp": 1, "mode": "busy"}, "wrong_type", "mode"),
    ],
)
def test_invalid_records_are_rejected(tmp_path, reading, reason, dim):
    p = Pipeline(_cfg(tmp_path), SECRET)
    with pytest.raises(InvalidRecord) as err:
        p.observe(reading)
    assert err.value.reason == reason and err.value.dimension == dim


def test_categorical_labels(tmp_path):
    cfg = _cfg(tmp_path, dims=[categorical("mode", 3, categories=["idle", "busy", "boost"])])
    p = Pipeline(cfg, SECRET)
    assert p.observe({"mode": "boost"}).values["mode"] == 2
    with pytest.raises(InvalidRecord, match="not one of the categories"):
        p.observe({"mode": "turbo"})
