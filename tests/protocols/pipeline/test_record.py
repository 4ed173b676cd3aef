"""HaarRecord (protocols/pipeline/record.py): coefficient bounds, parameters, exact privacy, estimation, and the exact
variance model (protocols/pipeline/_variance.py) it shares with the auto choice."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from protocols import catalogue, wire
from protocols.haar import haar_forward, haar_inverse, padded_size
from protocols.numeric import DuchiMultiDim, KSampling
from protocols.pipeline import (
    HaarRecord,
    coefficient_bounds,
    objective_weights,
    optimal_split,
    range_weight_vector,
)
from protocols.pipeline._variance import QuadraticModel
from protocols.pipeline.auto import _query_weights, numeric_model
from protocols.pipeline.record import _bound_objective, _make_detail, _make_mean, _split_epsilons


def _cube_vertices(d: int) -> np.ndarray:
    return np.array(list(itertools.product((-1.0, 1.0), repeat=d)))


def _exact_box_max(M: np.ndarray) -> float:
    """max xᵀMx over [-1,1]^d, exactly: every face (coordinates at -1, +1 or free) and its stationary point."""
    best = -np.inf
    for pattern in itertools.product((-1.0, 0.0, 1.0), repeat=M.shape[0]):
        x = np.array(pattern)
        free = x == 0
        if free.any():
            A = M[np.ix_(free, free)]
            if abs(np.linalg.det(A)) < 1e-12:
                continue  # a singular face attains its max on its boundary (a smaller face)
            y = np.linalg.solve(A, -M[np.ix_(free, ~free)] @ x[~free])
            if np.any(np.abs(y) > 1 + 1e-12):
                continue
            x[free] = y
        best = max(best, float(x @ M @ x))
    return best


# ----------------------------------------------------------------------------------------------- coefficients


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8, 9])
def test_coefficients_lie_in_unit_interval_and_bounds_are_attained(d, rng):
    x = np.concatenate([_cube_vertices(d), rng.uniform(-1, 1, (500, d))])
    m, c = haar_forward(x)
    assert np.all(np.abs(m) <= 1.0) and np.all(np.abs(c) <= 1.0)
    m_max, c_max = coefficient_bounds(d)
    D = padded_size(d)
    assert m_max == pytest.approx(d / D)
    assert np.max(np.abs(m)) == pytest.approx(m_max)  # attained at the all-ones vertex
    np.testing.assert_allclose(np.max(np.abs(c[: 2**d]), axis=0), c_max)  # attained at vertices
    assert np.all(c_max <= 1.0)


def test_padding_nodes_have_zero_detail_bound():
    _, c_max = coefficient_bounds(5)  # D = 8: the node over leaves 6, 7 holds only padding
    assert c_max[-1] == 0.0 and c_max[0] == pytest.approx((4 + 1) / 8)


def test_range_weight_vector_reconstructs_range_sums(rng):
    d = 11
    x = rng.uniform(-1, 1, (20, d))
    m, c = haar_forward(x)
    coef = np.concatenate([m[:, None], c], axis=1)
    for a, b in [(0, 10), (3, 3), (2, 9), (8, 10)]:
        np.testing.assert_allclose(coef @ range_weight_vector(d, a, b), x[:, a : b + 1].sum(axis=1), atol=1e-12)


# ----------------------------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": 0, "d": 4}, "epsilon"),
        ({"epsilon": 1.0, "d": 0}, "d must be"),
        ({"epsilon": 1.0, "d": 2.5}, "d must be an integer"),
        ({"epsilon": 1.0, "d": 4, "mean_mechanism": "gpm"}, "mean_mechanism"),
        ({"epsilon": 1.0, "d": 4, "detail_mechanism": "hybrid"}, "detail_mechanism"),
        ({"epsilon": 1.0, "d": 4, "split": 0.0}, "split"),
        ({"epsilon": 1.0, "d": 4, "split": 1.0}, "split"),
        ({"epsilon": 1.0, "d": 4, "split": float("nan")}, "split"),
        ({"epsilon": 1.0, "d": 4, "split": "half"}, "split"),
        ({"epsilon": 1.0, "d": 4, "split_objective": "median"}, "split_objective"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HaarRecord(**kwargs)


def test_input_and_report_validation(rng):
    mech = HaarRecord(1.0, 3, "hybrid", split=0.3)
    with pytest.raises(ValueError, match="records must have shape"):
        mech.privatize(np.zeros((5, 4)), rng)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        mech.privatize(np.full((5, 3), 1.5), rng)
    with pytest.raises(ValueError, match="finite"):
        mech.privatize(np.array([[0.0, np.nan, 0.0]]), rng)
    with pytest.raises(ValueError, match="rng"):
        mech.privatize(np.zeros((2, 3)), 42)
    with pytest.raises(ValueError, match=r"shape \(n, 4\)"):
        mech.estimate(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="zero reports"):
        mech.estimate(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="grid indices"):
        mech.estimate(np.full((2, 4), 1e6))  # impossible outputs are rejected, not averaged
    with pytest.raises(ValueError, match="off the grid"):
        mech.estimate(np.full((2, 4), 10**6))
    with pytest.raises(ValueError, match="range"):
        mech.range_variance(2, 1)


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 7.3])
@pytest.mark.parametrize("fraction", [0.01, 0.2, 1 / 3, 0.77])
def test_split_sums_to_at_most_epsilon_exactly(eps, fraction):
    eps_m, eps_c = _split_epsilons(eps, fraction)
    assert Fraction(eps_m) + Fraction(eps_c) <= Fraction(eps)
    assert eps_m + eps_c == pytest.approx(eps, rel=1e-15)
    mech = HaarRecord(eps, 4, "pdp", split=fraction)
    assert mech.epsilon == eps and mech.mean.epsilon == eps_m and mech.detail.epsilon == eps_c
    assert mech.split == fraction


@pytest.mark.parametrize(("eps", "d", "detail"), [(1.0, 8, "ksampling"), (4.0, 5, "duchi_md"), (0.5, 15, "ksampling")])
def test_auto_split_minimises_the_documented_objective(eps, d, detail):
    mech = HaarRecord(eps, d, "pdp", detail)
    f, value = optimal_split(eps, d, "pdp", detail, "coordinate")
    assert mech.split == f and 0.02 <= f <= 0.98
    weights_sq = (objective_weights(d, "coordinate") ** 2).mean(axis=0)
    P = padded_size(d) - 1
    for g in np.linspace(0.03, 0.97, 41):
        em, ec = _split_epsilons(eps, float(g))
        assert value <= _bound_objective(_make_mean("pdp", em), _make_detail(detail, ec, P), d, weights_sq) + 1e-9
    # the objective is the coordinate-average of the separable bound
    assert value == pytest.approx(float(mech.independent_variance_bound().mean()), rel=1e-9)


def test_auto_mean_mechanism_picks_lowest_objective():
    mech = HaarRecord(2.0, 8)
    values = {m: optimal_split(2.0, 8, m, "ksampling", "coordinate")[1] for m in ("pdp", "piecewise", "hybrid")}
    assert mech.mean_mechanism == min(values, key=values.get)


def test_split_objective_changes_the_split():
    coord = HaarRecord(2.0, 8, "pdp", split_objective="coordinate")
    total = HaarRecord(2.0, 8, "pdp", split_objective="total")
    assert total.split > 0.9 > coord.split  # the sum of all coordinates needs only m (d = D)


# ----------------------------------------------------------------------------------------------- exact privacy


def _discrete(eps: float, d: int, split: float = 0.4) -> HaarRecord:
    return HaarRecord(eps, d, "duchi", "duchi_md", split=split)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("d", [2, 3, 4, 7])
def test_exact_ratio_on_the_coefficient_box_is_the_composed_epsilon(eps, d):
    """Enumerate all outputs (y, z): the worst ratio over coefficient vertices is exactly e^{ε_m}·e^{ε_c}.

    P[(y, z) | m, c] is multilinear in (m, c), so over the box [-1,1]^D its max and min sit at vertices.
    """
    mech = _discrete(eps, d)
    D = mech.D
    c_vertices = _cube_vertices(D - 1)
    p_c = mech.detail.output_probabilities(c_vertices)  # (2^{D-1} inputs, 2^{D-1} outputs)
    p_m = mech.mean.output_probabilities(np.array([-1.0, 1.0]))  # (2 inputs, 2 outputs)
    joint = (p_m[:, None, :, None] * p_c[None, :, None, :]).reshape(2 * len(c_vertices), -1)
    ratio = float(np.max(joint.max(axis=0) / joint.min(axis=0)))
    assert ratio == pytest.approx(math.exp(mech.epsilon_mean) * math.exp(mech.epsilon_detail), rel=1e-8)  # H/L
    assert math.log(ratio) <= mech.epsilon * (1 + 1e-12)


@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
@pytest.mark.parametrize("d", [2, 4, 5])
def test_exact_ratio_over_records_is_at_most_epsilon(eps, d, rng):
    """Over records the Haar image is a strict subset of the box (m = ±1 forces c = 0): ratio ≤ e^ε, strictly."""
    mech = _discrete(eps, d)
    x = np.concatenate([_cube_vertices(d), rng.uniform(-1, 1, (3000, d)), np.zeros((1, d))])
    probs = mech.report_distribution(x).reshape(x.shape[0], -1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    assert probs.min() > 0
    ratio = float(np.max(probs.max(axis=0) / probs.min(axis=0)))
    assert ratio <= math.exp(mech.epsilon) * (1 + 1e-12)
    assert ratio < math.exp(mech.epsilon) * (1 - 1e-6)  # the composition bound is not attained on records


def test_report_distribution_matches_sampling_frequencies(rng):
    mech = _discrete(1.0, 3)
    x = np.array([0.7, -0.2, 0.4])
    n = 200_000
    reports = mech.privatize(np.broadcast_to(x, (n, 3)), rng)
    ys, zs = mech.outputs()
    y_idx = reports[:, 0]
    z_idx = ((1 - reports[:, 1:]) * (1 << np.arange(mech.D - 1))).sum(axis=1)  # bit 1 is +B: row order of outputs()
    np.testing.assert_array_equal(zs[z_idx], reports[:, 1:])
    np.testing.assert_array_equal(ys[y_idx], reports[:, 0])
    counts = np.bincount(y_idx * zs.shape[0] + z_idx, minlength=2 * zs.shape[0]) / n
    p = mech.report_distribution(x).reshape(-1)
    assert np.all(np.abs(counts - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-9)


def test_exact_distribution_only_for_the_discrete_variant():
    with pytest.raises(ValueError, match="exact output distributions"):
        HaarRecord(1.0, 3, "pdp", "duchi_md", split=0.5).report_distribution(np.zeros(3))


@pytest.mark.parametrize("d", [2, 3, 4])
def test_exact_variance_model_against_enumeration(d, rng):
    """Discrete variant: Var(t̂_i | x) and range variances by summing over all outputs equal the model's."""
    mech = _discrete(1.5, d, split=0.35)
    ys, zs = mech.outputs()
    outs = np.array([[y, *z] for y in ys for z in zs])
    recon = mech.contributions(outs)  # (outputs, d)
    for x in [rng.uniform(-1, 1, d) for _ in range(5)] + [np.ones(d), np.zeros(d)]:
        p = mech.report_distribution(x).reshape(-1)
        assert p @ recon == pytest.approx(x, abs=1e-10)  # unbiased, exactly
        var = p @ (recon - x) ** 2
        np.testing.assert_allclose(mech.variance(x), var, rtol=1e-10)
        sums = recon[:, : d - 1].sum(axis=1)
        var_r = p @ (sums - x[: d - 1].sum()) ** 2
        assert mech.range_variance(0, d - 2, x) == pytest.approx(var_r, rel=1e-10)


# ----------------------------------------------------------------------------------------------- estimation


def test_estimate_is_inverse_haar_of_debiased_means(rng):
    mech = HaarRecord(2.0, 6, "pdp", "ksampling", split=0.3)
    x = rng.uniform(-1, 1, (1000, 6))
    reports = mech.privatize(x, rng)
    assert reports.shape == (1000, 8)
    co = mech.debias(reports)
    np.testing.assert_allclose(co[:, 0], mech.mean.debias(reports[:, 0]))
    np.testing.assert_allclose(co[:, 1:], mech.detail.debias(reports[:, 1:]))
    est = mech.estimate(reports)
    np.testing.assert_allclose(est, haar_inverse(co[:, 0].mean(), co[:, 1:].mean(axis=0), 6))
    np.testing.assert_allclose(mech.contributions(reports).mean(axis=0), est)
    m_hat, c_hat = mech.coefficients(reports)
    assert mech.range_query(est, 1, 4) == pytest.approx(np.array([m_hat, *c_hat]) @ range_weight_vector(6, 1, 4))
    # k-sampling over D-1 = 7 details with k = 1: exactly one non-zero detail per report
    assert np.all(np.count_nonzero(reports[:, 1:], axis=1) <= 1)
    one = mech.privatize(x[0], rng)
    assert one.shape == (8,)


def test_wire_and_component_specs_rebuild_the_same_estimator(rng):
    mech = HaarRecord(1.0, 5, "pdp", "ksampling", split=0.25)
    x = rng.uniform(-1, 1, (400, 5))
    reports = mech.privatize(x, rng)
    codec = catalogue.entry("haar")
    bodies = [{"report": codec.encode_row(mech, r)} for r in reports]
    assert set(bodies[0]) == {"report"} and set(bodies[0]["report"]) == {"mean", "detail"}
    rows = [wire_roundtrip(b)["report"] for b in bodies]
    np.testing.assert_array_equal(codec.decode_rows(mech, rows), reports)
    # the component form (protocols.contract.haar_params_from_components): mean and detail mechanisms by name and ε
    mean_mech = catalogue.build(mech.mean_mechanism, epsilon=mech.epsilon_mean)
    detail_mech = catalogue.build(mech.detail_mechanism, epsilon=mech.epsilon_detail, d=mech.D - 1)
    m_hat, c_hat = mech.coefficients(reports)
    assert mean_mech.estimate(reports[:, 0]) == pytest.approx(m_hat, rel=1e-12)
    np.testing.assert_allclose(detail_mech.estimate(reports[:, 1:]), c_hat, rtol=1e-12)
    with pytest.raises(ValueError, match="wire row"):
        codec.decode_rows(mech, [{"mean": 0.1}])
    with pytest.raises(ValueError, match="8 values"):
        codec.encode_row(mech, np.zeros(5))


def wire_roundtrip(body):
    import json

    return json.loads(wire.canonical_json(body))


# ----------------------------------------------------------------------------------------------- variance model


@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("config", [("pdp", "ksampling", 0.3), ("hybrid", "duchi_md", 0.05), ("piecewise", "ksampling", 0.6)])
@pytest.mark.parametrize("eps", [0.4, 3.0, 9.0])
def test_worst_case_is_the_exact_maximum_over_records(d, config, eps):
    mean, detail, split = config
    mech = HaarRecord(eps, d, mean, detail, split=split)
    for query in ("mean", "range"):
        w = _query_weights(mech, query)
        const, M = mech.model.form(w)
        exact = np.array([const[i] + _exact_box_max(M[i]) for i in range(len(w))])
        np.testing.assert_allclose(mech.model.worst(w), exact, rtol=1e-10)
    assert np.all(mech.worst_case_variances() <= mech.independent_variance_bound() * (1 + 1e-12))


@pytest.mark.parametrize("cls", [KSampling, DuchiMultiDim])
@pytest.mark.parametrize("d", [1, 3, 4])
def test_direct_mechanism_models(cls, d, rng):
    mech = cls(6.0 if cls is KSampling else 1.0, d)
    model = numeric_model(mech)
    x = rng.uniform(-1, 1, (50, d))
    # single coordinates; the model is quadratic, the grid law adds the input rounding's f(1−f)Δ² (≤ 10^-8 here)
    np.testing.assert_allclose(model.variance(x, np.eye(d)), mech.variance(x), rtol=1e-7)
    w = _query_weights(mech, "mean")
    const, M = model.form(w)
    exact = [const[i] + _exact_box_max(M[i]) for i in range(d)]
    np.testing.assert_allclose(model.worst(w), exact, rtol=1e-10)
    assert model.worst(w).max() == pytest.approx(mech.worst_case_variance(), rel=1e-7)


def test_variance_shapes_and_worst_case(rng):
    mech = HaarRecord(1.0, 5, "pdp", split=0.2)
    x = rng.uniform(-1, 1, (7, 5))
    assert mech.variance(x).shape == (7, 5)
    assert mech.variance(x[0]).shape == (5,)
    worst = mech.variance()
    assert worst.shape == (5,) and np.all(mech.variance(x) <= worst[None, :] * (1 + 1e-12))
    assert mech.worst_case_variance() == pytest.approx(worst.max())
    assert mech.range_variance(0, 4, x).shape == (7,)
    assert np.all(mech.range_variance(0, 4, x) <= mech.range_variance(0, 4) * (1 + 1e-12))


def test_quadratic_model_rejects_bad_weights():
    model = QuadraticModel(np.eye(2), np.ones(2), np.ones(2), np.ones(2, dtype=bool), 1.0)
    with pytest.raises(ValueError, match="2 entries"):
        model.worst(np.ones(3))

