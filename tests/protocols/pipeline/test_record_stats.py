"""HaarRecord: unbiased coordinates and range sums, the exact variance formulas (5-standard-error tolerances,
fixed seeds)."""

import math

import numpy as np
import pytest

from protocols.pipeline import HaarRecord

pytestmark = pytest.mark.statistical

RANGES = [(0, 14), (0, 7), (3, 11), (5, 5), (12, 14), (8, 15)]


def _records(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Skewed records with different means per coordinate and some mass at the bounds."""
    centre = np.linspace(-0.6, 0.7, d)
    return np.clip(centre + 0.5 * rng.standard_normal((n, d)), -1.0, 1.0)


def _mean_square_check(residual: np.ndarray, theory: np.ndarray) -> np.ndarray:
    """z-scores of mean(residual²) against the mean exact variance (s.e. from the 4th moment)."""
    sq = residual**2
    se = np.sqrt(((sq - theory) ** 2).mean(axis=0) / sq.shape[0])
    return (sq.mean(axis=0) - theory) / se


@pytest.mark.parametrize(
    ("eps", "d", "mean", "detail"),
    [
        (0.5, 15, "auto", "ksampling"),
        (2.0, 15, "pdp", "duchi_md"),
        (4.0, 16, "piecewise", "ksampling"),
        (1.0, 3, "hybrid", "duchi_md"),
    ],
)
def test_coordinates_and_ranges_unbiased_with_the_exact_variance(rng, eps, d, mean, detail):
    n = 150_000
    x = _records(rng, n, d)
    mech = HaarRecord(eps, d, mean, detail)
    reports = mech.privatize(x, rng)
    est = mech.estimate(reports)
    var = mech.variance(x).mean(axis=0)  # Var(estimate) = Σ_u Var_u / n²
    z = (est - x.mean(axis=0)) / np.sqrt(var / n)
    assert np.all(np.abs(z) < 5), z
    contributions = mech.contributions(reports)
    z_var = _mean_square_check(contributions - x, var)
    assert np.all(np.abs(z_var) < 5), z_var
    assert np.all(var <= mech.worst_case_variances() * (1 + 1e-12))
    for a, b in RANGES:
        if b >= d:
            continue
        truth = x[:, a : b + 1].sum(axis=1)
        rv = mech.range_variance(a, b, x)
        assert abs(mech.range_query(est, a, b) - truth.mean()) < 5 * math.sqrt(rv.mean() / n), (a, b)
        resid = contributions[:, a : b + 1].sum(axis=1) - truth
        zr = _mean_square_check(resid[:, None], np.array([rv.mean()]))
        assert abs(zr[0]) < 5, (a, b, zr)


def test_estimator_spread_over_repetitions_matches_variance(rng):
    """Fixed population, fresh noise: the spread of t̂ over repetitions is variance(x).mean()/n."""
    n, reps, d = 3000, 300, 6
    x = _records(rng, n, d)
    mech = HaarRecord(1.0, d, "pdp", "ksampling")
    ests = np.array([mech.estimate(mech.privatize(x, rng)) for _ in range(reps)])
    theory = mech.variance(x).mean(axis=0) / n
    # sample variance of reps normal-ish estimates: s.e. ≈ theory·sqrt(2/(reps-1))
    z = (ests.var(axis=0, ddof=1) - theory) / (theory * math.sqrt(2 / (reps - 1)))
    assert np.all(np.abs(z) < 5), z
    assert np.all(np.abs(ests.mean(axis=0) - x.mean(axis=0)) < 5 * np.sqrt(theory / reps))

