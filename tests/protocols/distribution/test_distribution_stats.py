"""Seeded statistical checks of the distribution mechanisms: unbiasedness (z-tests over repetitions), the analytic
range variances against the empirical ones, the consistent hierarchy, EMS accuracy on a smooth distribution, and
the coverage of the CDF and median intervals."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.distribution import FlatOracle, HaarDistribution, HierarchicalIntervals, SquareWave

pytestmark = pytest.mark.statistical

D = 16
RANGES = ((0, 3), (2, 9), (5, 5))


def _population(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    u = np.random.default_rng(seed).beta(2, 5, n)
    return u, np.minimum((u * D).astype(np.int64), D - 1)


def _repeat(mech, v, reps, rng):
    out = np.empty((reps, len(RANGES)))
    for i in range(reps):
        r = mech.privatize(v, rng)
        if isinstance(mech, HierarchicalIntervals):
            tree = mech.tree(r)
            out[i] = [mech.range_from_tree(tree, a, b) for a, b in RANGES]
        else:
            hist = mech.estimate(r)
            out[i] = [hist[a : b + 1].sum() for a, b in RANGES]
    return out


UNBIASED = {
    "flat_oue": lambda: FlatOracle(1.0, D, "oue"),
    "flat_olh": lambda: FlatOracle(1.0, D, "olh"),
    "hier_oue_raw": lambda: HierarchicalIntervals(1.0, D, 4, "oue", consistency=False),
    "hier_olh_raw": lambda: HierarchicalIntervals(1.0, D, 2, "olh", consistency=False),
    "haar": lambda: HaarDistribution(1.0, D),
}


@pytest.mark.parametrize("name", list(UNBIASED))
def test_unbiased_with_the_analytic_range_variance(name):
    mech = UNBIASED[name]()
    n, reps = 3000, 300
    _, v = _population(n, 1)
    est = _repeat(mech, v, reps, np.random.default_rng(100 + list(UNBIASED).index(name)))
    for k, (a, b) in enumerate(RANGES):
        f = np.mean((v >= a) & (v <= b))
        z = (est[:, k].mean() - f) / (est[:, k].std(ddof=1) / np.sqrt(reps))
        assert abs(z) < 4, f"{name} [{a},{b}]: z = {z:.2f}"
        ratio = est[:, k].var(ddof=1) * n / mech.range_variance(a, b, f)
        # SE of a variance ratio over 300 repetitions ≈ 0.08; OLH's formula for ≥ 2 items is idealised
        lo, hi = (0.6, 1.6) if "olh" in name and b > a else (0.75, 1.33)
        assert lo < ratio < hi, f"{name} [{a},{b}]: empirical/analytic variance = {ratio:.3f}"


@pytest.mark.parametrize("oracle", ["oue", "olh"])
def test_consistent_hierarchy_is_unbiased_with_its_exact_variance(oracle):
    """The consistent estimate is unbiased; its variance is query_variances' (at the true histogram), no more than
    the raw formula."""
    mech = HierarchicalIntervals(1.0, D, 4, oracle, consistency=True)
    n, reps = 3000, 300
    _, v = _population(n, 2)
    hist = np.bincount(v, minlength=D) / n
    est = _repeat(mech, v, reps, np.random.default_rng(7 if oracle == "oue" else 8))
    for k, (a, b) in enumerate(RANGES):
        f = np.mean((v >= a) & (v <= b))
        z = (est[:, k].mean() - f) / (est[:, k].std(ddof=1) / np.sqrt(reps))
        assert abs(z) < 4, f"[{a},{b}]: z = {z:.2f}"
        weights = np.zeros((1, D))
        weights[0, a : b + 1] = 1.0
        exact = mech.query_variances(weights, hist)[0]
        ratio = est[:, k].var(ddof=1) * n / exact
        assert 0.75 < ratio < 1.33, f"[{a},{b}]: empirical/exact variance = {ratio:.3f}"
        assert exact <= mech.raw_range_variance(a, b, f) * 1.001


@pytest.mark.parametrize("shape", [(2.0, 5.0), (5.0, 5.0)])
def test_ems_recovers_a_smooth_distribution(shape):
    rng = np.random.default_rng(31)
    n, bins = 50_000, 64
    u = rng.beta(*shape, n)
    mech = SquareWave(1.0, bins)
    est = mech.distribution(mech.privatize(u, rng))
    true_cdf = np.cumsum(np.histogram(u, bins=bins, range=(0, 1))[0]) / n
    ks = np.max(np.abs(est.consistent_cdf - true_cdf))
    assert ks < 0.04, f"KS = {ks:.4f}"
    assert abs(est.quantile([0.5])[0] - np.median(u)) < 0.03


COVERAGE = {
    "flat_oue": lambda: FlatOracle(1.0, D, "oue"),
    "flat_olh": lambda: FlatOracle(1.0, D, "olh"),
    "hier_oue_raw": lambda: HierarchicalIntervals(1.0, D, 4, "oue", consistency=False),
    "haar": lambda: HaarDistribution(1.0, D),
}


@pytest.mark.parametrize("name", list(COVERAGE))
def test_cdf_and_median_interval_coverage(name):
    mech = COVERAGE[name]()
    n, reps = 4000, 200
    u, v = _population(n, 3)
    rng = np.random.default_rng(500 + list(COVERAGE).index(name))
    points = (3, 7, 11)
    true = np.cumsum(np.bincount(v, minlength=D)) / n
    med = np.median(u)
    hits = np.zeros(len(points))
    med_hits = 0
    for _ in range(reps):
        est = mech.distribution(mech.privatize(v, rng))
        lo, hi = est.cdf_interval()
        hits += [(lo[j] <= true[j] <= hi[j]) for j in points]
        qlo, qhi = est.quantile_interval([0.5])
        med_hits += bool(qlo[0] <= med <= qhi[0])
    coverage = hits / reps
    assert np.all(coverage >= 0.9), f"{name}: CDF coverage {coverage} (nominal 0.95)"
    assert med_hits / reps >= 0.88, f"{name}: median coverage {med_hits / reps} (nominal ≥ 0.95)"


def test_flat_olh_cdf_intervals_cover_within_two_points_and_the_variance_estimate_is_unbiased():
    """Flat OLH's CDF variance from the reports' prefix supports (protocols.distribution.flat) at ε = 4, D = 64:
    pointwise coverage within 2 points of 95 % over 600 repetitions, where the idealised formula (supports
    independent across buckets — not so for the 2-universal hash family) under-covers by more than 2 points; the
    estimate's mean matches the variance of F̂ across repetitions."""
    epsilon = 4.0
    Dw, n, reps = 64, 5000, 600
    mech = FlatOracle(epsilon, Dw, "olh")
    v = np.minimum((np.random.default_rng(11).beta(2, 5, n) * Dw).astype(np.int64), Dw - 1)
    true = np.cumsum(np.bincount(v, minlength=Dw)) / n
    rng = np.random.default_rng(1100 + int(epsilon))
    inner = slice(0, Dw - 1)  # F at the upper bound is 1
    cdf = np.empty((reps, Dw))
    variance = np.empty((reps, Dw))
    hits = np.empty(reps)
    formula_hits = np.empty(reps)
    for i in range(reps):
        est = mech.distribution(mech.privatize(v, rng))
        lo, hi = est.cdf_interval()
        hits[i] = np.mean(((lo <= true) & (true <= hi))[inner])
        half = est.z * np.sqrt(mech.plugin_variances(est.histogram, est.cdf)[1] / n)
        formula_hits[i] = np.mean(((est.cdf - half <= true) & (true <= est.cdf + half))[inner])
        cdf[i], variance[i] = est.cdf, est.cdf_variance
    assert abs(hits.mean() - 0.95) <= 0.02, f"ε = {epsilon}: coverage {hits.mean():.4f}"
    assert formula_hits.mean() < 0.93, f"ε = {epsilon}: the formula's coverage {formula_hits.mean():.4f}"
    for m in (3, 20, 40, 62):  # SE of an empirical variance over 600 repetitions ≈ 6 %
        ratio = variance[:, m].mean() / (cdf[:, m].var(ddof=1) * n)
        assert 0.85 < ratio < 1.18, f"ε = {epsilon}, prefix {m}: estimated/empirical variance = {ratio:.3f}"
