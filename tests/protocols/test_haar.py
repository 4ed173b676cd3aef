import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocols.haar import (
    HaarHRR,
    haar_analysis_matrix,
    haar_forward,
    haar_inverse,
    haar_inverse_variance,
    haar_range_weights,
    haar_synthesis_matrix,
    padded_size,
)

unit_floats = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False, allow_infinity=False)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 5))
    d = draw(st.integers(1, 40))
    return draw(hnp.arrays(np.float64, (n, d), elements=unit_floats))


@pytest.mark.parametrize(("d", "D"), [(1, 2), (2, 2), (3, 4), (4, 4), (5, 8), (16, 16), (17, 32), (360, 512)])
def test_padded_size(d, D):
    assert padded_size(d) == D


def test_padded_size_rejects_bad_d():
    with pytest.raises(ValueError, match="d must be >= 1"):
        padded_size(0)


def test_forward_known_example_breadth_first():
    m, c = haar_forward(np.array([[1.0, 0.0, -1.0, 0.5]]))
    assert m == pytest.approx([0.125])
    # root: (mean(1,0) - mean(-1,0.5))/2; then left node (1-0)/2; right node (-1-0.5)/2
    np.testing.assert_allclose(c, [[0.375, 0.5, -0.75]])
    m3, c3 = haar_forward(np.array([1.0, 0.0, -1.0]))  # padded with a zero; 1-D input
    assert float(m3) == pytest.approx(0.0)
    np.testing.assert_allclose(c3, [0.5, 0.5, -0.5])


@settings(max_examples=60, deadline=None)
@given(batches())
def test_inverse_of_forward_is_identity(x):
    m, c = haar_forward(x)
    D = padded_size(x.shape[1])
    assert m.shape == (x.shape[0],) and c.shape == (x.shape[0], D - 1)
    np.testing.assert_allclose(haar_inverse(m, c, x.shape[1]), x, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_coefficients_stay_in_unit_interval(x):
    m, c = haar_forward(x)
    assert np.all(np.abs(m) <= 1.0) and np.all(np.abs(c) <= 1.0)


def test_extreme_inputs_reach_the_bounds():
    m, c = haar_forward(np.array([[1.0, -1.0], [1.0, 1.0]]))
    np.testing.assert_allclose(m, [0.0, 1.0])
    np.testing.assert_allclose(c, [[1.0], [0.0]])


def test_matrix_forms_agree_with_fast_transform(rng):
    d = 11
    x = rng.uniform(-1, 1, size=(6, d))
    A, B = haar_analysis_matrix(d), haar_synthesis_matrix(d)
    m, c = haar_forward(x)
    np.testing.assert_allclose((A @ x.T).T, np.column_stack([m, c]), atol=1e-12)
    np.testing.assert_allclose((B @ np.column_stack([m, c]).T).T, x, atol=1e-12)
    assert set(np.unique(B)) <= {-1.0, 0.0, 1.0}
    # each coordinate sums log2(D) + 1 coefficients
    assert np.all(np.count_nonzero(B, axis=1) == math.log2(padded_size(d)) + 1)


def test_inverse_variance_matches_the_synthesis_matrix(rng):
    d = 13
    D = padded_size(d)
    var_m, var_c = 0.7, rng.uniform(0.1, 2.0, size=D - 1)
    B = haar_synthesis_matrix(d)
    expected = (B**2) @ np.concatenate([[var_m], var_c])
    np.testing.assert_allclose(haar_inverse_variance(var_m, var_c, d), expected)
    np.testing.assert_allclose(haar_inverse_variance(1.0, 1.0, 8), np.full(8, 4.0))


def test_inverse_variance_monte_carlo(rng):
    d, n = 6, 200_000
    var_m, var_c = 0.5, np.array([0.2, 1.0, 0.3, 0.1, 0.4, 0.6, 2.0])
    m = rng.normal(0, math.sqrt(var_m), n)
    c = rng.normal(0, np.sqrt(var_c), (n, 7))
    emp = haar_inverse(m, c, d).var(axis=0)
    theory = haar_inverse_variance(var_m, var_c, d)
    # sample variance of a Gaussian: relative s.e. sqrt(2/n) ≈ 0.3%; allow 5 s.e.
    np.testing.assert_allclose(emp, theory, rtol=5 * math.sqrt(2 / n))


@pytest.mark.parametrize(("d", "a", "b"), [(8, 0, 7), (8, 2, 5), (8, 3, 3), (13, 1, 12), (13, 0, 0), (100, 17, 80)])
def test_range_weights(rng, d, a, b):
    x = rng.uniform(-1, 1, size=d)
    m, c = haar_forward(x)
    w_m, w_c = haar_range_weights(d, a, b)
    assert w_m * m + w_c @ c == pytest.approx(x[a : b + 1].sum())
    D = padded_size(d)
    for h in range(int(math.log2(D))):
        assert np.count_nonzero(w_c[(1 << h) - 1 : (1 << (h + 1)) - 1]) <= 2


def test_input_validation():
    with pytest.raises(ValueError, match="finite"):
        haar_forward([[np.nan, 0.0]])
    with pytest.raises(ValueError, match="shape"):
        haar_forward(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="c must have shape"):
        haar_inverse(np.zeros(2), np.zeros((2, 2)), 4)
    with pytest.raises(ValueError, match="m must have shape"):
        haar_inverse(np.zeros(3), np.zeros((2, 3)), 4)
    with pytest.raises(ValueError, match="non-negative"):
        haar_inverse_variance(-1.0, 1.0, 4)
    with pytest.raises(ValueError, match="a <= b"):
        haar_range_weights(8, 5, 2)
    with pytest.raises(ValueError, match="b must be"):
        haar_range_weights(8, 0, 8)


# ---------------------------------------------------------------- HaarHRR


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("k", [2, 5, 16])
def test_haarhrr_exact_likelihood_ratio(epsilon, k):
    mech = HaarHRR(epsilon, k)
    P = np.array([mech.report_distribution(v) for v in range(k)])
    assert P.shape == (k, 2 * (mech.D - 1))
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    assert np.all(P > 0)
    worst = np.log(P.max(axis=0) / P.min(axis=0)).max()
    assert worst == pytest.approx(epsilon, rel=1e-12)  # exactly ε: the bound is attained and never exceeded


def test_haarhrr_reports_follow_the_exact_distribution(rng):
    mech = HaarHRR(1.0, 6)
    n = 200_000
    for v in (0, 5):
        reports = mech.privatize(np.full(n, v), rng)
        counts = np.bincount(HaarHRR.report_index(reports), minlength=2 * (mech.D - 1))
        probs = mech.report_distribution(v)
        se = np.sqrt(n * probs * (1 - probs))
        assert np.all(np.abs(counts - n * probs) < 5 * se + 1)


def test_haarhrr_report_format(rng):
    mech = HaarHRR(2.0, 10)
    r = mech.privatize(rng.integers(0, 10, 1000), rng)
    assert r.shape == (1000, 3) and r.dtype == np.int64
    assert set(np.unique(r[:, 2])) <= {-1, 1}
    assert np.all((r[:, 0] >= 0) & (r[:, 0] < mech.levels))
    assert np.all(r[:, 1] < (1 << r[:, 0]))


def test_haarhrr_estimate_and_range_query_agree(rng):
    mech = HaarHRR(1.0, 12)
    values = rng.integers(0, 12, 5000)
    reports = mech.privatize(values, rng)
    est = mech.estimate(reports)
    assert est.shape == (12,)
    # the padded leaves carry the rest of the (exactly known) total mass 1
    m, c = mech.haar_coefficients(reports)
    assert haar_inverse(m, c, mech.D).sum() == pytest.approx(1.0)
    for a, b in [(0, 11), (3, 7), (4, 4)]:
        from_est = mech.range_query(est, a, b)
        assert mech.range_query(reports, a, b) == pytest.approx(from_est)
        assert mech.range_contributions(reports, a, b).mean() == pytest.approx(from_est)


def test_haarhrr_point_variance_is_the_same_for_every_value():
    mech = HaarHRR(1.0, 16)
    v = [mech.range_variance(i, i) for i in range(16)]
    np.testing.assert_allclose(v, mech.variance())
    L, g = mech.levels, (math.e - 1) / (math.e + 1)
    assert mech.variance() == pytest.approx(L * (1 - 1 / 256) / 3 / g**2 - 1 / 256)


def test_haarhrr_validation(rng):
    with pytest.raises(ValueError, match="k must be >= 2"):
        HaarHRR(1.0, 1)
    with pytest.raises(ValueError, match="epsilon"):
        HaarHRR(0.0, 4)
    mech = HaarHRR(1.0, 4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        mech.privatize([4], rng)
    with pytest.raises(ValueError, match="zero reports"):
        mech.estimate(np.zeros((0, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        mech.estimate(np.zeros((5, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="bits"):
        mech.estimate(np.array([[0, 0, 0]]))
    with pytest.raises(ValueError, match="Hadamard"):
        mech.estimate(np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="a <= b"):
        mech.range_variance(3, 1)
    with pytest.raises(ValueError, match="frequency estimate"):
        mech.range_query(np.zeros(3), 0, 1)
