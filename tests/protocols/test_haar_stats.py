"""HaarHRR range estimates: unbiased, with the analytic variance of ``range_variance``."""

import math

import numpy as np
import pytest

from protocols.haar import HaarHRR

pytestmark = pytest.mark.statistical

K = 20
RANGES = [(0, 19), (0, 9), (3, 14), (7, 7), (12, 19), (5, 6)]


def _population(rng: np.random.Generator, n: int) -> np.ndarray:
    # skewed, so the ranges hold different masses
    probs = np.linspace(1, 3, K) ** 2
    return rng.choice(K, size=n, p=probs / probs.sum())


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_range_estimates_unbiased_and_variance_matches(rng, epsilon):
    """One large population: per-user contributions X_u are independent with E[X_u] = 1[v_u ∈ R]."""
    n = 400_000
    values = _population(rng, n)
    mech = HaarHRR(epsilon, K)
    reports = mech.privatize(values, rng)
    est = mech.estimate(reports)
    for a, b in RANGES:
        inside = (values >= a) & (values <= b)
        f = inside.mean()
        per_user = mech.range_variance(a, b, f)
        se = math.sqrt(per_user / n)
        assert abs(mech.range_query(est, a, b) - f) < 5 * se, (a, b)
        # Var(X_u | v) is the same for all users inside (resp. outside) the range: check each group's spread
        x = mech.range_contributions(reports, a, b)
        share = (b - a + 1) / mech.D
        base = per_user + f * (1 - share) ** 2 + (1 - f) * share**2  # L·Σ||ω||²/(2p-1)²
        for mask, offset in ((inside, (1 - share) ** 2), (~inside, share**2)):
            if mask.sum() < 1000:
                continue
            xs = x[mask]
            theory = base - offset
            # s.e. of a sample variance: sqrt((μ4 - σ⁴)/m); μ4 estimated from the sample
            se_var = math.sqrt(np.mean((xs - xs.mean()) ** 4) / xs.size)
            assert abs(xs.var() - theory) < 5 * se_var, (a, b, xs.var(), theory)


def test_estimator_variance_over_repetitions(rng):
    """Fixed population, fresh randomness: the spread of R̂ over repetitions is range_variance(f)/n."""
    n, reps, epsilon = 4000, 400, 1.0
    values = _population(rng, n)
    mech = HaarHRR(epsilon, K)
    a, b = 3, 14
    f = np.mean((values >= a) & (values <= b))
    answers = np.array([mech.range_query(mech.privatize(values, rng), a, b) for _ in range(reps)])
    theory = mech.range_variance(a, b, f) / n
    assert abs(answers.mean() - f) < 5 * math.sqrt(theory / reps)
    # relative s.e. of a sample variance of (nearly) Gaussian answers: sqrt(2/(reps-1)) ≈ 7%
    assert abs(answers.var(ddof=1) / theory - 1) < 5 * math.sqrt(2 / (reps - 1))


def test_haar_beats_flat_sums_on_long_ranges():
    """The point of HaarHRR: a long range costs O(log² k), not O(length), in variance (at small ε)."""
    epsilon, k = 1.0, 256
    mech = HaarHRR(epsilon, k)
    e = math.exp(epsilon)
    oue_point = 4 * e / (e - 1) ** 2
    length = 128
    assert mech.range_variance(0, length - 1) < length * oue_point / 2
