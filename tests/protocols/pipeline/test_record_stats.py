"""HaarRecord and the fleet simulator: unbiased coordinates and range sums, the exact variance formulas, and
unbiasedness of the memoized, α-rounded estimate over the offsets u (5-standard-error tolerances, fixed seeds)."""

import math

import numpy as np
import pytest

from protocols.pipeline import HaarRecord, MemoizedPipeline

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


@pytest.mark.parametrize("mechanism", ["haar", "auto"])
def test_rounded_memoized_estimate_is_unbiased_over_alpha(rng, mechanism):
    """Volatile dims (square wave of amplitude 1.2 on [0, 100]: score 0.024, step 2^5 = 32) and a static dim.

    Over the per-device offsets u, E[rounded value] = x (α-point rounding), so the memoized estimate is
    unbiased for the mean of the raw values; its variance is the LDP variance plus the rounding variance
    (R - x)(x - L) averaged over devices, all divided by n.
    """
    n, rounds, d = 20_000, 24, 3
    level = rng.uniform(20.0, 70.0, (n, 1, d))  # away from the top cell [96, 128) that clipping would bias
    wave = 1.2 * np.where(np.arange(16 + rounds) % 2 == 0, 1.0, -1.0)[None, :, None]
    full = level + wave * np.array([1.0, 1.0, 0.0])  # dim 2 is static
    history, x = full[:, :16], full[:, 16:]
    pipe = MemoizedPipeline(np.zeros(d), np.full(d, 100.0), 1.0, mechanism)
    run = pipe.run(x, rng, history=history)
    np.testing.assert_allclose(run.rounded_fraction, [[1.0, 1.0, 0.0]] * rounds)
    keys = run.new_key.sum(axis=1)
    assert np.all(keys <= 2) and np.all(run.total_spend == keys * 1.0)  # ≤ 2 grid points per device
    step = 32.0
    low = np.floor(x / step) * step
    round_var = np.where([True, True, False], (low + step - x) * (x - low), 0.0).mean(axis=0)  # (rounds, d)
    # over u: E[target] = truth
    z_target = (run.target - run.truth) / np.sqrt(np.maximum(round_var, 1e-300) / n)
    assert np.all(np.abs(z_target[:, :2]) < 5), z_target
    np.testing.assert_allclose(run.target[:, 2], run.truth[:, 2])
    # the estimate against the raw truth: LDP noise + rounding
    se = np.sqrt(run.stderr**2 + round_var / n)
    z = (run.estimates - run.truth) / se
    assert np.all(np.abs(z) < 5), z


def test_fleet_standard_errors_are_calibrated(rng):
    """Without memoization rounds are independent: (estimate - target)/stderr has mean 0 and s.d. 1."""
    n, rounds, d = 4000, 60, 4
    base = rng.uniform(20, 80, (n, 1, d))
    x = base + np.cumsum(rng.normal(0, 1, (n, rounds, d)), axis=1) * np.array([0.0, 1.0, 3.0, 0.1])
    run = MemoizedPipeline(np.zeros(d), np.full(d, 100.0), 1.0, "haar", memoize=False).run(x, rng)
    z = ((run.estimates - run.target) / run.stderr).reshape(-1)
    # 240 z-scores, correlated across the 4 coordinates of a round: allow for ~60 effective samples
    assert abs(z.mean()) < 5 / math.sqrt(60)
    assert 0.7 < z.std() < 1.3
