"""The round contract's helpers (protocols/contract.py): normalisation to [-1, 1] and back."""

import numpy as np
import pytest

from protocols.contract import StreamSpec, denormalise, normalise


def test_normalise_and_denormalise():
    lo, hi = np.array([0.0, -5.0]), np.array([100.0, 5.0])
    x = np.array([[50.0, 0.0], [150.0, -7.0], [0.0, 5.0]])
    t = normalise(x, lo, hi)
    np.testing.assert_allclose(t, [[0.0, 0.0], [1.0, -1.0], [-1.0, 1.0]])  # clipped first
    np.testing.assert_allclose(denormalise(t, lo, hi), np.clip(x, lo, hi))
    with pytest.raises(ValueError, match="hi > lo"):
        normalise(x, hi, lo)
    with pytest.raises(ValueError, match="finite"):
        normalise([np.nan], 0, 1)


def test_component_form_of_haar_is_converted_to_haar_record_params():
    spec = StreamSpec.model_validate({
        "kind": "haar", "dims": ["a", "b", "c"], "bounds": [[0, 1]] * 3,
        "mean": {"mechanism": "hybrid", "params": {"epsilon": 0.5}},
        "detail": {"mechanism": "ksampling", "params": {"epsilon": 1.5, "d": 3}}})
    assert spec.mechanism == "haar" and spec.mean is None and spec.detail is None
    assert spec.params == {"epsilon": 2.0, "d": 3, "mean_mechanism": "hybrid", "detail_mechanism": "ksampling",
                           "split": 0.25}
    mech = spec.build()
    assert mech.epsilon_mean == pytest.approx(0.5) and mech.epsilon_detail == pytest.approx(1.5)
    with pytest.raises(ValueError, match="detail mechanism"):
        StreamSpec.model_validate({"kind": "haar", "dims": ["a", "b"], "bounds": [[0, 1]] * 2,
                                   "mean": {"mechanism": "hybrid", "params": {"epsilon": 0.5}},
                                   "detail": {"mechanism": "ksampling", "params": {"epsilon": 1.5, "d": 3}}})


def test_bounds_scale_row_is_normalise_of_values_already_in_bounds(rng):
    """``Bounds.scale_row`` (a device's α-rounded reading, clipped already) equals ``normalise`` bit for bit on values
    in [lo, hi], including the bounds themselves; ``normalise`` alone clips and checks."""
    from protocols.contract import Bounds

    lo, hi = np.array([0.0, -5.0, 17.0]), np.array([100.0, 5.0, 90.0])
    b = Bounds(lo, hi)
    x = np.vstack([lo, hi, rng.uniform(lo, hi, (500, 3))])
    assert [b.scale_row(row) for row in x.tolist()] == b.normalise(x).tolist() == normalise(x, lo, hi).tolist()
    assert b.normalise([150.0, -9.0, 17.0]).tolist() == [1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="finite"):
        b.normalise([np.nan, 0.0, 20.0])


def test_bounds_row_methods_are_the_array_methods_on_one_reading(rng):
    """A device's one reading goes through ``clip_row`` / ``scale_row`` in Python floats: the same numbers as numpy's
    ``clip`` / ``normalise`` (the same operations in the same order), in and out of bounds, at the bounds and at ±0."""
    from protocols.contract import Bounds

    lo, hi = np.array([0.0, -5.0, 17.0]), np.array([100.0, 5.0, 90.0])
    b = Bounds(lo, hi)
    rows = np.vstack([lo, hi, lo - 1.0, hi + 1.0, [-0.0, 0.0, 17.0], rng.uniform(lo - 50, hi + 50, (2000, 3))])
    for row in rows.tolist():
        clipped = b.clip_row(row)
        assert clipped == b.clip(row).tolist()
        assert b.scale_row(clipped) == b.normalise(clipped).tolist() == b.normalise(row).tolist()
    with pytest.raises(ValueError):
        b.clip_row([1.0, 2.0])  # one value per dimension
