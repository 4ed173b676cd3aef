"""Monte-Carlo checks of the numeric mechanisms: unbiasedness, variance formulas, and the samplers' laws.

Tolerances are 5 standard errors (the standard error of a sample variance is estimated from the sample's fourth
central moment), and goodness-of-fit tests reject only at p < 1e-6, so a correct mechanism fails with
negligible probability whatever the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from protocols.numeric import PDP, Duchi, DuchiMultiDim, Gaussian, Hybrid, KSampling, Laplace, Piecewise
from tests.conftest import EPSILONS

pytestmark = pytest.mark.statistical

N = 200_000
Z = 5.0


def _gaussian(eps: float) -> Gaussian:
    return Gaussian(eps, 1e-6, calibration="classic" if eps < 1 else "analytic")


SCALAR = {
    "laplace": Laplace,
    "gaussian": _gaussian,
    "duchi": Duchi,
    "piecewise": Piecewise,
    "hybrid": Hybrid,
    "pdp": PDP,
}


def _check_mean_and_variance(values: np.ndarray, t: np.ndarray, variance: np.ndarray) -> None:
    """Columnwise: mean within Z·sqrt(V/n) of t, sample variance within Z standard errors of V."""
    n = values.shape[0]
    mean = values.mean(axis=0)
    assert np.all(np.abs(mean - t) <= Z * np.sqrt(variance / n)), (mean, t)
    centred = values - mean
    s2 = (centred**2).mean(axis=0)
    m4 = (centred**4).mean(axis=0)
    se = np.sqrt(np.maximum(m4 - s2**2, 0) / n)
    assert np.all(np.abs(s2 - variance) <= Z * se), (s2, variance)


@pytest.mark.parametrize("name", SCALAR)
@pytest.mark.parametrize("eps", EPSILONS)
def test_scalar_unbiased_with_stated_variance(name, eps, rng):
    mech = SCALAR[name](eps)
    for t in (-1.0, -0.3, 0.6, 1.0):
        values = mech.debias(mech.privatize(np.full(N, t), rng))
        _check_mean_and_variance(values[:, None], np.array([t]), np.array([mech.variance(t)]))
        assert mech.estimate(mech.privatize(np.full(N, t), rng)) == pytest.approx(
            t, abs=Z * math.sqrt(mech.variance(t) / N)
        )


@pytest.mark.parametrize("name", SCALAR)
def test_scalar_mixed_population_mean(name, rng):
    """A population of different inputs: the estimate is the population mean."""
    mech = SCALAR[name](1.0 if name != "gaussian" else 0.8)
    t = np.clip(rng.normal(0.2, 0.5, N), -1, 1)
    per_user = float(np.mean(mech.variance(t)))
    assert mech.estimate(mech.privatize(t, rng)) == pytest.approx(t.mean(), abs=Z * math.sqrt(per_user / N))


@pytest.mark.parametrize("base", ["hybrid", "piecewise", "duchi", "pdp"])
@pytest.mark.parametrize("eps", [1.0, 6.0])  # k = 1 and k = 2
def test_ksampling_per_coordinate(base, eps, rng):
    d = 4
    mech = KSampling(eps, d, base)
    t = np.array([-1.0, -0.25, 0.5, 1.0])
    values = mech.debias(mech.privatize(np.tile(t, (N, 1)), rng))
    _check_mean_and_variance(values, t, mech.variance(t))


@pytest.mark.parametrize("d", [2, 3, 4, 7])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_duchi_multidim_per_coordinate(d, eps, rng):
    mech = DuchiMultiDim(eps, d)
    t = np.linspace(-1, 1, d) * 0.9
    values = mech.debias(mech.privatize(np.tile(t, (N, 1)), rng))
    _check_mean_and_variance(values, t, mech.variance(t))
    mixed = rng.uniform(-1, 1, (N, d))
    est = mech.estimate(mech.privatize(mixed, rng))
    assert np.all(np.abs(est - mixed.mean(axis=0)) <= Z * math.sqrt(mech.worst_case_variance() / N))


@pytest.mark.parametrize("d", [3, 4])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_duchi_multidim_sampler_matches_exact_law(d, eps, rng):
    """The vectorised sign-flip sampler draws exactly the enumerated distribution (ties included for even d)."""
    mech = DuchiMultiDim(eps, d)
    t = np.array([0.7, -0.2, 0.1, -0.9][:d])
    expected = mech.output_probabilities(t)
    reports = mech.privatize(np.tile(t, (N, 1)), rng)
    index = ((reports == 0).astype(int) << np.arange(d)).sum(axis=1)  # same order as outputs(): bit 1 is -B
    counts = np.bincount(index, minlength=2**d)
    assert stats.chisquare(counts, N * expected).pvalue > 1e-6


# The grid samplers against their exact channels: tests/protocols/numeric/test_grid.py (chi-square per mechanism).
