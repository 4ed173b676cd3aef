"""The "distribution" stream kind of the round contract and its catalogue entries (SPEC §3.14)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from protocols import catalogue
from protocols.catalogue import Family, Role
from protocols.contract import RoundParams, StreamSpec, body_row, make_body
from protocols.distribution import DistributionEstimate, choose_distribution_mechanism

DIST = catalogue.names(Role.STREAM, Family.DISTRIBUTION)


def _spec(**kw) -> dict:
    base = {"kind": "distribution", "mechanism": "distribution_flat", "params": {"epsilon": 1.0, "D": 16},
            "dims": ["latency"], "bounds": [[0.0, 100.0]]}
    return {**base, **kw}


def test_distribution_spec_validates_and_has_a_grid():
    spec = StreamSpec.model_validate(_spec())
    assert spec.kind == "distribution" and spec.epsilon == 1.0 and spec.entry.family is Family.DISTRIBUTION
    grid = spec.grid()
    assert (grid.lo, grid.hi, grid.D) == (0.0, 100.0, 16)
    assert RoundParams.model_validate({"streams": {"lat": _spec()}}).epsilon == 1.0
    again = StreamSpec.model_validate(json.loads(spec.model_dump_json()))
    assert again == spec


@pytest.mark.parametrize("D", [0, 1, 3, 12, 1 << 15, 8.0, True, "16", None])
def test_bad_bucket_counts_are_refused(D):
    params = {"epsilon": 1.0} if D is None else {"epsilon": 1.0, "D": D}
    with pytest.raises(ValidationError, match="params.D"):
        StreamSpec.model_validate(_spec(params=params))


@pytest.mark.parametrize("bad, match", [
    ({"dims": ["a", "b"], "bounds": [[0, 1], [0, 1]]}, "exactly one numeric dimension"),
    ({"bounds": None}, "bound"),
    ({"bounds": [[1.0, 1.0]]}, "lo < hi"),
    ({"mechanism": "oue"}, "distribution mechanisms"),
    ({"mechanism": None}, "needs a 'mechanism'"),
    ({"rounding": [1.0]}, "not α-rounded"),
    ({"labels": ["x"]}, "no labels"),
])
def test_malformed_distribution_specs_are_refused(bad, match):
    with pytest.raises(ValidationError, match=match):
        StreamSpec.model_validate(_spec(**bad))


def test_other_kinds_have_no_grid():
    spec = StreamSpec.model_validate({"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0},
                                      "dims": ["x"], "bounds": [[0, 1]]})
    with pytest.raises(ValueError, match="bucket grid"):
        spec.grid()


def _mechanisms():
    for name in DIST:
        yield name, {"epsilon": 1.0, "D": 16}
    yield "distribution_flat", {"epsilon": 1.0, "D": 16, "oracle": "olh"}
    yield "distribution_hierarchical", {"epsilon": 1.0, "D": 16, "branching": 2, "oracle": "olh"}
    yield "distribution_hierarchical", {"epsilon": 1.0, "D": 16, "consistency": False}


@pytest.mark.parametrize("name, params", list(_mechanisms()))
def test_wire_round_trip_statistics_and_distribution(name, params, rng):
    """Rows through the report body and the catalogue codec; statistics add and give the mechanism's own
    histogram and CDF; the catalogue's DistributionEstimate equals the one from the rows."""
    spec = StreamSpec.model_validate(_spec(mechanism=name, params=params))
    e, mech = spec.entry, spec.build()
    grid = spec.grid()
    x = rng.normal(40, 15, 400)
    u = grid.unit(x)
    rows = np.asarray(mech.privatize_unit(u, rng))
    assert rows.shape[1:] == e.row_shape(mech) and (rows.dtype.kind in "iu") == e.integer
    wire = [body_row(spec, json.loads(json.dumps(make_body(e.encode_row(mech, r))))) for r in rows]
    back = e.decode_rows(mech, wire)
    np.testing.assert_array_equal(back, rows)
    stats = e.statistics(mech, back[:150]) + e.statistics(mech, back[:0]) + e.statistics(mech, back[150:])
    whole = e.statistics(mech, back)
    assert stats.n == 400 and stats.close_to(whole)
    np.testing.assert_allclose(e.estimate(mech, stats), mech.estimate(back), rtol=1e-9, atol=1e-12)
    got = e.distribution(mech, catalogue.Statistics.from_json(json.loads(json.dumps(stats.to_json()))),
                         edges=grid.edges)
    direct = mech.distribution(back, edges=grid.edges)
    assert isinstance(got, DistributionEstimate) and got.n == 400
    np.testing.assert_allclose(got.histogram, direct.histogram, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.cdf, direct.cdf, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.quantile([0.5, 0.9]), direct.quantile([0.5, 0.9]), rtol=1e-9)
    assert got.edges[0] == 0.0 and got.edges[-1] == 100.0
    with pytest.raises(ValueError, match="zero reports"):
        e.distribution(mech, e.statistics(mech, back[:0]))


def test_distribution_of_a_non_distribution_entry_is_refused():
    e = catalogue.entry("oue")
    with pytest.raises(ValueError, match="not a distribution"):
        e.distribution(e.build(epsilon=1.0, k=3), catalogue.Statistics(1, np.zeros(3), np.zeros(0)))


def test_auto_choice_maps_to_a_catalogue_entry():
    choice = choose_distribution_mechanism(1.0, 64)
    e = catalogue.distribution_entry(choice.mechanism)
    params = choice.mechanism._params()
    assert e.family is Family.DISTRIBUTION
    rebuilt = e.build(**params)
    assert rebuilt.method == choice.method
