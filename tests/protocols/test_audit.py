import math

import numpy as np
import pytest

from protocols.audit import audit, clopper_pearson, empirical_epsilon, equality_event
from protocols.base import check_categories, check_epsilon, check_int, check_unit_interval, confidence_interval


class _BinaryRR:
    """Textbook randomized response on {0,1}, used to test the auditor itself."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon
        self.delta = 0.0

    def privatize(self, values, rng):
        keep = rng.random(len(values)) < math.exp(self.epsilon) / (1 + math.exp(self.epsilon))
        return np.where(keep, values, 1 - values)


class _Leaky(_BinaryRR):
    """Claims epsilon but reports its input in the clear."""

    def privatize(self, values, rng):
        return np.asarray(values)


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


def test_clopper_pearson_brackets():
    lo, hi = clopper_pearson(50, 100, 0.025)
    assert 0.39 < lo < 0.5 < hi < 0.61
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0
    assert clopper_pearson(10, 10, 0.05)[1] == 1.0


def test_empirical_epsilon_zero_without_power():
    assert empirical_epsilon(0, 0, 1000) == 0.0


def test_confidence_interval():
    lo, hi = confidence_interval(0.5, 4.0, 400, 0.95)
    assert hi - lo == pytest.approx(2 * 1.959964 * 0.1, rel=1e-5)


def test_audit_accepts_correct_rr(rng, audit_trials):
    res = audit(_BinaryRR(1.0), 0, 1, equality_event(0), audit_trials, rng)
    assert res.passed
    assert res.epsilon_emp > 0.8  # the test has power: RR is tight


def test_audit_rejects_leaky_mechanism(rng):
    res = audit(_Leaky(1.0), 0, 1, equality_event(0), 2000, rng)
    assert not res.passed and res.epsilon_emp > 5
