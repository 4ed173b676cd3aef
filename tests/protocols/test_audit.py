"""The auditor itself (protocols/audit.py): Clopper–Pearson bounds, ε_emp, and audits of textbook randomized
response (passes, with power) and of a leaky variant (caught)."""

import math

import numpy as np

from protocols.audit import audit, clopper_pearson, empirical_epsilon, equality_event


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


def test_clopper_pearson_brackets():
    lo, hi = clopper_pearson(50, 100, 0.025)
    assert 0.39 < lo < 0.5 < hi < 0.61
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0
    assert clopper_pearson(10, 10, 0.05)[1] == 1.0


def test_empirical_epsilon_zero_without_power():
    assert empirical_epsilon(0, 0, 1000) == 0.0


def test_audit_accepts_correct_rr(rng, audit_trials):
    res = audit(_BinaryRR(1.0), 0, 1, equality_event(0), audit_trials, rng)
    assert res.passed
    assert res.epsilon_emp > 0.8  # the test has power: RR is tight


def test_audit_rejects_leaky_mechanism(rng):
    res = audit(_Leaky(1.0), 0, 1, equality_event(0), 2000, rng)
    assert not res.passed and res.epsilon_emp > 5

