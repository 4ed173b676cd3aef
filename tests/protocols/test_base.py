"""Parameter checks and the confidence interval of protocols/base.py."""

import numpy as np
import pytest

from protocols.base import (
    check_categories,
    check_category,
    check_epsilon,
    check_int,
    check_unit_interval,
    check_unit_value,
    confidence_interval,
)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x", None])
def test_check_epsilon_rejects(bad):
    with pytest.raises(ValueError, match="epsilon"):
        check_epsilon(bad)


def test_parameter_checks():
    assert check_int(3, "k", 2) == 3
    with pytest.raises(ValueError, match="k must be >= 2"):
        check_int(1, "k", 2)
    with pytest.raises(ValueError, match="integer"):
        check_int(2.5, "k")
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        check_unit_interval([0.0, 1.5])
    for bad in ([np.nan], [0.5, np.nan], [np.inf], [-np.inf, 0.0], [np.nan, 2.0]):
        with pytest.raises(ValueError, match="finite"):
            check_unit_interval(bad)
    with pytest.raises(ValueError, match=r"got range \[-1.5, 0.5\]"):
        check_unit_interval([-1.5, 0.5])
    assert check_unit_interval([]).size == 0 and check_unit_interval([-1.0, 1.0]).tolist() == [-1.0, 1.0]
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        check_categories([0, 4], 4)
    with pytest.raises(ValueError, match="integer"):
        check_categories([0.5], 4)
    assert check_categories([0.0, 3.0], 4).tolist() == [0, 3]


def test_one_value_checks_are_the_batch_checks_of_one_value():
    """check_unit_value / check_category (a device's one-user path) accept and refuse what the batch checks do,
    with the same messages."""
    for v in (-1.0, 0.0, 0.25, 1.0, np.float64(0.5), 1, np.int64(-1)):
        assert check_unit_value(v) == float(check_unit_interval([v])[0])
    for bad in (1.5, -1.0000001, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError) as one:
            check_unit_value(bad)
        with pytest.raises(ValueError) as batch:
            check_unit_interval([bad])
        assert str(one.value).replace("value", "values", 1) == str(batch.value)
    for v in (0, 3, np.int64(2), 2.0, np.float32(1.0), np.uint8(3), np.longdouble(2), [1]):
        assert check_category(v, 4) == int(check_categories(np.asarray([v]).reshape(-1), 4)[0])
    assert check_unit_value([0.5]) == 0.5 and check_unit_value(np.float32(0.25)) == 0.25
    for bad in (None, "x", [0.1, 0.2]):
        with pytest.raises(ValueError):
            check_unit_value(bad)
    with pytest.raises(ValueError, match="one category"):
        check_category([1, 2], 4)
    for bad in (-1, 4, 2.5, float("nan"), float("inf"), "x", True, np.bool_(False), None,
                np.longdouble(2) + np.longdouble(2) ** -60):
        with pytest.raises(ValueError):
            check_category(bad, 4)
        with pytest.raises((ValueError, TypeError)):
            check_categories(np.asarray([bad]), 4)


def test_confidence_interval():
    lo, hi = confidence_interval(0.5, 4.0, 400, 0.95)
    assert hi - lo == pytest.approx(2 * 1.959964 * 0.1, rel=1e-5)
