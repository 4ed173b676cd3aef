"""The audits reject the thesis's PDP and GPM as written (negative controls, SPEC §2.4, §6).

A correct mechanism passes the same audits (test_numeric_audit.py); these controls show that a
pass is informative, because the same machinery reports ε_emp far above a false claim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocols.audit import audit, threshold_events
from protocols.numeric import PDP
from tests.protocols.numeric.thesis_controls import (ThesisGPM, ThesisPDP, gpm_exact_epsilon,
                                                     gpm_exact_epsilon_enumerated)
from tests.conftest import EPSILONS

pytestmark = pytest.mark.audit


@pytest.mark.parametrize("eps", EPSILONS)
def test_thesis_pdp_is_rejected(eps, audit_trials, rng):
    """Outputs of 0.5 stay in [0.495, 0.505], outputs of -0.5 in [-0.505, -0.495]: the event y > 0 separates them
    perfectly, so ε_emp is limited only by the number of trials (≈ ln(N / ln(1/α)))."""
    result = audit(ThesisPDP(eps), 0.5, -0.5, threshold_events([0.0]), audit_trials, rng)
    assert result.tp == audit_trials and result.fp == 0
    assert result.epsilon_emp > max(5.0, 2 * eps)
    assert not result.passed


def test_repaired_pdp_passes_the_same_audit(audit_trials, rng):
    result = audit(PDP(1.0), 0.5, -0.5, threshold_events([0.0]), audit_trials, rng)
    assert result.passed


def test_thesis_pdp_supports_are_disjoint(rng):
    mech = ThesisPDP(1.0)
    near = mech.privatize(np.full(10_000, 0.2), rng)
    far = mech.privatize(np.full(10_000, 0.22), rng)
    assert near.max() <= 0.205 < 0.215 <= far.min()


def test_gpm_exact_epsilon_matches_spec():
    """SPEC §2.4: at ε = 1 the vector is 2.0, 4.0, 9.0, 19.2-LDP for d = 1, 3, 7, 15 — not 1."""
    exact = [gpm_exact_epsilon(1.0, d) for d in (1, 3, 7, 15)]
    np.testing.assert_allclose(exact, [2.0, 4.0, 9.0, 19.2], atol=0.05)
    # the other reading of "uniform from A / B" gives exactly (d+1)·ε for odd d
    for d in (1, 3, 7, 15):
        assert gpm_exact_epsilon(1.0, d, "uniform_set") == pytest.approx(d + 1)


@pytest.mark.parametrize("d", range(1, 8))
@pytest.mark.parametrize("mask_law", ["uniform_k", "uniform_set"])
def test_gpm_closed_form_agrees_with_enumeration(d, mask_law):
    for eps in EPSILONS:
        assert gpm_exact_epsilon(eps, d, mask_law) == pytest.approx(
            gpm_exact_epsilon_enumerated(eps, d, mask_law), rel=1e-12
        )
        assert gpm_exact_epsilon(eps, d, mask_law) > eps


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("mask_law", ["uniform_k", "uniform_set"])
def test_thesis_gpm_is_rejected(eps, mask_law, audit_trials, rng):
    """All three coordinates in N(1) = [1, C]: needs the all-zero mask under e = (1,1,1) (probability
    ≈ P[X=1]/2), but the all-ones mask and three tail draws of probability e^{-ε} under e = (-1,-1,-1)."""
    d = 3
    mech = ThesisGPM(eps, d, mask_law)

    def all_high(reports: np.ndarray) -> np.ndarray:
        return np.all(np.asarray(reports) >= 1.0, axis=1)

    result = audit(mech, np.ones(d), -np.ones(d), all_high, audit_trials, rng)
    assert result.epsilon_emp > eps, f"GPM audit at ε={eps}: ε_emp = {result.epsilon_emp:.3f}"
    assert result.epsilon_emp <= mech.exact_epsilon()  # and never above the true value


def test_thesis_gpm_sampler_follows_its_law(rng):
    """The controls are faithful: mask parity follows X, mask weights are uniform within a parity, and a
    coordinate lands in N(e_i) exactly when its bit is 0 — checked on the outputs."""
    eps, d, n = 1.0, 5, 200_000
    mech = ThesisGPM(eps, d)
    e = np.tile(np.array([1.0, -1.0, 0.3, -0.6, 0.9]), (n, 1))
    ee = math.exp(eps)
    y = mech.privatize(e, rng)
    inside = (y >= (e * ee - 1) / (ee - 1)) & (y <= (e * ee + 1) / (ee - 1))
    weight = (~inside).sum(axis=1)  # = number of ones in the mask
    p = ee / (ee + 1)
    freq = np.bincount(weight, minlength=d + 1) / n
    expected = np.where(np.arange(d + 1) % 2 == 0, p / 3, (1 - p) / 3)  # 3 even and 3 odd weights in [0, 5]
    np.testing.assert_allclose(freq, expected, atol=5 * math.sqrt(0.25 / n))
    assert np.all(np.abs(y) <= mech.bound)
