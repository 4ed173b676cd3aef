"""Hadamard response at every ε (protocols/frequency/hadamard.py): the construction chosen by ε and k (the cheapest
design within 1.1× of the optimum), exact ε from the
full likelihood table, exact unbiasedness and variance from the same table, the FWHT decode against brute force,
the samplers against the exact law, the variance against the optimum 4e^ε/(e^ε-1)² on a dense ε grid, and the
coordinator's support check on the new output spaces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from protocols.frequency import HadamardResponse
from protocols.frequency import hadamard
from protocols.frequency.hadamard import (
    MAX_LOG2_OUTPUTS,
    VARIANCE_TOLERANCE,
    _admissible_rows,
    _design_variance,
    choose_rows,
    fwht,
    irreducible_polynomial,
    least_variance_rows,
    optimal_variance,
    output_space,
)

EPS_GRID = np.round(np.arange(0.05, 10.0 + 1e-9, 0.05), 2)
#: (k, rows) pairs covering every construction: direct, the high-privacy design, and m = 2, 3 (k not a power of 2).
DESIGNS = [(5, 0), (6, 1), (7, 2), (6, 2), (11, 3), (16, 3), (9, 2)]


def _table(o: HadamardResponse) -> np.ndarray:
    """P[y | x] for every input x (rows) and output y (columns)."""
    return np.stack([o.likelihood(np.arange(o.K), x) for x in range(o.k)])


def _support(o: HadamardResponse) -> np.ndarray:
    """1[y ∈ C_v] for every item v (rows) and output y (columns)."""
    return np.stack([o.in_support(np.arange(o.K), v) for v in range(o.k)]).astype(float)


# --- the construction -----------------------------------------------------------------------------------------------


def test_irreducible_polynomials_have_no_factor():
    for degree in range(2, 13):  # brute force: no polynomial of degree 1..degree/2 divides it
        poly = irreducible_polynomial(degree)
        assert poly >> degree == 1
        for d in range(1, degree // 2 + 1):
            for g in range(1 << d, 1 << (d + 1)):
                rem = poly
                while rem.bit_length() >= g.bit_length():
                    rem ^= g << (rem.bit_length() - g.bit_length())
                assert rem != 0, (degree, bin(poly), bin(g))


@pytest.mark.parametrize(("k", "rows"), DESIGNS)
def test_design_sizes_and_intersections(k, rows):
    """|C_v| = K/t and |C_v ∩ C_x| = K/t² for v ≠ x (m ≥ 1): a non-holder supports v w.p. exactly q = 1/t."""
    o = HadamardResponse(1.0, k, rows=rows)
    s = _support(o)
    gram = s @ s.T
    if rows == 0:
        np.testing.assert_array_equal(gram, np.eye(k))
        return
    assert o.K == (2 ** math.ceil(math.log2(k + 1)) if rows == 1 else 2 ** (rows + math.ceil(math.log2(k))))
    assert np.all(np.diag(gram) == o.K / o.t)
    off = gram[~np.eye(k, dtype=bool)]
    assert np.all(off == o.K / o.t**2)


@pytest.mark.parametrize(
    ("epsilon", "k", "rows"),
    [(0.5, 100, 1), (1.0, 100, 2), (2.0, 100, 3), (3.0, 100, 4), (5.0, 100, 0), (1.0, 3, 0), (3.0, 8, 0),
     (0.5, 8, 1), (0.5, 5, 0), (5.0, 1000, 7), (8.0, 10_000, 0), (7.0, 10_000, 10), (8.0, 16_384, 11),
     (2.0, 360, 3), (1.7, 360, 2), (8.0, 100_000, 9)],
)
def test_construction_chosen_by_epsilon(epsilon, k, rows):
    assert HadamardResponse(epsilon, k).rows == choose_rows(epsilon, k) == rows


def _ratio(epsilon, k, rows):
    return _design_variance(epsilon, k, rows) / optimal_variance(epsilon)


@pytest.mark.parametrize("k", [2, 6, 9, 33, 100, 1000, 4096, 10_000, 16_384, 16_385, 100_000, (1 << 26) - 1])
def test_default_is_the_cheapest_design_within_tolerance(k):
    """The rule itself: within 1.1x, no admissible design with a smaller output space is; otherwise least variance."""
    designs = _admissible_rows(k)
    for eps in EPS_GRID[::3]:
        eps = float(eps)
        m = choose_rows(eps, k)
        if _ratio(eps, k, m) <= VARIANCE_TOLERANCE:
            cheaper = [d for d in designs if output_space(k, d) < output_space(k, m)]
            assert all(_ratio(eps, k, d) > VARIANCE_TOLERANCE for d in cheaper), (eps, m, cheaper)
        else:
            assert all(_ratio(eps, k, d) > VARIANCE_TOLERANCE for d in designs)
            assert m == least_variance_rows(eps, k)


@pytest.mark.parametrize(
    ("k", "epsilon", "rows", "log2_outputs", "old_rows", "old_log2_outputs"),
    [
        (10_000, 8.0, 0, None, 12, 26),  # direct response, K = k = 10,000 instead of 2^26
        (16_384, 8.5, 0, None, 12, 26),
        (16_384, 8.0, 11, 25, 12, 26),
        (10_000, 7.5, 10, 24, 11, 25),
        (100_000, 6.0, 8, 25, 9, 26),
        (1 << 20, 4.0, 5, 25, 6, 26),
    ],
)
def test_large_domain_default_output_space_is_small(k, epsilon, rows, log2_outputs, old_rows, old_log2_outputs):
    """The default's K at large (k, ε), from the rule, against the least-variance design's."""
    o = HadamardResponse(epsilon, k)
    assert o.rows == rows
    assert o.K == (k if log2_outputs is None else 1 << log2_outputs)
    assert least_variance_rows(epsilon, k) == old_rows
    assert output_space(k, old_rows) == 1 << old_log2_outputs > o.K
    assert _ratio(epsilon, k, rows) <= VARIANCE_TOLERANCE
    if (k, epsilon) == (10_000, 8.0):
        assert o.K <= 1 << 14 and _ratio(epsilon, k, rows) == pytest.approx(1.0885, abs=1e-4)


@pytest.mark.parametrize("k", [6, 100, 1000, 4096, 8192, 10_000, 16_384, 16_385, 100_000, 1 << 20])
def test_never_worse_than_tolerance_where_least_variance_met_it(k):
    """Where the least-variance design is within 1.1x so is the default, with no larger output space; elsewhere the
    default is the least-variance design."""
    for eps in EPS_GRID:
        eps = float(eps)
        m, old = choose_rows(eps, k), least_variance_rows(eps, k)
        if _ratio(eps, k, old) <= VARIANCE_TOLERANCE:
            assert _ratio(eps, k, m) <= VARIANCE_TOLERANCE
            assert output_space(k, m) <= output_space(k, old)
        else:
            assert m == old


def test_small_domains_use_direct_response():
    """k ≤ 5: randomized response over the k items beats every Hadamard design at every ε (so HR is GRR there)."""
    for k in (2, 3, 4, 5):
        for eps in EPS_GRID:
            assert choose_rows(float(eps), k) == 0
            assert _design_variance(eps, k, 0) <= min(_design_variance(eps, k, 1), _design_variance(eps, k, 2))


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 33, 100, 360, 1000, 1300, 4096, 16384])
def test_variance_within_1_1_of_optimum_on_dense_grid(k):
    ratios = np.array([HadamardResponse(e, k).variance(0.0) / optimal_variance(e) for e in EPS_GRID])
    assert ratios.max() <= 1.1, f"k={k}: max ratio {ratios.max():.4f} at ε={EPS_GRID[ratios.argmax()]}"
    assert ratios.max() < 1.0992  # the default trades up to 1.1x for a smaller output space (worst: k ≥ 8192, ε 7.55)
    best = np.array([_ratio(float(e), k, least_variance_rows(float(e), k)) for e in EPS_GRID])
    assert best.max() < 1.0772  # the least-variance design's worst case: e^ε = √3, between t = 2 and t = 4


@pytest.mark.parametrize("k", [6, 100, 1300, 16385, 100_000, (1 << 26) - 1])
def test_never_worse_than_the_high_privacy_design(k):
    """The cap K ≤ 2^26 limits t for k > 2^14 at large ε (then the ratio exceeds 1.1), but the choice is never worse
    than the old single-set design unless it is within 1.1x of the optimum."""
    for eps in EPS_GRID[::4]:
        var = _design_variance(eps, k, choose_rows(eps, k))
        assert var <= max(_design_variance(eps, k, 1), VARIANCE_TOLERANCE * optimal_variance(eps)) * (1 + 1e-12)


def test_optimal_variance_formula():
    for eps in (0.1, 1.0, 3.0, 10.0):
        e = math.exp(eps)
        assert optimal_variance(eps) == pytest.approx(4 * e / (e - 1) ** 2, rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"rows": -1}, "rows"), ({"rows": 1.5}, "rows"), ({"rows": True}, "rows"), ({"rows": 5}, "rows must be <="),
     ({"rows": 27}, "rows")],
)
def test_rejects_bad_rows(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HadamardResponse(1.0, 11, **kwargs)


def test_rows_is_keyword_only_and_capped():
    with pytest.raises(TypeError):
        HadamardResponse(1.0, 11, 2)  # type: ignore[misc]
    with pytest.raises(ValueError, match=f"<= {MAX_LOG2_OUTPUTS}"):
        HadamardResponse(1.0, 1 << 20, rows=8)
    assert repr(HadamardResponse(1.0, 11, rows=2)) == "HadamardResponse(epsilon=1.0, k=11, rows=2)"


# --- exact privacy, unbiasedness and variance from the full likelihood table --------------------------------------


@pytest.mark.parametrize(("k", "rows"), DESIGNS)
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 2.0, 4.0, 9.0])
def test_exact_epsilon(k, rows, epsilon):
    """Max over outputs and input pairs of |log P[y|x] - log P[y|x']| equals ε (to 1e-9), not merely ≤ ε."""
    o = HadamardResponse(epsilon, k, rows=rows)
    table = _table(o)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=1e-12)
    logs = np.log(table)
    worst = float(np.max(logs.max(axis=0) - logs.min(axis=0)))
    assert abs(worst - epsilon) < 1e-9


@pytest.mark.parametrize(("k", "rows"), DESIGNS)
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 6.0])
def test_exact_unbiasedness_and_variance(k, rows, epsilon):
    """E[(1[Y ∈ C_v] - q)/(p - q) | x] = 1[x = v] and its variance is variance(1) for holders, variance(0) else."""
    o = HadamardResponse(epsilon, k, rows=rows)
    table = _table(o)
    contribution = (_support(o) - o.q) / (o.p - o.q)  # (v, y)
    mean = table @ contribution.T  # (x, v)
    np.testing.assert_allclose(mean, np.eye(k), atol=1e-9)
    var = table @ (contribution**2).T - mean**2
    expected = np.where(np.eye(k, dtype=bool), o.variance(1.0), o.variance(0.0))
    np.testing.assert_allclose(var, expected, rtol=1e-9)
    # a population: the per-user variance of f̂_v is the average over users, which variance(f) gives
    f = np.arange(1, k + 1) / (k * (k + 1) / 2)
    np.testing.assert_allclose(f @ var, o.variance(f), rtol=1e-9)


# --- decode, samplers, statistics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "rows"), [(7, 2), (11, 3), (100, 4), (37, 5), (6, 1), (5, 0)])
def test_fwht_support_counts_equal_brute_force(k, rows):
    rng = np.random.default_rng(k * 10 + rows)
    o = HadamardResponse(2.0, k, rows=rows)
    reports = o.privatize(rng.integers(0, k, 3000), rng)
    brute = np.array([np.count_nonzero(o.in_support(reports, v)) for v in range(k)])
    np.testing.assert_array_equal(o.support_counts(reports), brute)
    assert o.support_counts(reports[:0]).sum() == 0


@pytest.mark.parametrize(("k", "rows"), [(7, 2), (100, 4), (37, 5), (6, 1)])
def test_chunked_decode_equals_brute_force(monkeypatch, k, rows):
    """Tiny scratch and gather slices (both branches of the in-place transform, many item slices) change nothing."""
    monkeypatch.setattr(hadamard, "FWHT_CHUNK", 4)
    monkeypatch.setattr(hadamard, "GATHER_CHUNK", 16)
    rng = np.random.default_rng(k + rows)
    o = HadamardResponse(1.5, k, rows=rows)
    reports = o.privatize(rng.integers(0, k, 2000), rng)
    brute = np.array([np.count_nonzero(o.in_support(reports, v)) for v in range(k)])
    np.testing.assert_array_equal(o.support_counts(reports), brute)
    x = rng.integers(-50, 50, size=(3, 64))
    np.testing.assert_array_equal(fwht(x), x @ __import__("scipy.linalg").linalg.hadamard(64))


def test_decode_memory_is_the_histogram_plus_bounded_slices(monkeypatch):
    """Peak traced allocation of one decode at K = 2^20 (rows 6, k = 2^14) stays below 1.25 x the 8 MiB histogram:
    the transform is in place and the gather goes in slices (before: a copy, a K/2 scratch and 3 k x t arrays)."""
    import tracemalloc

    monkeypatch.setattr(hadamard, "GATHER_CHUNK", 1 << 14)
    monkeypatch.setattr(hadamard, "FWHT_CHUNK", 1 << 14)
    o = HadamardResponse(4.0, 1 << 14, rows=6)
    assert o.K == 1 << 20
    rng = np.random.default_rng(3)
    reports = o.privatize(rng.integers(0, o.k, 1000), rng)
    tracemalloc.start()
    try:
        o.support_counts(reports)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.25 * 8 * o.K, peak


@pytest.mark.parametrize(("k", "rows"), [(7, 2), (11, 3), (6, 2)])
@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_sampler_matches_likelihood(k, rows, epsilon):
    rng = np.random.default_rng(int(epsilon * 10) + k + rows)
    o = HadamardResponse(epsilon, k, rows=rows)
    for v in (0, k - 1):
        observed = np.bincount(o.privatize(np.full(60_000, v), rng), minlength=o.K)
        expected = o.likelihood(np.arange(o.K), v) * observed.sum()
        assert stats.chisquare(observed, expected).pvalue > 1e-4


@pytest.mark.parametrize(("epsilon", "k", "rows"), [(1.0, 20, 2), (3.0, 40, None), (3.0, 8, None), (2.0, 40, 1)])
def test_seeded_unbiasedness_and_simulated_variance(epsilon, k, rows):
    """300 repetitions of n = 3,000 users: mean within 5 SE of f, empirical variance within the χ² band."""
    rng = np.random.default_rng(31 + k)
    o = HadamardResponse(epsilon, k, rows=rows)
    probs = 1.0 / np.arange(1, k + 1)
    values = rng.choice(k, size=3000, p=probs / probs.sum())
    f = np.bincount(values, minlength=k) / values.size
    reps = 300
    est = np.stack([o.estimate(o.privatize(values, rng)) for _ in range(reps)])
    var = o.variance(f) / values.size
    z = (est.mean(axis=0) - f) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < 5), np.round(z, 2)
    ratio = est.var(axis=0, ddof=1) / var
    lo, hi = stats.chi2.ppf([1e-6 / 2, 1 - 1e-6 / 2], reps - 1) / (reps - 1)
    assert np.all((ratio > lo) & (ratio < hi)), np.round(ratio, 3)


# --- the coordinator's support check accepts the new outputs and rejects the rest ------------------------------------


@pytest.mark.parametrize(("epsilon", "k"), [(3.0, 100), (0.5, 100), (6.0, 100), (1.0, 7)])
def test_coordinator_support_check_uses_the_output_space(epsilon, k):
    from coordinator.decode import StreamDecoder
    from protocols.contract import StreamSpec

    spec = StreamSpec.model_validate(
        {"kind": "frequency", "mechanism": "hr", "params": {"epsilon": epsilon, "k": k}, "dims": ["app"]}
    )
    dec = StreamDecoder.for_spec(spec)
    o = dec.mechanism
    assert isinstance(o, HadamardResponse) and dec.row_shape == ()
    rng = np.random.default_rng(5)
    for row in o.privatize(rng.integers(0, k, 200), rng).tolist() + [0, o.K - 1]:
        dec.check_row(row)
    for bad in (o.K, -1, 1.5, [1], o.K + 12345):
        with pytest.raises(ValueError):
            dec.check_row(bad)
    mask = dec.valid_mask(np.array([0, o.K, 3, o.K - 1, -2], dtype=np.int64))
    np.testing.assert_array_equal(mask, [True, False, True, True, False])
