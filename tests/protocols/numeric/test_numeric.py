"""Exact tests of the numeric mechanisms: closed forms, exact likelihood ratios, validation.

Privacy is checked without sampling: every mechanism releases grid indices whose exact channel is enumerated in
tests/protocols/numeric/test_grid.py; here Duchi's multi-dimensional law is enumerated, and the Gaussian's
continuous calibration checked by the exact (ε, δ) curve of Balle & Wang (2018) (the discrete law's own δ is in
test_grid.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocols.base import NumericMechanism
from protocols.numeric import (
    HYBRID_EPSILON_STAR,
    MAX_EPSILON,
    PDP,
    Duchi,
    DuchiMultiDim,
    Gaussian,
    Hybrid,
    KSampling,
    Laplace,
    Piecewise,
    VectorMeanMechanism,
    analytic_gaussian_sigma,
    duchi_constant,
    gaussian_exact_delta,
    make_scalar_mechanism,
    optimal_pdp_width,
)
from tests.conftest import EPSILONS

SCALAR_PURE = (Laplace, Duchi, Piecewise, Hybrid, PDP)
T_GRID = np.linspace(-1.0, 1.0, 201)


def _max_ratio(density: np.ndarray) -> float:
    """``max_y max_t f(y|t) / min_t f(y|t)`` over a (n_t, n_y) table; outputs nobody can produce are skipped.

    Fails if some output has positive probability under one input and zero under another (ε = ∞).
    """
    positive = density > 0
    produced = positive.any(axis=0)
    assert np.all(positive[:, produced]), "support depends on the input: the ratio is infinite"
    dens = density[:, produced]
    return float(np.max(dens.max(axis=0) / dens.min(axis=0)))


# ---- parameter and input validation ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SCALAR_PURE)
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "one", None])
def test_constructors_reject_bad_epsilon(cls, bad):
    with pytest.raises(ValueError, match="epsilon"):
        cls(bad)


@pytest.mark.parametrize("cls", [Duchi, Piecewise, Hybrid, PDP])
def test_epsilon_cap(cls):
    assert cls(MAX_EPSILON).epsilon == MAX_EPSILON
    with pytest.raises(ValueError, match="epsilon must be <="):
        cls(MAX_EPSILON * 2)
    with pytest.raises(ValueError, match="epsilon must be <="):
        DuchiMultiDim(1000.0, 3)


@pytest.mark.parametrize("cls", [Duchi, Hybrid])
def test_numeric_epsilon_cap_keeps_outputs_random(cls):
    """ε is capped: beyond MAX_EPSILON double precision would make the outputs deterministic."""
    assert MAX_EPSILON <= 30
    with pytest.raises(ValueError, match="epsilon"):
        cls(MAX_EPSILON + 1)
    with pytest.raises(ValueError, match="epsilon"):
        DuchiMultiDim(MAX_EPSILON + 1, 3)


def test_constructor_validation():
    with pytest.raises(ValueError, match="analytic"):
        Gaussian(1.0, 1e-5)  # classic calibration is unproven for ε ≥ 1
    with pytest.raises(ValueError, match="calibration"):
        Gaussian(0.5, 1e-5, calibration="magic")
    for bad in (0, 1, -0.1, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            Gaussian(0.5, bad)
    for bad in (0, -1, float("inf"), "wide"):
        with pytest.raises(ValueError, match="width"):
            PDP(1.0, width=bad)
    for bad in (0, -3, 2.5, "4"):
        with pytest.raises(ValueError, match="d must"):
            DuchiMultiDim(1.0, bad)
        with pytest.raises(ValueError, match="d must"):
            KSampling(1.0, bad)
    with pytest.raises(ValueError, match="base"):
        KSampling(1.0, 4, base="laplace")
    with pytest.raises(ValueError, match="unknown"):
        make_scalar_mechanism("gpm", 1.0)
    with pytest.raises(ValueError, match="alpha"):
        Gaussian(0.5, 1e-5).rdp(1.0)


@pytest.mark.parametrize("mech", [Laplace(1), Duchi(1), Piecewise(1), Hybrid(1), PDP(1), Gaussian(0.5, 1e-6)])
def test_scalar_inputs_and_reports_validated(mech, rng):
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        mech.privatize([0.0, 1.5], rng)
    with pytest.raises(ValueError, match="finite"):
        mech.privatize([np.nan], rng)
    with pytest.raises(ValueError, match="Generator"):
        mech.privatize([0.0], 42)
    with pytest.raises(ValueError, match="grid indices"):
        mech.estimate(np.array([0.0, np.inf]))
    with pytest.raises(ValueError, match="zero reports"):
        mech.estimate(np.array([]))
    reports = mech.privatize(np.zeros((3, 4)), rng)
    assert reports.shape == (3, 4)  # any shape, one value per user
    assert isinstance(mech.variance(0.5), float) and mech.variance(np.zeros(3)).shape == (3,)


@pytest.mark.parametrize("mech", [Duchi(1), Piecewise(1), Hybrid(1), PDP(1)])
def test_bounded_mechanisms_reject_impossible_reports(mech):
    with pytest.raises(ValueError, match="off the grid"):
        mech.debias(np.array([mech.grid]))


@pytest.mark.parametrize("mech", [KSampling(2.0, 3), DuchiMultiDim(2.0, 3)])
def test_vector_inputs_validated(mech, rng):
    assert isinstance(mech, VectorMeanMechanism) and isinstance(mech, NumericMechanism)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        mech.privatize(np.zeros((5, 4)), rng)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        mech.privatize(np.full((5, 3), 2.0), rng)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        mech.estimate(np.zeros((5, 2)))
    with pytest.raises(ValueError, match="grid indices"):
        mech.estimate(np.full((5, 3), mech.bound * 2))
    one = mech.privatize(np.zeros(3), rng)
    assert one.shape == (3,) and mech.estimate(one).shape == (3,)
    assert mech.estimate(mech.privatize(np.zeros((7, 3)), rng)).shape == (3,)


def test_repr_lists_parameters():
    assert repr(PDP(1.0, width=1.5)) == "PDP(epsilon=1.0, width=1.5)"
    assert repr(KSampling(1.0, 4, "duchi")) == "KSampling(epsilon=1.0, d=4, base='duchi')"
    assert "delta=1e-05" in repr(Gaussian(0.5, 1e-5))


# ---- closed forms quoted in SPEC ---------------------------------------------------------------------------


def test_worst_case_variances_at_epsilon_1_match_spec():
    assert Hybrid(1).worst_case_variance() == pytest.approx(4.29, abs=0.005)
    assert Piecewise(1).worst_case_variance() == pytest.approx(5.22, abs=0.005)
    assert Duchi(1).worst_case_variance() == pytest.approx(4.68, abs=0.005)


@pytest.mark.parametrize(
    "eps, width, pdp_var, pm_var",
    [(0.5, 1.76, 21.06, 21.2), (1.0, 1.55, 5.07, 5.22), (2.0, 1.18, 1.09, 1.23), (4.0, 0.64, 0.162, 0.241)],
)
def test_pdp_tuned_width_matches_spec(eps, width, pdp_var, pm_var):
    mech = PDP(eps)
    assert mech.width == pytest.approx(width, abs=0.01)
    assert mech.worst_case_variance() == pytest.approx(pdp_var, rel=0.005)
    assert Piecewise(eps).worst_case_variance() == pytest.approx(pm_var, rel=0.01)
    # it is a minimum: nudging the width either way does not help
    for factor in (0.9, 1.1):
        assert PDP(eps, width=mech.width * factor).worst_case_variance() > mech.worst_case_variance()
    assert optimal_pdp_width(eps) == mech.width


@pytest.mark.parametrize("cls", [Duchi, Piecewise, Hybrid, PDP, Laplace])
@pytest.mark.parametrize("eps", EPSILONS)
def test_worst_case_variance_is_max_over_inputs(cls, eps):
    mech = cls(eps)
    grid_max = float(np.max(mech.variance(np.linspace(-1, 1, 2001))))
    step = 2 / (mech.inputs - 1)  # an upper bound within the rounding's Δ²/4 of the maximum
    assert grid_max <= mech.worst_case_variance() * (1 + 1e-12) <= (grid_max + step**2 / 4) * (1 + 1e-9)


def test_hybrid_switch_point():
    assert HYBRID_EPSILON_STAR == pytest.approx(0.6094, abs=1e-4)
    assert Hybrid(HYBRID_EPSILON_STAR).alpha == 0.0
    assert Hybrid(0.62).alpha == pytest.approx(1 - math.exp(-0.31), abs=2**-32)
    # ε* is where HM with α = 1 - e^{-ε/2} stops being worse than pure Duchi in the worst case
    eps = HYBRID_EPSILON_STAR
    alpha = 1 - math.exp(-eps / 2)
    pm, duchi = Piecewise(eps), Duchi(eps)
    for t in (0.0, 1.0):
        mixed = alpha * pm.variance(t) + (1 - alpha) * duchi.variance(t)
        assert mixed == pytest.approx(duchi.worst_case_variance(), rel=1e-3)  # the grid's cost


def test_laplace_and_gaussian_closed_forms():
    assert Laplace(0.5).variance(0.3) == pytest.approx(2 * (2 / 0.5) ** 2, rel=1e-5)
    g = Gaussian(0.5, 1e-5)
    assert g.sigma == pytest.approx(2 * math.sqrt(2 * math.log(1.25e5)) / 0.5)
    assert g.delta == 1e-5 and g.variance(-1.0) == pytest.approx(g.sigma**2, rel=1e-3)
    assert g.rdp(3.0) == pytest.approx(3.0 * 4 / (2 * g.sigma**2), rel=1e-3)


def test_duchi_constants():
    assert duchi_constant(1) == 1.0
    assert duchi_constant(3) == pytest.approx(4 / 2)  # 2^2 / binom(2, 1)
    assert duchi_constant(4) == pytest.approx(8 / 3)  # even d: 2^3 / binom(3, 2)
    for d in range(2, 30, 2):  # even d with half-weight ties == odd d + 1
        assert duchi_constant(d) == pytest.approx(duchi_constant(d + 1), rel=1e-12)
    assert math.isfinite(duchi_constant(4001))
    assert DuchiMultiDim(1.0, 1).bound == pytest.approx(Duchi(1.0).bound)


@pytest.mark.parametrize("eps, d, k", [(1.0, 10, 1), (2.49, 4, 1), (5.0, 4, 2), (7.6, 10, 3), (50.0, 4, 4)])
def test_ksampling_k_and_budget_split(eps, d, k):
    mech = KSampling(eps, d)
    assert mech.k == k
    assert mech.base_mechanism.epsilon * mech.k == pytest.approx(eps)
    t = np.linspace(-1, 1, 7)
    expected = (d / k) * (mech.base_mechanism.variance(t) + t**2) - t**2
    np.testing.assert_allclose(mech.variance(t), expected)


def test_ksampling_reports_have_k_nonzero_coordinates(rng):
    mech = KSampling(5.0, 4, base="duchi")  # k = 2, Duchi outputs are never 0
    reports = mech.privatize(rng.uniform(-1, 1, (1000, 4)), rng)
    assert np.all(np.count_nonzero(reports, axis=1) == 2)
    values = mech.debias(reports)
    np.testing.assert_allclose(np.abs(values[reports != 0]), 2 * mech.base_mechanism.bound)


# ---- exact privacy: discrete mechanisms --------------------------------------------------------------------


@pytest.mark.parametrize("eps", (*EPSILONS, 0.1, 8.0))
def test_duchi_exact_likelihood_ratio(eps):
    mech = Duchi(eps)
    probs = mech.output_probabilities(T_GRID)  # (n_t, 2)
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert _max_ratio(probs) == pytest.approx(math.exp(eps), rel=1e-6)
    assert _max_ratio(probs) <= math.exp(eps) * (1 + 1e-12)
    np.testing.assert_allclose(probs @ mech.outputs, T_GRID, atol=1e-12)  # exactly unbiased


@pytest.mark.parametrize("d", range(1, 9))
@pytest.mark.parametrize("eps", EPSILONS)
def test_duchi_multidim_exact_likelihood_ratio(d, eps, rng):
    """Worst case over all inputs: P[z|t] is multilinear in t, so its max and min over [-1,1]^d are at vertices."""
    mech = DuchiMultiDim(eps, d)
    vertices = mech.outputs() / mech.bound  # all of {±1}^d
    probs = mech.output_probabilities(vertices)  # (2^d inputs, 2^d outputs)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
    worst = _max_ratio(probs)
    assert worst == pytest.approx(math.exp(eps), rel=1e-9)  # tight: the claimed ε is exact
    assert worst <= math.exp(eps) * (1 + 1e-12)
    interior = mech.output_probabilities(rng.uniform(-1, 1, (64, d)))
    assert _max_ratio(np.vstack([interior, probs])) <= math.exp(eps) * (1 + 1e-12)
    # exact unbiasedness and variance from the enumerated distribution
    t = rng.uniform(-1, 1, d)
    p = mech.output_probabilities(t)
    z = mech.outputs()
    np.testing.assert_allclose(p @ z, t, atol=1e-10)
    np.testing.assert_allclose(p @ z**2 - t**2, mech.variance(t), rtol=1e-10)


def test_duchi_multidim_enumeration_limit():
    with pytest.raises(ValueError, match="enumeration"):
        DuchiMultiDim(1.0, DuchiMultiDim.MAX_ENUMERATION_D + 1).outputs()


# ---- exact privacy of the released grids: tests/protocols/numeric/test_grid.py -------------------------------


# ---- the Gaussian: exact (ε, δ) ----------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.05, 0.3, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_classic_gaussian_meets_its_delta(eps, delta):
    g = Gaussian(eps, delta)
    assert gaussian_exact_delta(eps, g.sigma) <= delta
    assert analytic_gaussian_sigma(eps, delta) <= g.sigma


@pytest.mark.parametrize("eps", (*EPSILONS, 10.0))
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_analytic_gaussian_is_tight(eps, delta):
    g = Gaussian(eps, delta, calibration="analytic")
    assert gaussian_exact_delta(eps, g.sigma) <= delta
    assert gaussian_exact_delta(eps, g.sigma) == pytest.approx(delta, rel=1e-6)
    assert gaussian_exact_delta(eps, g.sigma * 0.999) > delta  # any smaller σ would break the claim


def test_gaussian_exact_delta_matches_direct_integration():
    """The privacy-loss formula against a numerical ∫ max(0, f1 - e^ε f2) dy on the densities."""
    eps, g = 0.5, Gaussian(0.5, 1e-3)
    y = np.linspace(-200, 300, 2_000_001)  # the loss exceeds ε only for y > εσ²/2 ≈ 57
    gap = np.maximum(0.0, g.pdf(1.0, y) - math.exp(eps) * g.pdf(-1.0, y))
    assert np.trapezoid(gap, y) == pytest.approx(gaussian_exact_delta(eps, g.sigma), rel=1e-4)


def test_hybrid_one_draw_stream_for_one_or_many_users():
    """Hybrid privatizes a PM part and a Duchi part; an empty part is skipped. Same seed, same draws: a batch's
    outputs equal the reference (both parts always called) for any mix, including all-PM and all-Duchi batches."""
    from protocols.exact import uniform_below_array

    mech = Hybrid(2.0)
    for n in (1, 2, 7, 500):
        t = np.linspace(-1, 1, n)
        for seed in range(5):
            got = mech.privatize(t, np.random.default_rng(seed))
            rng = np.random.default_rng(seed)
            use_pm = uniform_below_array(rng, 1 << 32, n) < mech._alpha_num
            want = np.empty(n, dtype=np.int64)
            want[use_pm] = mech.piecewise.privatize(t[use_pm], rng)
            want[~use_pm] = mech.duchi.privatize(t[~use_pm], rng) + mech.grid - 2
            assert np.array_equal(got, want)
