"""Distribution mechanisms (protocols.distribution): grid, validation, exact ε from full likelihood tables,
range decomposition, consistency, the common result (CDF, quantiles, intervals) and ``auto``."""

from __future__ import annotations

import inspect
import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from protocols.distribution import (
    AnalyticDistribution,
    BucketGrid,
    DistributionEstimate,
    FlatOracle,
    HaarDistribution,
    HierarchicalIntervals,
    SquareWave,
    choose_distribution_mechanism,
    isotonic_regression,
    optimal_branching,
    query_variance,
    square_wave_parameters,
)
from protocols.distribution.choose import query_ranges
from protocols.distribution.hierarchical import decompose, tree_height
from protocols.hashing import hash_matrix
from tests.conftest import EPSILONS


# ----------------------------------------------------------------------------- grid
def test_grid_maps_values_to_buckets_with_clipping():
    g = BucketGrid(10.0, 20.0, 4)
    assert g.bucket([9.0, 10.0, 12.49, 12.5, 19.99, 20.0, 25.0]).tolist() == [0, 0, 0, 1, 3, 3, 3]
    assert np.allclose(g.edges, [10, 12.5, 15, 17.5, 20])
    assert np.allclose(g.unit([10, 15, 30]), [0, 0.5, 1])
    # quantiles map back to raw values through the edges (DistributionEstimate.quantile)
    assert np.allclose(np.interp([0.25], np.linspace(0, 1, g.D + 1), g.edges), [12.5])


@pytest.mark.parametrize("args", [(1, 1, 4), (2, 1, 4), (0, float("inf"), 4), (0, 1, 6), (0, 1, 1), (0, 1, 2.0),
                                  ("a", 1, 4)])
def test_grid_rejects_bad_parameters(args):
    with pytest.raises(ValueError):
        BucketGrid(*args)


def test_grid_allows_non_power_of_two_on_request_and_rejects_nan():
    assert BucketGrid(0, 1, 6, require_power_of_two=False).D == 6
    with pytest.raises(ValueError):
        BucketGrid(0, 1, 4).bucket([np.nan])


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("factory", [
    lambda: FlatOracle(0, 8), lambda: FlatOracle(1, 1), lambda: FlatOracle(1, 8, oracle="grr"),
    lambda: HierarchicalIntervals(1, 8, branching=1), lambda: HierarchicalIntervals(1, 8, oracle="x"),
    lambda: HierarchicalIntervals(1, 8, consistency="yes"), lambda: HierarchicalIntervals(-1, 8),
    lambda: HaarDistribution(float("nan"), 8), lambda: HaarDistribution(1, 1.5),
    lambda: SquareWave(0, 8), lambda: SquareWave(1, 8, resolution=12), lambda: SquareWave(1, 8, smoothing=1),
    lambda: SquareWave(25.0, 8),
])
def test_constructors_validate(factory):
    with pytest.raises(ValueError):
        factory()


def test_unknown_keyword_is_a_type_error_not_silently_ignored():
    with pytest.raises(TypeError):
        HierarchicalIntervals(1.0, 8, branchng=4)  # noqa: the typo is the point


@pytest.mark.parametrize("mech", [FlatOracle(1.0, 8), HierarchicalIntervals(1.0, 8), HaarDistribution(1.0, 8)])
def test_bucket_inputs_are_validated(mech, rng):
    with pytest.raises(ValueError):
        mech.privatize([0, 8], rng)
    with pytest.raises(ValueError):
        mech.privatize_unit([0.5, 1.5], rng)


def test_square_wave_inputs_are_validated(rng):
    with pytest.raises(ValueError):
        SquareWave(1.0, 8).privatize([0.2, -0.1], rng)
    with pytest.raises(ValueError):
        SquareWave(1.0, 8).estimate([3.0])


# ----------------------------------------------------------------------------- exact ε
def _max_ratio(table: np.ndarray) -> float:
    """table[v, r] = P[r | v]: max over outputs and input pairs of the likelihood ratio."""
    return float(np.max(table.max(axis=0) / table.min(axis=0)))


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_flat_oue_full_likelihood_table(epsilon):
    mech = FlatOracle(epsilon, 4, "oue")
    outputs = np.array(list(itertools.product([0, 1], repeat=4)), dtype=np.uint8)
    table = np.stack([mech.likelihood(outputs, v) for v in range(4)])
    assert np.allclose(table.sum(axis=1), 1.0)
    assert math.isclose(_max_ratio(table), math.exp(epsilon), rel_tol=1e-12)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_flat_olh_likelihood_ratio_given_the_seed(epsilon, rng):
    mech = FlatOracle(epsilon, 8, "olh")
    reports = mech.privatize(rng.integers(0, 8, 4000), rng)
    table = np.stack([mech.likelihood(reports, v) for v in range(8)])
    assert math.isclose(_max_ratio(table), math.exp(epsilon), rel_tol=1e-12)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_hierarchical_oue_full_likelihood_table(epsilon):
    """D = 4, B = 2: level 1 (2 bits) and level 2 (4 bits); every possible report, every input."""
    mech = HierarchicalIntervals(epsilon, 4, branching=2, oracle="oue")
    rows = []
    for lvl, width in ((1, 2), (2, 4)):
        for bits in itertools.product([0, 1], repeat=width):
            rows.append([lvl, *bits, *([0] * (4 - width))])
    reports = np.array(rows, dtype=np.uint8)
    table = np.stack([mech.likelihood(reports, v) for v in range(4)])
    assert np.allclose(table.sum(axis=1), 1.0)
    assert math.isclose(_max_ratio(table), math.exp(epsilon), rel_tol=1e-12)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_hierarchical_olh_likelihood_ratio(epsilon, rng):
    mech = HierarchicalIntervals(epsilon, 16, branching=4, oracle="olh")
    reports = mech.privatize(rng.integers(0, 16, 4000), rng)
    table = np.stack([mech.likelihood(reports, v) for v in range(16)])
    assert math.isclose(_max_ratio(table), math.exp(epsilon), rel_tol=1e-12)


def test_hierarchical_privatize_matches_likelihood(rng):
    """The sampler follows the stated law: empirical report frequencies ≈ likelihood (D = 4, B = 2, OUE)."""
    mech = HierarchicalIntervals(1.0, 4, branching=2, oracle="oue")
    reports = mech.privatize(np.full(200_000, 2), rng)
    keys, counts = np.unique(reports, axis=0, return_counts=True)
    expected = mech.likelihood(keys, 2) * reports.shape[0]
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 5)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_haar_full_report_distribution(epsilon):
    mech = HaarDistribution(epsilon, 8)
    table = np.stack([mech.report_distribution(v) for v in range(8)])
    assert np.allclose(table.sum(axis=1), 1.0)
    assert math.isclose(_max_ratio(table), math.exp(epsilon), rel_tol=1e-12)


@pytest.mark.parametrize("epsilon", [*EPSILONS, 0.1, 8.0])
def test_square_wave_density_ratio_is_exactly_e_eps(epsilon):
    """The continuous parameters as Li et al. give them, and the released grid law's exact ratio (SPEC §3.0): every
    window start's row of the exact channel against every other, enumerated on a small resolution."""
    from fractions import Fraction

    from protocols.exact import ratio_within
    from protocols.numeric._grid import channel_epsilon

    b, p, q = square_wave_parameters(epsilon)
    e = math.exp(epsilon)
    assert math.isclose(b, (epsilon * e - e + 1) / (2 * e * (e - 1 - epsilon)), rel_tol=1e-9)
    assert math.isclose(p / q, e, rel_tol=1e-12)
    assert math.isclose(2 * b * p + q, 1.0, rel_tol=1e-12)  # total mass over [−b, 1+b]
    mech = SquareWave(epsilon, 8)
    ch = mech.channel
    assert ch.cells == mech.cells and ch.window == round(mech.cells * 2 * b / (1 + 2 * b))
    rows = [mech.channel_row(s) for s in (0, 1, ch.positions // 2, ch.positions - 1)]
    assert all(sum(r) == 1 for r in rows)
    ratio = channel_epsilon(rows)
    assert isinstance(ratio, Fraction) and ratio_within(ratio.numerator, ratio.denominator, epsilon)
    assert float(ratio) == pytest.approx(e, rel=1e-6)
    assert np.all(mech.likelihood([-1, mech.cells, 0.5], 0.5) == 0)  # not cells: impossible


def test_square_wave_sampler_matches_density(rng):
    from scipy import stats

    mech = SquareWave(1.0, 8)
    y = mech.privatize(np.full(400_000, 0.3), rng)
    assert y.dtype == np.int64 and y.min() >= 0 and y.max() < mech.cells
    per = mech.cells // 64
    counts = np.bincount(y // per, minlength=64)
    expected = np.add.reduceat(mech.likelihood(np.arange(mech.cells), 0.3), np.arange(0, mech.cells, per)) * y.size
    assert stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue > 1e-4


# ----------------------------------------------------------------------------- hierarchical internals
@pytest.mark.parametrize("D,B", [(16, 2), (16, 4), (27, 3), (20, 3), (64, 8), (10, 16)])
def test_decomposition_is_an_exact_minimal_cover(D, B):
    h = tree_height(D, B)
    assert B**h >= D > B ** (h - 1) or h == 1
    for a in range(D):
        for b in range(a, D):
            parts = decompose(a, b, B, h)
            covered = []
            for lvl, nodes in parts.items():
                assert nodes.size <= 2 * (B - 1) or lvl == 0
                w = B ** (h - lvl)
                for v in nodes:
                    covered.extend(range(v * w, (v + 1) * w))
            assert sorted(covered) == list(range(a, b + 1))


def test_consistency_is_a_fixed_point_on_true_trees_and_makes_the_tree_additive(rng):
    """The constrained inference is linear and returns any exact tree unchanged (hence it preserves
    expectations: consistent estimates of unbiased ones are unbiased), and its output is additive."""
    mech = HierarchicalIntervals(1.0, 27, branching=3)
    hist = rng.dirichlet(np.ones(27))
    true = [hist.reshape(3**lvl, -1).sum(axis=1) for lvl in range(4)]
    out = mech.consistent_levels(true)
    for a, b in zip(out, true):
        assert np.allclose(a, b)
    noisy = [true[0]] + [t + rng.normal(0, 0.05, t.size) for t in true[1:]]
    cons = mech.consistent_levels(noisy)
    assert np.isclose(cons[0][0], 1.0)
    for lvl in range(1, 4):
        assert np.allclose(cons[lvl].reshape(-1, 3).sum(axis=1), cons[lvl - 1])


def test_hierarchical_range_variance_at_zero_matches_the_paper_form():
    mech = HierarchicalIntervals(1.0, 64, branching=4, oracle="oue")
    vf = mech.q * (1 - mech.q) / (mech.p - mech.q) ** 2
    for a, b in [(0, 0), (1, 62), (5, 40), (16, 31)]:
        m = sum(n.size for n in decompose(a, b, 4, 3).values())
        assert math.isclose(mech.raw_range_variance(a, b, 0.0), 3 * m * vf, rel_tol=1e-12)
    assert mech.raw_range_variance(0, 63, 1.0) == 0.0  # the root is known
    assert mech.range_variance(0, 63, 1.0) == pytest.approx(0.0, abs=1e-12)  # consistent: the root too


@pytest.mark.parametrize("D, B", [(16, 4), (64, 2), (20, 3), (16, 16)])
def test_consistency_adjoint_is_the_transpose_of_the_consistent_tree(D, B, rng):
    """The raw node weights of a leaf query on the consistent tree equal those found by probing consistent_levels
    with each raw node (the map is affine: probe minus the all-zero tree)."""
    mech = HierarchicalIntervals(1.0, D, B, "oue")
    zero = [np.ones(1)] + [np.zeros(B**lvl) for lvl in range(1, mech.h + 1)]
    base = mech.consistent_levels(zero)[mech.h][:D]
    cols = []
    for lvl in range(1, mech.h + 1):
        for i in range(B**lvl):
            probe = [x.copy() for x in zero]
            probe[lvl][i] = 1.0
            cols.append(mech.consistent_levels(probe)[mech.h][:D] - base)
    W = rng.normal(size=(4, D))
    assert np.allclose(np.concatenate(mech._consistency_adjoint(W), axis=1), W @ np.array(cols).T, atol=1e-12)


def test_consistent_variance_with_a_decomposition_is_the_raw_formula():
    """query_variances' general formula, fed a raw range's decomposition weights, is the module's raw formula."""
    mech = HierarchicalIntervals(2.0, 64, branching=4, oracle="oue")
    hist = np.full(64, 1 / 64)
    nodes = decompose(5, 40, 4, mech.h)
    u = [np.zeros((1, 4**lvl)) for lvl in range(1, mech.h + 1)]
    for lvl, idx in nodes.items():
        u[lvl - 1][0, idx] = 1.0
    mech._consistency_adjoint = lambda W: u  # the raw estimator's node weights
    assert mech.query_variances(np.zeros((1, 64)), hist)[0] == pytest.approx(
        mech.raw_range_variance(5, 40, 36 / 64), rel=1e-12)


def test_hierarchical_needs_every_level(rng):
    mech = HierarchicalIntervals(1.0, 16, branching=2)
    reports = mech.privatize([3], rng)
    with pytest.raises(ValueError, match="level"):
        mech.estimate(reports)


def test_hierarchical_statistics_are_additive(rng):
    mech = HierarchicalIntervals(1.0, 16, branching=4, oracle="olh")
    r = mech.privatize(rng.integers(0, 16, 3000), rng)
    whole = mech.level_statistics(r)
    parts = [mech.level_statistics(r[:1000]), mech.level_statistics(r[1000:])]
    for (n, c), (n1, c1), (n2, c2) in zip(whole, *parts):
        assert n == n1 + n2 and np.array_equal(c, c1 + c2)


@pytest.mark.parametrize("oracle", ["oue", "olh"])
def test_flat_statistics_are_additive_and_hold_olh_prefix_squares(oracle, rng):
    """Two batches' statistics sum to the whole's (support counts and, for OLH, Q_m = Σ_u S_u(m)²), and the
    estimate from the summed statistics equals the estimate from the reports."""
    from protocols import catalogue

    mech = FlatOracle(2.0, 16, oracle)
    entry = catalogue.distribution_entry(mech)
    r = mech.privatize(rng.integers(0, 16, 3000), rng)
    whole = entry.statistics(mech, r)
    summed = entry.statistics(mech, r[:1000]) + entry.statistics(mech, r[1000:]) + entry.statistics(mech, r[:0])
    assert whole.n == summed.n == 3000
    np.testing.assert_array_equal(whole.total, summed.total)
    np.testing.assert_array_equal(whole.squares, summed.squares)
    assert whole.squares.shape == ((16,) if oracle == "olh" else (0,))
    if oracle == "olh":
        hits = hash_matrix(r[:, 0], 16, mech.oracle.g) == r[:, 1:2]
        np.testing.assert_array_equal(whole.squares, (np.cumsum(hits, axis=1) ** 2).sum(axis=0))
    direct, kept = mech.distribution(r), entry.distribution(mech, summed)
    np.testing.assert_allclose(kept.cdf, direct.cdf)
    np.testing.assert_allclose(kept.cdf_variance, direct.cdf_variance)


def test_flat_olh_without_prefix_squares_falls_back_to_the_formula(rng):
    """Aggregates kept before Q existed (squares empty) still estimate: the CDF variance is the formula's."""
    from protocols import catalogue
    from protocols.catalogue import Statistics

    mech = FlatOracle(4.0, 64, "olh")
    stats = catalogue.distribution_entry(mech).statistics(mech, mech.privatize(rng.integers(0, 64, 2000), rng))
    old = catalogue.distribution_entry(mech).distribution(mech, Statistics(stats.n, stats.total, np.zeros(0)))
    np.testing.assert_allclose(old.cdf_variance, mech.plugin_variances(old.histogram, old.cdf)[1])
    new = catalogue.distribution_entry(mech).distribution(mech, stats)
    np.testing.assert_allclose(new.histogram_variance, old.histogram_variance)  # ℓ = 1: the exact formula
    assert new.cdf_variance[-2] > 1.8 * old.cdf_variance[-2]  # the formula misses the hash's correlation


# ----------------------------------------------------------------------------- the common result
def test_isotonic_regression_matches_brute_force(rng):
    from scipy.optimize import isotonic_regression as scipy_iso  # server-side check only

    for _ in range(20):
        y = rng.normal(size=15)
        w = rng.uniform(0.5, 2.0, 15)
        assert np.allclose(isotonic_regression(y, w), scipy_iso(y, weights=w).x)


def test_quantiles_invert_the_linear_cdf():
    D = 4
    hist = np.full(D, 0.25)
    est = DistributionEstimate(hist, np.cumsum(hist), 1000, "test", True, np.full(D, 1.0), np.full(D, 1.0))
    assert np.allclose(est.quantile([0.1, 0.5, 0.875]), [0.1, 0.5, 0.875])
    lo, hi = est.quantile_interval([0.5])
    assert lo[0] < 0.5 < hi[0]
    assert est.histogram_interval() is not None


def test_consistent_cdf_is_monotone_in_unit_interval_and_sums():
    raw_cdf = np.array([-0.05, 0.3, 0.2, 0.7, 1.1, 1.02])
    est = DistributionEstimate(np.diff(np.concatenate([[0], raw_cdf])), raw_cdf, 100, "test", True)
    c = est.consistent_cdf
    assert np.all(np.diff(c) >= 0) and c[0] >= 0 and c[-1] == 1.0
    assert np.isclose(est.consistent_histogram.sum(), 1.0) and np.all(est.consistent_histogram >= 0)
    assert est.quantile_interval([0.5]) is None and est.cdf_interval() is None
    with pytest.raises(ValueError):
        est.quantile([0.0])


def test_distribution_estimate_in_raw_units(rng):
    grid = BucketGrid(0.0, 100.0, 16)
    mech = FlatOracle(2.0, 16, "oue")
    x = rng.uniform(0, 100, 20_000)
    est = mech.distribution(mech.privatize(grid.bucket(x), rng), edges=grid.edges)
    assert abs(est.quantile([0.5])[0] - 50) < 10


@pytest.mark.parametrize("mech", [FlatOracle(1.0, 16, "oue"), FlatOracle(1.0, 16, "olh"),
                                  HierarchicalIntervals(1.0, 16, 4, "oue"), HierarchicalIntervals(1.0, 16, 2, "olh"),
                                  HaarDistribution(1.0, 16), SquareWave(1.0, 16)])
def test_every_mechanism_gives_a_distribution(mech, rng):
    u = rng.beta(2, 5, 5000)
    est = mech.distribution(mech.privatize_unit(u, rng))
    assert est.histogram.shape == (16,) and est.cdf.shape == (16,)
    assert est.unbiased == (not isinstance(mech, SquareWave))
    assert (est.cdf_variance is None) == isinstance(mech, SquareWave)
    assert np.all(np.diff(est.consistent_cdf) >= 0)
    q = est.quantile([0.25, 0.5, 0.75])
    assert np.all(np.diff(q) >= 0) and abs(q[1] - np.median(u)) < 0.15


def test_square_wave_has_no_variance_and_says_it_is_biased():
    mech = SquareWave(1.0, 8)
    assert not isinstance(mech, AnalyticDistribution)
    assert not any(hasattr(mech, name) for name in ("range_variance", "variance", "bias"))
    assert "NotImplementedError" not in Path(inspect.getfile(SquareWave)).read_text()
    assert not mech.unbiased  # and no analytic variance: not an AnalyticDistribution (above)


# ----------------------------------------------------------------------------- auto
def test_auto_picks_the_least_analytic_variance_and_excludes_square_wave():
    for query, length in (("cdf", None), ("histogram", None), ("range", 8), ("quantile", None)):
        choice = choose_distribution_mechanism(1.0, 64, query, length)
        assert choice.variances[choice.method] == min(choice.variances.values())
        assert "square_wave" not in choice.variances
        assert math.isclose(query_variance(choice.mechanism, query, length), choice.variances[choice.method])
    # single buckets: a flat oracle has V_F, any tree pays for the level sampling
    assert choose_distribution_mechanism(1.0, 64, "histogram").method.startswith("flat_")


def test_auto_considers_every_branching_optimal_branching_does():
    """At D = 16 the one-level tree (B = 16: the flat oracle made consistent with the known total) has the least
    consistent CDF variance at ε = 4; auto and optimal_branching must agree on it."""
    choice = choose_distribution_mechanism(4.0, 16, "cdf")
    assert choice.method == f"hierarchical_oue_B{optimal_branching(4.0, 16, 'oue', 'cdf')}" == "hierarchical_oue_B16"
    assert choice.variances["hierarchical_oue_B16"] < choice.variances["flat_oue"] / 2


def test_auto_ranks_hierarchical_methods_by_their_consistent_variance():
    """The consistent estimate's variance (what the mechanism returns) ranks the trees, not the raw formula."""
    mech = HierarchicalIntervals(1.0, 64, 4, "oue")
    assert query_variance(mech, "cdf") == pytest.approx(np.mean(
        [mech.range_variance(0, j, (j + 1) / 64) for _, j in query_ranges(64, "cdf")]))
    assert query_variance(mech, "cdf") < np.mean(
        [mech.raw_range_variance(0, j, (j + 1) / 64) for _, j in query_ranges(64, "cdf")])


def test_auto_rejects_bad_queries():
    with pytest.raises(ValueError):
        choose_distribution_mechanism(1.0, 64, "median")
    with pytest.raises(ValueError):
        choose_distribution_mechanism(1.0, 64, "range")
    with pytest.raises(ValueError):
        choose_distribution_mechanism(1.0, 64, "cdf", length=3)
    with pytest.raises(ValueError):
        query_variance(SquareWave(1.0, 8), "cdf")


def test_optimal_branching_is_in_range():
    assert 2 <= optimal_branching(1.0, 256, "olh") <= 16
    assert 2 <= optimal_branching(1.0, 256, "oue", "cdf") <= 16


def test_device_path_imports_no_scipy():
    code = ("import sys, numpy as np\n"
            "from protocols.distribution import BucketGrid, FlatOracle, HierarchicalIntervals, HaarDistribution,"
            " SquareWave\n"
            "rng = np.random.default_rng(1); g = BucketGrid(0, 1, 16); u = g.unit([0.1, 0.7])\n"
            "for m in (FlatOracle(1.0, 16), FlatOracle(1.0, 16, 'olh'), HierarchicalIntervals(1.0, 16),"
            " HaarDistribution(1.0, 16), SquareWave(1.0, 16)):\n"
            "    m.privatize_unit(u, rng)\n"
            "print('scipy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_quantile_intervals_cover_the_truth_at_bucket_resolution():
    """The quantile interval's ends are bucket edges and contain the exact grid quantile of a noiseless estimate."""
    hist = np.array([0.1, 0.4, 0.3, 0.2])
    est = DistributionEstimate(hist, np.cumsum(hist), 1000, "exact", True, np.full(4, 0.01), np.full(4, 0.01))
    lo, hi = est.quantile_interval([0.3, 0.5, 0.95])
    edges = np.linspace(0, 1, 5)
    assert set(lo) | set(hi) <= set(edges)
    q = est.quantile([0.3, 0.5, 0.95])
    assert np.all(lo <= q) and np.all(q <= hi)


def test_large_grids_fall_back_to_the_conservative_raw_formula(monkeypatch):
    """Beyond EXACT_VARIANCE_MAX_D the CDF intervals use the raw formula (exact variance costs O(D·B^h))."""
    from protocols.distribution import hierarchical

    mech = HierarchicalIntervals(1.0, 64, 4, "oue")
    hist = np.full(64, 1 / 64)
    exact = mech.plugin_variances(hist, np.cumsum(hist))[1]
    monkeypatch.setattr(hierarchical, "EXACT_VARIANCE_MAX_D", 32)
    raw = mech.plugin_variances(hist, np.cumsum(hist))[1]
    assert raw[10] == pytest.approx(mech.raw_range_variance(0, 10, 11 / 64))
    assert np.all(exact[:-1] <= raw[:-1] * 1.001)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_auto_ranks_flat_olh_only_for_single_buckets(eps):
    """Flat OLH's range formula is idealised for sums of ≥ 2 buckets (its hash is not 3-wise independent), so auto
    never ranks it by that formula: it is a candidate for single-bucket queries only."""
    for D in (8, 64):
        for query, length in (("cdf", None), ("quantile", None), ("range", 2), ("range", D // 2)):
            assert "flat_olh" not in choose_distribution_mechanism(eps, D, query, length).variances
        for query, length in (("histogram", None), ("range", 1)):
            assert "flat_olh" in choose_distribution_mechanism(eps, D, query, length).variances
