"""Frequency oracles: unbiasedness and empirical variance against ``variance(f)``, for every oracle.

Fixed data (a known histogram over n users), R independent privatizations; for every item v:
* the mean of the R estimates is within 5 standard errors of the true fraction f_v (SE = sqrt(Var(f_v)/(nR)));
* the sample variance of the R estimates lies inside the two-sided chi-square band of ``variance(f_v)/n`` at
  level 1e-6 per item (R = 400, so the band is about [0.71, 1.36]·Var).
The public-matrix oracle is unbiased over the random matrix, so each repetition draws a fresh public key.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from protocols.frequency import BLH, GRR, OLH, OUE, SUE, HadamardResponse, PublicMatrixOracle

pytestmark = pytest.mark.statistical

K = 8
N = 2_000
REPS = 400
# A skewed histogram with an empty cell: f = (0.3, 0.2, 0.15, 0.15, 0.1, 0.05, 0.05, 0).
COUNTS = np.array([600, 400, 300, 300, 200, 100, 100, 0])

FACTORIES: dict[str, Callable[[float, int, np.random.Generator], object]] = {
    "GRR": lambda eps, k, rng: GRR(eps, k),
    "SUE": lambda eps, k, rng: SUE(eps, k),
    "OUE": lambda eps, k, rng: OUE(eps, k),
    "BLH": lambda eps, k, rng: BLH(eps, k),
    "OLH": lambda eps, k, rng: OLH(eps, k),
    "HR": lambda eps, k, rng: HadamardResponse(eps, k),  # k = 8: rows = 1 at ε = 0.5, direct at 2; k = 360: rows = 2
    "HR-rows2": lambda eps, k, rng: HadamardResponse(eps, k, rows=2),
    "HR-rows3": lambda eps, k, rng: HadamardResponse(eps, k, rows=3),
    "PublicMatrix": lambda eps, k, rng: PublicMatrixOracle(eps, k, key=int(rng.integers(0, 2**62))),
}


def _repeated_estimates(name: str, epsilon: float, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    values = np.repeat(np.arange(K), COUNTS)
    estimates = np.empty((REPS, K))
    oracle = None
    for r in range(REPS):  # loop over repetitions (the oracles themselves are vectorised over users)
        oracle = FACTORIES[name](epsilon, K, rng)
        estimates[r] = oracle.estimate(oracle.privatize(rng.permutation(values), rng))
    return estimates, oracle


@pytest.mark.parametrize("epsilon", [0.5, 2.0])  # LH: g = 3 (generic mod) and g = 8 (bit mask)
@pytest.mark.parametrize("name", list(FACTORIES))
def test_unbiased_with_predicted_variance(name, epsilon):
    rng = np.random.default_rng(1000 + int(epsilon * 10) + sorted(FACTORIES).index(name))
    estimates, oracle = _repeated_estimates(name, epsilon, rng)
    f = COUNTS / N
    var = oracle.variance(f) / N
    se = np.sqrt(var / REPS)
    z = (estimates.mean(axis=0) - f) / se
    assert np.all(np.abs(z) < 5), f"{name}: bias z-scores {np.round(z, 2)}"
    ratio = estimates.var(axis=0, ddof=1) / var
    lo = stats.chi2.ppf(1e-6 / 2, REPS - 1) / (REPS - 1)
    hi = stats.chi2.ppf(1 - 1e-6 / 2, REPS - 1) / (REPS - 1)
    assert np.all((ratio > lo) & (ratio < hi)), (
        f"{name}: variance ratios {np.round(ratio, 3)} not in [{lo:.2f}, {hi:.2f}]"
    )


@pytest.mark.parametrize("name", ["GRR", "OUE", "OLH", "HR", "HR-rows3", "PublicMatrix"])
def test_large_domain_standardised_errors(name):
    """One run at k = 360 (HR: rows = 2, K = 2^11; public matrix: 3 Philox blocks per column): z = (f̂-f)/sd ~ N(0, 1)."""
    rng = np.random.default_rng(360)
    k, n = 360, 30_000
    probs = 1.0 / np.arange(1, k + 1) ** 1.1
    values = rng.choice(k, size=n, p=probs / probs.sum())
    f = np.bincount(values, minlength=k) / n
    oracle = FACTORIES[name](1.0, k, rng)
    z = (oracle.estimate(oracle.privatize(values, rng)) - f) / np.sqrt(oracle.variance(f) / n)
    assert abs(z.mean()) < 5 / np.sqrt(k), f"mean z {z.mean():.3f}"
    assert abs(np.mean(z**2) - 1) < 5 * np.sqrt(2 / k), f"mean z^2 {np.mean(z**2):.3f}"
    assert np.max(np.abs(z)) < 5.5
