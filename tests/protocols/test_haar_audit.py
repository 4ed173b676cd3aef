"""Empirical ε audit of HaarHRR (LDP-Auditor style): ε_emp ≤ ε, and the test has power."""

import numpy as np
import pytest

from protocols.audit import audit
from protocols.haar import HaarHRR
from tests.conftest import EPSILONS

pytestmark = pytest.mark.audit


def _events(mech: HaarHRR, v1: int) -> list:
    """Distinguishing events: the root-level bit (+1 or -1), and "the bit agrees with what v1 would send"."""
    L = mech.levels

    def root_bit(sign: int):
        return lambda r: (np.asarray(r)[:, 0] == 0) & (np.asarray(r)[:, 2] == sign)

    def agrees_with_v1(r):
        r = np.asarray(r)
        h, j, y = r[:, 0], r[:, 1], r[:, 2]
        node = v1 >> (L - h)
        sign = 1 - 2 * ((v1 >> (L - h - 1)) & 1)
        parity = np.zeros_like(j)
        x = j & node
        while np.any(x):
            parity ^= x & 1
            x = x >> 1
        return y == (1 - 2 * parity) * sign

    return [root_bit(1), root_bit(-1), agrees_with_v1]


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_haarhrr_audit(rng, audit_trials, epsilon):
    k = 4  # 2 levels: the root bit is sampled w.p. 1/2, which gives the audit power
    mech = HaarHRR(epsilon, k)
    res = audit(mech, 0, k - 1, _events(mech, 0), audit_trials, rng)
    assert res.passed, res
    if epsilon <= 2.0:
        assert res.epsilon_emp > 0.6 * epsilon  # the audit is not vacuous


class _LeakyHaarHRR(HaarHRR):
    """Claims ε but skips the randomized response on the bit."""

    def privatize(self, values, rng):
        saved = self.p
        self.p = 1.0
        try:
            return super().privatize(values, rng)
        finally:
            self.p = saved


def test_audit_catches_a_leaky_variant(rng):
    mech = _LeakyHaarHRR(1.0, 4)
    res = audit(mech, 0, 3, _events(mech, 0), 5000, rng)
    assert not res.passed
