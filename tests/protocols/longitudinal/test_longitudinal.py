"""Parameter validation, shapes, bounds and fast paths of the longitudinal protocols."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from protocols.hashing import P, hash_matrix, hash_values, support_counts
from protocols.frequency import clip_normalise
from protocols.longitudinal import (
    DDRM,
    LGRR,
    LOLOHA,
    LOSUE,
    LSUE,
    RAPPOR,
    DBitFlipPM,
    OneBitMeanMemo,
    TranscriptMechanism,
    alpha_round_index,
    optimal_g,
    protocol_from_params,
    slot_pattern,
)
from protocols.longitudinal.rappor import RapporReports


@pytest.mark.parametrize(
    "factory,match",
    [
        (lambda: LGRR(1.0, 1.0, 4), "epsilon_1 must be < epsilon_inf"),
        (lambda: LGRR(1.0, 2.0, 4), "epsilon_1 must be < epsilon_inf"),
        (lambda: LGRR(0.0, 0.5, 4), "epsilon_inf"),
        (lambda: LGRR(2.0, 1.0, 1), "k must be >= 2"),
        (lambda: LOSUE(2.0, float("nan"), 4), "epsilon_1"),
        (lambda: LSUE(2.0, 1.0, 2.5), "integer"),
        (lambda: LOLOHA(2.0, 1.0, 10, g=1), "g must be >= 2"),
        (lambda: LOLOHA(2.0, 1.0, 10, g="best"), "optimal"),
        (lambda: RAPPOR(f=0.0), "f must lie in"),
        (lambda: RAPPOR(p=0.8, q=0.5), "p < q"),
        (lambda: RAPPOR(num_bits=4, num_hashes=5), "num_hashes"),
        (lambda: RAPPOR(q=1.5), r"\[0, 1\]"),
        (lambda: DBitFlipPM(1.0, k=10, b=11, d=2), "b must be"),
        (lambda: DBitFlipPM(1.0, k=10, b=5, d=6), "d must be"),
        (lambda: OneBitMeanMemo(1.0, m=0.0), "m must be"),
        (lambda: OneBitMeanMemo(1.0, gamma=0.5), "gamma"),
        (lambda: OneBitMeanMemo(1.0, s=0), "s must be"),
        (lambda: DDRM(1.0, horizon=0, max_nonzero=1), "horizon"),
        (lambda: DDRM(-1.0, horizon=4, max_nonzero=1), "epsilon"),
    ],
)
def test_parameter_validation(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


ALL = [
    LGRR(2.0, 1.0, 6),
    LOSUE(2.0, 1.0, 6),
    LSUE(2.0, 1.0, 6),
    LOLOHA(2.0, 1.0, 6, g=3),
    RAPPOR(num_bits=16, num_hashes=2, num_cohorts=4, domain_size=6),
    DBitFlipPM(1.0, k=6, b=3, d=2),
    OneBitMeanMemo(1.0, m=5.0, s=5),
    DDRM(1.0, horizon=8, max_nonzero=8),
]


@pytest.mark.parametrize("protocol", ALL, ids=lambda p: p.name)
def test_params_roundtrip_and_guarantees(protocol):
    rebuilt = protocol_from_params(protocol.name, protocol.params())
    assert rebuilt.params() == protocol.params() and rebuilt.fingerprint() == protocol.fingerprint()
    assert 0 < protocol.epsilon_1 <= protocol.epsilon_inf
    assert protocol.epsilon == protocol.epsilon_1
    assert protocol.longitudinal_bound() >= protocol.epsilon_inf
    assert protocol.longitudinal_bound(0) == 0.0
    assert repr(protocol).startswith(type(protocol).__name__)


def test_longitudinal_bounds_match_spec():
    assert LGRR(2.0, 1.0, 6).longitudinal_bound() == pytest.approx(12.0)
    assert LGRR(2.0, 1.0, 6).longitudinal_bound(n_distinct=2) == pytest.approx(4.0)
    assert LOLOHA(2.0, 1.0, 360, g=2).longitudinal_bound() == pytest.approx(4.0)  # g·ε∞ whatever the changes
    assert LOLOHA(2.0, 1.0, 3, g=10).longitudinal_bound() == pytest.approx(6.0)  # never more than k entries
    assert DBitFlipPM(1.0, k=100, b=10, d=3).longitudinal_bound() == pytest.approx(4.0)  # min(d+1, b)·ε
    assert DBitFlipPM(1.0, k=100, b=4, d=4).longitudinal_bound() == pytest.approx(4.0)
    assert OneBitMeanMemo(0.5, s=7).longitudinal_bound() == pytest.approx(4.0)  # (s+1) grid points
    assert DDRM(0.5, horizon=16, max_nonzero=6).longitudinal_bound() == pytest.approx(3.0)
    assert math.isinf(RAPPOR().longitudinal_bound())
    assert RAPPOR(num_hashes=2, f=0.5).epsilon_inf == pytest.approx(4 * math.log(3))


def test_rappor_epsilon_one_matches_paper_formula():
    protocol = RAPPOR(num_hashes=2, f=0.5, p=0.5, q=0.75)
    q_star = 0.25 * (0.5 + 0.75) + 0.5 * 0.75
    p_star = 0.25 * (0.5 + 0.75) + 0.5 * 0.5
    assert protocol.epsilon_1 == pytest.approx(2 * math.log(q_star * (1 - p_star) / (p_star * (1 - q_star))))


def test_rappor_from_budgets_hits_both_epsilons():
    for eps_inf, eps_1, h in ((2.0, 1.0, 1), (4.0, 0.5, 2), (1.0, 0.9, 4)):
        protocol = RAPPOR.from_budgets(eps_inf, eps_1, num_hashes=h, domain_size=10)
        assert protocol.epsilon_inf == pytest.approx(eps_inf, rel=1e-12)
        assert protocol.epsilon_1 == pytest.approx(eps_1, rel=1e-9)
        assert protocol.p == pytest.approx(1 - protocol.q)
    with pytest.raises(ValueError, match="epsilon_1"):
        RAPPOR.from_budgets(1.0, 1.5)


def test_transcript_bound_semantics():
    protocol = LGRR(2.0, 1.0, 5)
    assert slot_pattern([7, 7, 3, 7]) == (0, 0, 1, 0)
    assert protocol.transcript_epsilon_bound([1, 1, 1], [1, 1, 1]) == 0.0
    assert protocol.transcript_epsilon_bound([1], [2]) == pytest.approx(1.0)
    assert protocol.transcript_epsilon_bound([1, 1, 1], [2, 2, 2]) == pytest.approx(2.0)
    assert protocol.transcript_epsilon_bound([1, 1, 2], [3, 3, 2]) == pytest.approx(2.0)  # one slot differs
    assert protocol.transcript_epsilon_bound([1, 1], [1, 2]) == pytest.approx(protocol.epsilon_irr)
    with pytest.raises(ValueError):
        protocol.transcript_epsilon_bound([1, 2], [1])
    dbit = DBitFlipPM(1.0, k=10, b=10, d=3)
    assert math.isinf(dbit.transcript_epsilon_bound([0, 0], [0, 1], sampled=[0, 1, 2]))  # no IRR: change visible
    assert dbit.transcript_epsilon_bound([0, 0], [1, 1], sampled=[0, 1, 2]) == pytest.approx(1.0)
    assert dbit.memo_slots([0, 5, 9, 2], sampled=[2, 0, 7]) == [1, 3, 3, 0]
    with pytest.raises(ValueError, match="seed"):
        LOLOHA(2.0, 1.0, 6).memo_slots([1, 2])
    with pytest.raises(ValueError, match="sampled"):
        dbit.memo_slots([1])


def test_support_counts_equals_hash_matrix():
    rng = np.random.default_rng(3)
    for g in (2, 3, 5, 7, 64, 1000, 32767, (1 << 20) + 7, (1 << 30) + 3):  # float64 path, then uint64 path
        seeds = rng.integers(0, 1 << 62, size=777)
        y = rng.integers(0, g, size=777)
        h = hash_matrix(seeds, 301, g)
        y[:300] = h[np.arange(300), np.arange(300)]  # make sure every item has supporting reports
        expected = (h == y[:, None]).sum(axis=0)
        np.testing.assert_array_equal(support_counts(seeds, y, 301, g, rows=100, strategy="blocks"), expected)
        if g < (1 << 32):
            np.testing.assert_array_equal(support_counts(seeds, y, 301, g, strategy="walk", chunk=100), expected)
    # the float path's tightest cases: (a·v + b) mod P equal to 0 and to P - 1, at the largest float-path v
    k_big = 1 << 20
    a = rng.integers(1, P, size=8)
    v = np.concatenate([np.full(4, k_big - 1), rng.integers(0, k_big, size=4)])
    cols = np.unique(np.concatenate([v, rng.integers(0, k_big, size=300)]))
    for residue in (0, P - 1):
        b = (residue - a * v) % P  # a·v < 2^51: exact in int64
        seeds = ((a - 1) << 31) | b
        for g in (7, 1000):
            y = hash_values(seeds, v, g)
            assert np.all(y == residue % g)
            counts = support_counts(seeds, y, k_big, g)
            expected = (hash_values(seeds[:, None], cols[None, :], g) == y[:, None]).sum(axis=0)
            np.testing.assert_array_equal(counts[cols], expected)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        support_counts([1, 2], [0, 4], 10, 4)


def test_magic_division_is_exact_near_the_prime():
    """x mod g by multiply-shift equals % for the largest residues (x up to P-1) and all small g."""
    x = np.concatenate([np.arange(0, 5000), np.arange(P - 5000, P)]).astype(np.uint64)
    for g in list(range(2, 300)) + [1021, 4096, 65521, (1 << 20) + 7]:
        ell = (g - 1).bit_length()
        magic = np.uint64(-(-(1 << (31 + ell)) // g))
        q = (x * magic) >> np.uint64(31 + ell)
        np.testing.assert_array_equal(x - q * np.uint64(g), x % np.uint64(g))


def test_optimal_g_is_the_papers_variance_minimiser():
    """OLOLOHA's closed form minimises the approximate variance q'(1-q')/((p1-q')(p2-q2))² over real g when the
    IRR uses the paper's g-independent ε_IRR (EDBT'23, §5)."""
    for eps_inf, alpha in ((1.0, 0.5), (2.0, 0.3), (4.0, 0.5), (6.0, 0.9)):
        eps_1 = alpha * eps_inf
        b = (math.exp(eps_inf + eps_1) - 1) / (math.exp(eps_inf) - math.exp(eps_1))

        def var(g: float) -> float:
            p1 = math.exp(eps_inf) / (math.exp(eps_inf) + g - 1)
            p2, q2 = b / (b + g - 1), 1 / (b + g - 1)
            return (1 / g) * (1 - 1 / g) / ((p1 - 1 / g) ** 2 * (p2 - q2) ** 2)

        best = minimize_scalar(var, bounds=(1.01, 1e4), method="bounded", options={"xatol": 1e-9}).x
        assert optimal_g(eps_inf, eps_1) == max(2, round(best))
    assert LOLOHA.optimal(4.0, 2.0, 100).g == 7 and LOLOHA.bi(4.0, 2.0, 100).g == 2


@pytest.mark.parametrize("protocol", ALL[:-1], ids=lambda p: p.name)
def test_fleet_rounds_shapes_charges_and_input_checks(protocol):
    rng = np.random.default_rng(0)
    n = 50
    if isinstance(protocol, OneBitMeanMemo):
        values = rng.random((n, 4)) * protocol.m
        bad = np.full(n, protocol.m + 1)
    else:
        values = rng.integers(0, protocol.k if hasattr(protocol, "k") else protocol.domain_size, (n, 4))
        bad = np.full(n, 10_000)
    values[:, 1] = values[:, 0]
    result = protocol.simulate_rounds(values, rng)
    assert result.charges.shape == (n, 4)
    assert np.all(result.charges[:, 0] == protocol.epsilon_inf)
    assert np.all(result.charges[:, 1] == 0.0)  # same value ⇒ memoized
    assert np.all(result.spent <= protocol.longitudinal_bound() + 1e-12)
    fleet = protocol.new_fleet(n, rng)
    with pytest.raises(ValueError):
        protocol.privatize_round(bad, fleet, rng)
    with pytest.raises(ValueError):
        protocol.privatize_round(values[:10, 0], fleet, rng)
    with pytest.raises(ValueError):
        protocol.simulate_rounds(values[:, 0], rng)
    with pytest.raises(ValueError):
        protocol.new_fleet(n, rng, nonsense=1)


def test_rappor_decoder_checks_and_candidates():
    protocol = RAPPOR(num_bits=32, num_hashes=2, num_cohorts=4, domain_size=5)
    rng = np.random.default_rng(1)
    fleet = protocol.new_fleet(200, rng)
    reports, _ = protocol.privatize_round(rng.integers(0, 5, 200), fleet, rng)
    est = protocol.estimate_round(reports)
    assert est.shape == (5,) and np.all(np.isfinite(est))
    assert np.all(protocol.estimate_round(reports, method="nnls") >= 0)
    assert protocol.estimate_round(reports, candidates=[0, 1, "x"]).shape == (3,)
    for call in (lambda: protocol.estimate_round(reports, method="lasso"),
                 lambda: protocol.decode_bit_counts(*protocol.denoised_bit_counts(reports), method="ols")):
        with pytest.raises(ValueError, match="method must be 'lstsq'") as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="t_hat must have shape"):
        protocol.decode_bit_counts(np.zeros((4, 3)), np.ones(4))
    with pytest.raises(ValueError, match="at least one report"):
        protocol.decode_bit_counts(np.zeros((4, 32)), np.zeros(4))
    with pytest.raises(ValueError, match="cohorts must be"):
        protocol.design_rank(cohorts=[4])
    with pytest.raises(ValueError, match="bits"):
        protocol.estimate_round(reports._replace(bits=reports.bits[:, :3]))
    with pytest.raises(ValueError, match="domain_size"):
        RAPPOR().new_fleet(3, rng)
    client = RAPPOR(num_bits=16).client(rng=rng)
    cohort, bits = client.report("https://example.org").report
    assert bits.shape == (16,) and 0 <= cohort < 32


def _rappor_expected_counts(protocol: RAPPOR, cohort_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact E[reported-bit counts] (m, num_bits) and N_c for a population with N_{c,v} = cohort_counts[c, v]:
    a user with Bloom bit B reports 1 w.p. q* if B = 1 else p* (paper, §4), independently of the decoder's algebra."""
    table = protocol.bloom_table(tuple(range(cohort_counts.shape[1]))).astype(float)  # (m, K, bits)
    ones = np.einsum("cv,cvi->ci", cohort_counts, table)  # users of cohort c with bit i set
    n_c = cohort_counts.sum(axis=1)
    return ones * protocol.q_star + (n_c[:, None] - ones) * protocol.p_star, n_c


def test_rappor_default_decoder_recovers_a_known_population_exactly():
    """The default decoder is linear and left-inverts the Bloom design: exact expected counts give π to 1e-9."""
    protocol = RAPPOR(num_bits=32, num_hashes=2, num_cohorts=8, f=0.5, p=0.4, q=0.8, domain_size=20)
    base = np.arange(1, 21, dtype=float)  # 210 users per copy; π_v ∝ v + 1
    pi = base / base.sum()
    sizes = np.array([1, 2, 3, 1, 0, 4, 2, 1])  # cohort c holds sizes[c] copies; cohort 4 is empty
    counts, n_c = _rappor_expected_counts(protocol, sizes[:, None] * base[None, :])
    assert protocol.design_rank() == 20
    assert protocol.design_rank(cohorts=np.flatnonzero(sizes)) == 20
    t_hat = protocol.denoise_counts(counts, n_c)
    np.testing.assert_allclose(protocol.decode_bit_counts(t_hat, n_c), pi, rtol=0, atol=1e-9)
    np.testing.assert_allclose(protocol.decode_bit_counts(t_hat, n_c, method="nnls"), pi, rtol=0, atol=1e-9)


def test_rappor_rank_deficient_decoder_is_unbiased_for_the_identifiable_projection():
    """30 candidates, 2 cohorts × 8 bits: no left inverse; the minimum-norm fit returns X⁺X π (and, h = 1, Σ = 1)."""
    protocol = RAPPOR(num_bits=8, num_hashes=1, num_cohorts=2, f=0.5, p=0.4, q=0.8, domain_size=30)
    pi = np.random.default_rng(4).dirichlet(np.ones(30))
    counts, n_c = _rappor_expected_counts(protocol, np.array([400.0, 600.0])[:, None] * pi[None, :])
    est = protocol.decode_bit_counts(protocol.denoise_counts(counts, n_c), n_c)
    x = protocol.bloom_table(tuple(range(30))).transpose(0, 2, 1).reshape(16, 30).astype(float)
    rank = protocol.design_rank()
    assert rank == np.linalg.matrix_rank(x) < 30
    np.testing.assert_allclose(est, np.linalg.pinv(x) @ x @ pi, rtol=0, atol=1e-9)
    assert abs(est.sum() - 1.0) < 1e-9 and np.abs(est - pi).max() > 1e-3
    nn = protocol.decode_bit_counts(protocol.denoise_counts(counts, n_c), n_c, method="nnls")
    assert np.all(nn >= 0) and np.linalg.norm(x @ nn - x @ pi) < 1e-6  # fits the identifiable part exactly
    # a candidate listed twice: identical columns, rank K - 1; minimum norm splits the estimate evenly
    wide = RAPPOR(num_bits=32, num_hashes=2, num_cohorts=8, f=0.5, p=0.4, q=0.8, domain_size=20)
    assert wide.design_rank(candidates=[0, 0, 1]) == 2
    rng = np.random.default_rng(6)
    reports, _ = wide.privatize_round(rng.integers(0, 2, 500), wide.new_fleet(500, rng), rng)
    split, once = wide.estimate_round(reports, candidates=[0, 0, 1]), wide.estimate_round(reports, candidates=[0, 1])
    np.testing.assert_allclose(split, [once[0] / 2, once[0] / 2, once[1]], rtol=0, atol=1e-9)


def test_rappor_nnls_option_is_non_negative():
    protocol = RAPPOR(num_bits=32, num_hashes=2, num_cohorts=4, domain_size=40)
    rng = np.random.default_rng(5)
    values = rng.integers(0, 3, 300)  # 37 of the 40 candidates are absent: least squares goes negative
    reports, _ = protocol.privatize_round(values, protocol.new_fleet(300, rng), rng)
    lstsq, nn = protocol.estimate_round(reports), protocol.estimate_round(reports, method="nnls")
    assert lstsq.min() < 0 and nn.shape == (40,) and nn.min() >= 0
    t_hat, n_c = protocol.denoised_bit_counts(reports)
    np.testing.assert_array_equal(protocol.decode_bit_counts(t_hat, n_c, method="nnls"), nn)


def test_rappor_decodes_with_empty_high_cohorts():
    """Cohorts that received no reports (here the high ones) decode to zero bit counts, finite, not NaN."""
    proto = RAPPOR(num_bits=16, num_hashes=2, num_cohorts=4)
    bits = np.random.default_rng(5).integers(0, 2, size=(10, 16)).astype(np.uint8)
    t_hat, n_c = proto.denoised_bit_counts(RapporReports(np.zeros(10, dtype=np.int64), bits))
    assert n_c.tolist() == [10, 0, 0, 0] and np.all(t_hat[1:] == 0) and np.all(np.isfinite(t_hat))


def test_alpha_rounding_is_unbiased_with_exact_probabilities():
    step, s = 0.25, 4
    x = np.array([0.0, 0.1, 0.25, 0.6, 0.99, 1.0])
    u = np.linspace(0, 1, 100_000, endpoint=False)
    idx = alpha_round_index(x[:, None], u[None, :], step, s)
    np.testing.assert_allclose((idx * step).mean(axis=1), x, atol=1e-5)
    assert idx.min() >= 0 and idx.max() <= s
    assert np.all(alpha_round_index(1.0, u, step, s) == s)


def test_ddrm_tree_structure_and_per_round_equivalence():
    protocol = DDRM(1.0, horizon=10, max_nonzero=20)
    assert protocol.n_nodes == 10 + 5 + 2 + 1
    assert protocol.prefix_nodes(7) == [protocol._index[(2, 4)], protocol._index[(1, 6)], protocol._index[(0, 7)]]
    streams = np.array([[0, 1, 1, 0, 0, 1, 1, 1, 0, 1], [1] * 10])
    v = protocol.node_values(streams)
    # each prefix sum of node values reconstructs the stream
    for t in range(1, 11):
        np.testing.assert_array_equal(v[:, protocol.prefix_nodes(t)].sum(axis=1), streams[:, t - 1])
    rng = np.random.default_rng(0)
    fleet = protocol.new_fleet(2, rng)
    charges = [protocol.privatize_round(streams[:, t], fleet, rng)[1] for t in range(10)]
    np.testing.assert_allclose(np.sum(charges, axis=0), [protocol.charged_total(s) for s in streams])
    _, stream_charges = protocol.privatize_stream(streams, rng)
    np.testing.assert_allclose(stream_charges, np.stack(charges, axis=1))
    with pytest.raises(ValueError, match="horizon"):
        protocol.privatize_round(streams[:, 0], fleet, rng)
    with pytest.raises(ValueError, match="binary"):
        protocol.node_values([0, 2])
    with pytest.raises(ValueError, match="node columns"):
        protocol.estimate(np.ones((3, 5)))
    truncated = DDRM(1.0, horizon=8, max_nonzero=2)
    assert truncated.charged_total([1] * 8) == pytest.approx(2.0)  # 4 non-zero nodes, 2 allowed


def test_transcript_mechanism_and_clip_normalize():
    protocol = LGRR(2.0, 1.0, 4)
    mech = TranscriptMechanism(protocol, epsilon=protocol.charged_total([0, 0]))
    out = mech.privatize(np.zeros((10, 3), dtype=int), np.random.default_rng(0))
    assert len(out) == 3 and out[0].shape == (10,)
    with pytest.raises(ValueError):
        mech.privatize(np.zeros(10, dtype=int), np.random.default_rng(0))
    np.testing.assert_allclose(clip_normalise([-1.0, 1.0, 3.0]), [0.0, 0.25, 0.75])


def test_simulate_rounds_can_estimate_only_the_rounds_wanted():
    from protocols.longitudinal import LGRR

    values = np.random.default_rng(1).integers(0, 4, size=(500, 5))
    proto = LGRR(k=4, epsilon_inf=2.0, epsilon_1=1.0)
    every = proto.simulate_rounds(values, np.random.default_rng(7))
    some = proto.simulate_rounds(values, np.random.default_rng(7), estimate=[1, 4])
    assert some.estimates.shape == every.estimates.shape
    np.testing.assert_allclose(some.estimates[[1, 4]], every.estimates[[1, 4]])  # same draws, same estimates
    assert np.isnan(some.estimates[[0, 2, 3]]).all()
    np.testing.assert_array_equal(some.charges, every.charges)  # every round still privatized and charged
    with pytest.raises(ValueError, match="outside"):
        proto.simulate_rounds(values, np.random.default_rng(7), estimate=[5])


def test_the_residue_walk_refuses_a_hash_range_beyond_uint32():
    with pytest.raises(ValueError, match="2\\^32"):
        support_counts([1, 2], [0, 1], 10, 1 << 32, strategy="walk")
    assert support_counts([1, 2], [0, 1], 10, 1 << 32).shape == (10,)  # auto: blocks
