"""Parameter checks and the confidence interval of protocols/base.py."""

import numpy as np
import pytest

from protocols.base import check_categories, check_epsilon, check_int, check_unit_interval, confidence_interval


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


def test_confidence_interval():
    lo, hi = confidence_interval(0.5, 4.0, 400, 0.95)
    assert hi - lo == pytest.approx(2 * 1.959964 * 0.1, rel=1e-5)
