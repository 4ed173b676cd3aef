"""The fleet simulator MemoizedPipeline: unbiasedness of the memoized, α-rounded estimate over the offsets u, and
calibrated standard errors (5-standard-error tolerances, fixed seeds)."""

import math

import numpy as np
import pytest

from simulations.fleet_pipeline import MemoizedPipeline

pytestmark = pytest.mark.statistical


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
