import json
import math

import numpy as np
import pytest
from scipy import integrate, special

from protocols.accounting import (
    DEFAULT_ORDERS,
    Accountant,
    BudgetExceededError,
    RDPCurve,
    advanced_composition,
    alpha_rounding_bound,
    basic_composition,
    dbitflip_bound,
    loloha_bound,
    rdp_gaussian,
    rdp_grr,
    rdp_pure,
    rdp_randomized_response,
    rdp_to_dp,
)
from protocols.haar import HaarHRR

ORDERS = np.array([1.1, 1.5, 2.0, 3.0, 5.0, 10.0, 32.0, 256.0])
EPS = [0.1, 0.5, 1.0, 2.0, 4.0]


def renyi(P: np.ndarray, Q: np.ndarray, alpha: float) -> float:
    """D_α(P‖Q) = log(Σ_y P(y)^α Q(y)^{1-α})/(α-1), summed directly over the outputs (in log space)."""
    return float(special.logsumexp(alpha * np.log(P) + (1 - alpha) * np.log(Q)) / (alpha - 1))


def grr_matrix(eps: float, k: int) -> np.ndarray:
    e = math.exp(eps)
    M = np.full((k, k), 1 / (e + k - 1))
    np.fill_diagonal(M, e / (e + k - 1))
    return M


def worst_divergence(M: np.ndarray, alpha: float) -> float:
    rows = range(M.shape[0])
    return max(renyi(M[x], M[y], alpha) for x in rows for y in rows if x != y)


# ---------------------------------------------------------------- RDP curves


@pytest.mark.parametrize("eps", EPS)
def test_rr_curve_matches_numeric_divergence(eps):
    M = grr_matrix(eps, 2)
    curve = rdp_randomized_response(eps)(ORDERS)
    numeric = [worst_divergence(M, a) for a in ORDERS]
    np.testing.assert_allclose(curve, numeric, rtol=1e-9)


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("k", [3, 7, 20])
def test_grr_curve_matches_numeric_divergence(eps, k):
    M = grr_matrix(eps, k)
    curve = rdp_grr(eps, k)(ORDERS)
    numeric = [worst_divergence(M, a) for a in ORDERS]
    np.testing.assert_allclose(curve, numeric, rtol=1e-9)
    assert np.all(curve <= rdp_pure(eps)(ORDERS) + 1e-12)  # binary RR is the worst case for pure ε


@pytest.mark.parametrize("eps", EPS)
def test_pure_curve_is_mironovs_sinh_bound(eps):
    a = ORDERS[ORDERS * eps < 300]  # sinh overflows beyond
    sinh_form = np.log((np.sinh(a * eps) - np.sinh((a - 1) * eps)) / np.sinh(eps)) / (a - 1)
    curve = rdp_pure(eps)(a)
    np.testing.assert_allclose(curve, sinh_form, rtol=1e-9)
    assert np.all(curve <= eps) and np.all(np.diff(curve) >= 0)  # bounded by ε, increasing in α


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_pure_curve_bounds_another_eps_ldp_mechanism(eps):
    """HaarHRR is ε-LDP, so its exact output distributions obey the generic pure-ε curve."""
    mech = HaarHRR(eps, 8)
    P = np.array([mech.report_distribution(v) for v in range(8)])
    bound = rdp_pure(eps)(ORDERS)
    for i, a in enumerate(ORDERS):
        assert worst_divergence(P, a) <= bound[i] * (1 + 1e-9)


def test_large_orders_are_stable():
    curve = rdp_pure(4.0)(np.array([256.0, 1e4]))
    assert np.all(np.isfinite(curve)) and curve[-1] <= 4.0


@pytest.mark.parametrize(("sigma", "alpha"), [(1.0, 2.0), (2.5, 5.0), (0.8, 1.5)])
def test_gaussian_curve_matches_numeric_integral(sigma, alpha):
    def integrand(y):
        log_p = -(y**2) / (2 * sigma**2)  # N(0, σ²) against N(1, σ²): sensitivity 1
        log_q = -((y - 1) ** 2) / (2 * sigma**2)
        return math.exp(alpha * log_p + (1 - alpha) * log_q) / (sigma * math.sqrt(2 * math.pi))

    centre = 1 - alpha  # the integrand is a Gaussian bump centred there
    value, _ = integrate.quad(integrand, centre - 40 * sigma, centre + 40 * sigma, points=[centre], limit=200)
    assert rdp_gaussian(sigma)(np.array([alpha]))[0] == pytest.approx(math.log(value) / (alpha - 1), rel=1e-6)
    assert rdp_gaussian(sigma, 2.0)(np.array([alpha]))[0] == pytest.approx(alpha * 4 / (2 * sigma**2))


def test_curve_state_roundtrip_and_validation():
    for curve in (rdp_randomized_response(1.0), rdp_grr(0.5, 9), rdp_pure(2.0), rdp_gaussian(3.0, 2.0)):
        again = RDPCurve.from_state(json.loads(json.dumps(curve.to_state())))
        assert again == curve
        np.testing.assert_array_equal(again(ORDERS), curve(ORDERS))
    with pytest.raises(ValueError, match="unknown"):
        RDPCurve("laplace", ())
    with pytest.raises(ValueError, match="orders"):
        rdp_pure(1.0)([1.0, 2.0])
    with pytest.raises(ValueError, match="k must be >= 2"):
        rdp_grr(1.0, 1)


# ---------------------------------------------------------------- conversion and composition


def test_conversion_formula_on_a_single_order():
    eps, order = rdp_to_dp([0.5], [3.0], 1e-5)
    assert order == 3.0 and eps == pytest.approx(0.5 + math.log(1e5) / 2)


def test_conversion_gaussian_known_case():
    """ρ(α) = α/(2σ²): the minimum over α of α/(2σ²) + log(1/δ)/(α-1) is 1/(2σ²) + √(2 log(1/δ))/σ."""
    sigma, delta = 5.0, 1e-6
    orders = np.linspace(1.01, 200, 200_000)
    eps, order = rdp_to_dp(rdp_gaussian(sigma)(orders), orders, delta)
    root = math.sqrt(2 * math.log(1 / delta))
    assert eps == pytest.approx(1 / (2 * sigma**2) + root / sigma, rel=1e-6)
    assert order == pytest.approx(1 + sigma * root, rel=1e-3)


def test_advanced_composition_reduces_to_the_spec_formula():
    k, eps, dp = 50, 0.3, 1e-5
    value, delta = advanced_composition([eps] * k, dp)
    assert value == pytest.approx(eps * math.sqrt(2 * k * math.log(1 / dp)) + k * eps * math.expm1(eps))
    assert delta == dp
    assert basic_composition([eps] * k, [1e-7] * k) == pytest.approx((15.0, 5e-6))


def test_acceptance_1000_reports_rdp_beats_advanced_and_basic():
    acc = Accountant()
    for _ in range(1000):
        acc.charge("telemetry", "rr", 0.1)
    report = acc.report(1e-6)
    assert report.basic == (pytest.approx(100.0), 0.0)
    # measured: RDP ≈ 21.52 (α = 2.75), advanced ≈ 27.14, basic = 100
    assert report.rdp[0] < report.advanced[0] < report.basic[0]
    assert report.rdp[0] == pytest.approx(21.52, abs=0.01)
    assert report.advanced[0] == pytest.approx(27.14, abs=0.01)
    assert report.rdp[1] == 1e-6 and report.advanced[1] == 1e-6
    assert report.best_epsilon == report.rdp[0]
    # the generic pure curve is the binary RR curve: declaring it explicitly changes nothing
    explicit = Accountant()
    for _ in range(1000):
        explicit.charge("telemetry", "rr", 0.1, rdp=rdp_randomized_response(0.1))
    assert explicit.report(1e-6).rdp == pytest.approx(report.rdp)


def test_grr_curves_give_a_smaller_rdp_total_than_the_generic_bound():
    generic, specific = Accountant(), Accountant()
    for _ in range(200):
        generic.charge("s", "grr", 0.5)
        specific.charge("s", "grr", 0.5, rdp=rdp_grr(0.5, 32))
    assert specific.rdp(1e-6)[0] < generic.rdp(1e-6)[0]


def test_gaussian_and_non_rdp_charges():
    acc = Accountant()
    acc.charge("g", "gaussian", 1.0, delta=1e-5, rdp=rdp_gaussian(4.0))
    acc.charge("x", "blackbox", 0.5, delta=1e-6)  # (ε, δ) with no curve: composed sequentially
    eps, delta, order = acc.rdp(1e-6)
    gauss_only, _ = rdp_to_dp(rdp_gaussian(4.0)(acc.orders), acc.orders, 1e-6)
    assert eps == pytest.approx(gauss_only + 0.5)
    assert delta == pytest.approx(1e-6 + 1e-6)
    assert acc.basic() == pytest.approx((1.5, 1.1e-5))
    assert acc.advanced(1e-6)[1] == pytest.approx(1.1e-5 + 1e-6)


def test_empty_accountant():
    acc = Accountant()
    assert acc.basic() == (0.0, 0.0)
    assert acc.rdp(1e-6)[0] == 0.0
    assert acc.report(1e-6).n_charges == 0


# ---------------------------------------------------------------- streams, groups, memo


def test_per_stream_and_parallel_composition():
    acc = Accountant()
    for _ in range(3):
        acc.charge("cpu", "hm", 1.0)
    acc.charge("region_a", "grr", 2.0)
    acc.charge("region_b", "grr", 0.5)
    acc.charge("region_b", "grr", 0.5)
    assert acc.basic("cpu") == (3.0, 0.0)
    assert acc.basic() == (6.0, 0.0)
    acc.declare_disjoint("regions", ["region_a", "region_b"])
    assert acc.basic() == (5.0, 0.0)  # 3 + max(2, 1)
    assert acc.basic("region_b") == (1.0, 0.0)
    # RDP: pointwise max of the two regions' curves
    a = acc.orders
    expected = 3 * rdp_pure(1.0)(a) + np.maximum(rdp_pure(2.0)(a), 2 * rdp_pure(0.5)(a))
    np.testing.assert_allclose(acc.rdp_curve(), expected)
    with pytest.raises(ValueError, match="already belong"):
        acc.declare_disjoint("other", ["region_a", "cpu"])
    with pytest.raises(ValueError, match="at least two"):
        acc.declare_disjoint("solo", ["cpu"])


def test_memo_charges_only_new_keys():
    acc = Accountant()
    keys = ["k1", "k2", "k1", "k1", "k3", "k2"]
    charged = [acc.charge_memo("cpu", key, 0.5, mechanism="alpha-rounding+hm") for key in keys]
    assert charged == [True, True, False, False, True, False]
    assert acc.basic("cpu")[0] == pytest.approx(1.5)
    assert acc.memo_count("cpu") == 3
    assert acc.basic("cpu")[0] <= alpha_rounding_bound(acc.memo_count("cpu"), 0.5)
    assert acc.charge_memo("mem", "k1", 0.5)  # memo tables are per stream
    assert acc.has_memo("cpu", "k2") and not acc.has_memo("mem", "k2")
    assert all(c.kind == "memo" and c.memo_key for c in acc.charges)


def test_caps_refuse_and_record_nothing():
    acc = Accountant(total_cap=3.0)
    acc.set_cap("cpu", 1.0)
    acc.charge("cpu", "hm", 0.6)
    with pytest.raises(BudgetExceededError, match="cap 1"):
        acc.charge("cpu", "hm", 0.6)
    acc.charge("mem", "hm", 2.0)
    with pytest.raises(BudgetExceededError, match="total cap 3"):
        acc.charge("disk", "hm", 0.5)
    with pytest.raises(BudgetExceededError):
        acc.charge_memo("disk", "new-key", 0.5)
    assert not acc.has_memo("disk", "new-key")
    assert len(acc.charges) == 2 and acc.basic() == pytest.approx((2.6, 0.0))


def test_state_roundtrip_through_json():
    acc = Accountant(total_cap=50.0)
    acc.set_cap("cpu", 10.0)
    acc.declare_disjoint("regions", ["a", "b"])
    acc.charge("cpu", "rr", 0.5, rdp=rdp_randomized_response(0.5))
    acc.charge("a", "grr", 1.0, rdp=rdp_grr(1.0, 5))
    acc.charge("b", "gauss", 0.7, delta=1e-6, rdp=rdp_gaussian(3.0))
    acc.charge_memo("cpu", "hmac:abc", 0.25)
    again = Accountant.from_state(json.loads(json.dumps(acc.to_state())))
    assert again.charges == acc.charges
    assert again.report(1e-6) == acc.report(1e-6)
    assert not again.charge_memo("cpu", "hmac:abc", 0.25)
    with pytest.raises(BudgetExceededError):
        again.charge("cpu", "rr", 9.9)
    with pytest.raises(ValueError, match="version"):
        Accountant.from_state({"version": 99})


def test_charge_validation():
    acc = Accountant()
    with pytest.raises(ValueError, match="epsilon"):
        acc.charge("s", "m", 0.0)
    with pytest.raises(ValueError, match="delta"):
        acc.charge("s", "m", 1.0, delta=1.0)
    with pytest.raises(ValueError, match="stream"):
        acc.charge("", "m", 1.0)
    with pytest.raises(ValueError, match="RDPCurve"):
        acc.charge("s", "m", 1.0, rdp="rr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        acc.charge("s", "m", 1.0, kind="other")
    with pytest.raises(ValueError, match="memo key"):
        acc.charge_memo("s", "", 1.0)
    assert acc.charges == []
    with pytest.raises(ValueError, match="orders"):
        Accountant(orders=[0.5, 2.0])
    assert tuple(Accountant().orders) == DEFAULT_ORDERS


# ---------------------------------------------------------------- longitudinal bounds


def test_longitudinal_bounds():
    assert loloha_bound(2, 1.5) == 3.0
    assert alpha_rounding_bound(7, 0.5) == 3.5
    assert alpha_rounding_bound(0, 0.5) == 0.0
    assert dbitflip_bound(3, 16, 1.0) == 4.0  # min(d+1, b)
    assert dbitflip_bound(20, 16, 1.0) == 16.0
    with pytest.raises(ValueError, match="g must be >= 2"):
        loloha_bound(1, 1.0)


def test_one_formula_per_bound():
    """The protocols' longitudinal bounds are the accounting module's formulas (one home: memo_slots_bound)."""
    from protocols.accounting import memo_slots_bound
    from protocols.longitudinal import LOLOHA, DBitFlipPM, OneBitMeanMemo

    for g, k in [(2, 360), (10, 3), (5, 5)]:
        proto = LOLOHA(2.0, 1.0, k, g=g)
        for n in (None, 0, 1, 4, 1000):
            assert proto.longitudinal_bound(n) == loloha_bound(g, 2.0, k, n)
    assert loloha_bound(10, 2.0, k=3) == memo_slots_bound(2.0, 3) == 6.0  # never more than k entries
    # the min(g, k) bound holds and is attained: devices cycling through all k = 3 values over 12 rounds fill
    # (with g = 10, almost always) 3 distinct memo slots and are charged ε∞ for each, never more
    rng = np.random.default_rng(5)
    proto = LOLOHA(2.0, 1.0, 3, g=10)
    values = np.tile(np.arange(12) % 3, (500, 1))
    spent = proto.simulate_rounds(values, rng).spent
    assert spent.max() == pytest.approx(proto.longitudinal_bound()) and np.all(spent <= 6.0 + 1e-12)
    for d, b in [(3, 10), (4, 4), (1, 2)]:
        proto = DBitFlipPM(1.0, k=100, b=b, d=d)
        for n in (None, 0, 2, 50):
            assert proto.longitudinal_bound(n) == dbitflip_bound(d, b, 1.0, n)
    assert OneBitMeanMemo(0.5, s=7).longitudinal_bound() == alpha_rounding_bound(8, 0.5)


def test_one_cap_rule_for_both_ledgers(tmp_path):
    """The device ledger (edge_agent.state) and the Accountant refuse exactly the same charges (check_cap)."""
    from edge_agent.state import Refused, _Spent
    from protocols.accounting import CAP_TOLERANCE, check_cap

    cap = 0.3
    for spent, charge in [(0.1 + 0.1, 0.1), (0.2, 0.1 + 1e-9), (0.0, cap), (0.0, cap * (1 + 2 * CAP_TOLERANCE))]:
        acc = Accountant()
        acc.set_cap("s", cap)
        if spent:
            acc.charge("s", "m", spent)
        try:
            acc.charge("s", "m", charge)
            accountant_ok = True
        except BudgetExceededError as exc:
            accountant_ok = False
            assert exc.reason == "stream_cap"
        ledger = _Spent({"s": spent}, {}, spent, 0.0, 0.0)
        try:
            ledger.check("s", "r", charge, cap, 10.0, None, 0.0, None)
            ledger_ok = True
        except Refused as exc:
            ledger_ok = False
            assert exc.reason == "stream_cap"
        assert accountant_ok == ledger_ok
        try:
            check_cap("stream_cap", spent, charge, cap)
            assert accountant_ok
        except BudgetExceededError:
            assert not accountant_ok
