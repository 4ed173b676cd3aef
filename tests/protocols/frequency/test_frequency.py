"""Frequency oracles: parameters, exact privacy (worst-case likelihood ratio = e^ε), samplers vs exact laws, decoders
vs brute force, the FWHT, the Philox PRF and consistency post-processing."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import linalg, stats

from protocols.frequency import (
    BLH,
    GRR,
    OLH,
    OUE,
    SUE,
    HadamardResponse,
    LocalHashing,
    PublicMatrixOracle,
    clip_normalise,
    fwht,
    philox4x32,
    project_simplex,
)
from protocols.frequency.hadamard import hadamard_entries
from protocols.hashing import (
    MAX_ITEM,
    draw_seeds,
    hash_matrix,
    hash_one,
    hash_values,
    support_counts,
    support_prefix_moments,
)

EPSILONS = (0.5, 1.0, 2.0, 4.0)
RTOL = 1e-12


def _all_oracles(epsilon: float, k: int) -> list:
    return [
        GRR(epsilon, k),
        SUE(epsilon, k),
        OUE(epsilon, k),
        BLH(epsilon, k),
        OLH(epsilon, k),
        HadamardResponse(epsilon, k),
        PublicMatrixOracle(epsilon, k, key=b"unit-test"),
    ]


# --- parameters ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [GRR, SUE, OUE, BLH, OLH, HadamardResponse])
@pytest.mark.parametrize("bad_eps", [0, -1.0, float("nan"), float("inf"), "x"])
def test_rejects_bad_epsilon(factory, bad_eps):
    with pytest.raises(ValueError, match="epsilon"):
        factory(bad_eps, 4)


@pytest.mark.parametrize("factory", [GRR, SUE, OUE, BLH, OLH, HadamardResponse])
@pytest.mark.parametrize("bad_k", [1, 0, 2.5, True, "4"])
def test_rejects_bad_domain(factory, bad_k):
    with pytest.raises(ValueError, match="k"):
        factory(1.0, bad_k)


def test_public_matrix_rejects_bad_key_and_domain():
    with pytest.raises(ValueError, match="key"):
        PublicMatrixOracle(1.0, 4, key=b"")
    with pytest.raises(ValueError, match="key"):
        PublicMatrixOracle(1.0, 4, key=1.5)
    with pytest.raises(ValueError, match="key"):
        PublicMatrixOracle(1.0, 4, key=-3)
    with pytest.raises(ValueError, match="k"):
        PublicMatrixOracle(1.0, 1, key="x")


def test_olh_rejects_huge_epsilon_and_lh_bad_g():
    with pytest.raises(ValueError, match="epsilon"):
        OLH(40.0, 10)
    with pytest.raises(ValueError, match="g"):
        LocalHashing(1.0, 10, g=1)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_probabilities_match_spec(epsilon):
    e, k = math.exp(epsilon), 7
    grr = GRR(epsilon, k)
    assert grr.p == pytest.approx(e / (e + k - 1), rel=RTOL)
    assert grr.q == pytest.approx(1 / (e + k - 1), rel=RTOL)
    assert grr.variance(0.0) == pytest.approx((e + k - 2) / (e - 1) ** 2, rel=1e-10)
    sue = SUE(epsilon, k)
    assert sue.p == pytest.approx(math.exp(epsilon / 2) / (math.exp(epsilon / 2) + 1), rel=RTOL)
    assert sue.q == pytest.approx(1 - sue.p, rel=RTOL)
    oue = OUE(epsilon, k)
    assert (oue.p, oue.q) == (0.5, pytest.approx(1 / (e + 1), rel=RTOL))
    assert oue.variance(0.0) == pytest.approx(4 * e / (e - 1) ** 2, rel=1e-10)
    olh = OLH(epsilon, k)
    assert olh.g == round(e) + 1
    assert olh.p == pytest.approx(e / (e + olh.g - 1), rel=RTOL)
    assert olh.q_grr == pytest.approx(1 / (e + olh.g - 1), rel=RTOL)
    assert olh.q == 1 / olh.g
    assert BLH(epsilon, k).g == 2
    hr = HadamardResponse(epsilon, k, rows=1)  # the high-privacy design; the others: test_hadamard.py
    b = (e + 1) / (e - 1)
    assert hr.p == pytest.approx(e / (e + 1), rel=RTOL) and hr.q == 0.5
    for f in (0.0, 0.3, 1.0):
        assert hr.variance(f) == pytest.approx(b**2 - f, rel=1e-10)
        assert PublicMatrixOracle(epsilon, k, key=1).variance(f) == pytest.approx(b**2 - f, rel=1e-10)


def test_olh_hash_range_by_epsilon():
    assert [OLH(eps, 10).g for eps in EPSILONS] == [3, 4, 8, 56]


@pytest.mark.parametrize(("k", "K"), [(2, 4), (3, 4), (4, 8), (7, 8), (8, 16), (360, 512)])
def test_hadamard_output_size(k, K):
    assert HadamardResponse(1.0, k, rows=1).K == K


@pytest.mark.parametrize("factory", [GRR, SUE, OUE, HadamardResponse])
def test_largest_epsilon_keeps_exact_probabilities(factory):
    o = factory(20.0, 3)  # probabilities are computed from e^{-ε}: no overflow, q > 0
    assert 0 < o.q < o.p <= 1.0
    ratio = o.p * (1 - o.q) / ((1 - o.p) * o.q) if factory in (SUE, OUE) else o.p / (1 - o.p)
    if factory is GRR or factory is HadamardResponse:  # HR at k = 3 is direct response (rows = 0)
        assert factory is GRR or o.rows == 0
        ratio = o.p / o.q
    assert ratio == pytest.approx(math.exp(20.0), rel=1e-6)
    with pytest.raises(ValueError, match="epsilon must be <= 20"):
        factory(20.5, 3)


@pytest.mark.parametrize("oracle", _all_oracles(1.0, 5), ids=lambda o: type(o).__name__)
def test_privatize_rejects_bad_values(oracle, rng):
    with pytest.raises(ValueError):
        oracle.privatize([0, 5], rng)
    with pytest.raises(ValueError):
        oracle.privatize([-1], rng)
    with pytest.raises(ValueError, match="integer"):
        oracle.privatize([0.5], rng)
    with pytest.raises(ValueError, match="1-D"):
        oracle.privatize([[0, 1]], rng)
    with pytest.raises(ValueError, match="zero reports"):
        oracle.estimate(oracle.privatize(np.zeros(0, dtype=int), rng))


@pytest.mark.parametrize("oracle", _all_oracles(1.0, 5), ids=lambda o: type(o).__name__)
def test_privatize_accepts_scalars_and_float_integers(oracle, rng):
    assert oracle.n_reports(oracle.privatize(3, rng)) == 1
    assert oracle.n_reports(oracle.privatize(np.array([1.0, 4.0]), rng)) == 2


def test_decoders_reject_malformed_reports(rng):
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        GRR(1.0, 5).support_counts(np.array([0, 5]))
    with pytest.raises(ValueError, match="shape"):
        OUE(1.0, 5).support_counts(np.zeros((3, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="0 and 1"):
        OUE(1.0, 5).support_counts(np.full((3, 5), 2, dtype=np.uint8))
    with pytest.raises(ValueError, match="shape"):
        OLH(1.0, 5).support_counts(np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        OLH(1.0, 5).support_counts(np.array([[1, 4]]))
    with pytest.raises(ValueError, match="seeds"):
        OLH(1.0, 5).support_counts(np.array([[-1, 0]]))
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        HadamardResponse(1.0, 5, rows=1).support_counts(np.array([8]))
    pm = PublicMatrixOracle(1.0, 5, key="k")
    with pytest.raises(ValueError, match="±1"):
        pm.support_counts(np.array([[0, 0]]))
    with pytest.raises(ValueError, match="distinct"):
        pm.support_counts(np.array([[3, 1], [2, -1], [3, 1]]))
    with pytest.raises(ValueError, match="one entry per user"):
        pm.privatize([0, 1], rng, user_ids=[4])


# --- exact privacy: worst-case likelihood ratio over the whole output space ----------------------------------------


def _max_ratio(table: np.ndarray) -> float:
    """max over output columns and ordered input pairs of P[out|v1]/P[out|v2]; rows are inputs."""
    return float(np.max(table.max(axis=0) / table.min(axis=0)))


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_grr_exact_ratio(epsilon):
    k = 5
    o = GRR(epsilon, k)
    table = np.stack([o.likelihood(np.arange(k), v) for v in range(k)])
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=RTOL)
    assert _max_ratio(table) == pytest.approx(math.exp(epsilon), rel=RTOL)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("factory", [SUE, OUE])
def test_unary_exact_ratio_by_enumeration_and_closed_form(factory, epsilon):
    k = 5
    o = factory(epsilon, k)
    outputs = np.array(list(itertools.product((0, 1), repeat=k)), dtype=np.uint8)  # all 2^k vectors
    table = np.stack([o.likelihood(outputs, v) for v in range(k)])
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=RTOL)
    closed_form = o.p * (1 - o.q) / ((1 - o.p) * o.q)
    assert _max_ratio(table) == pytest.approx(closed_form, rel=1e-10)
    assert closed_form == pytest.approx(math.exp(epsilon), rel=RTOL)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("factory", [BLH, OLH])
def test_local_hashing_exact_ratio_fixed_seed_and_over_seeds(factory, epsilon):
    k = 6
    o = factory(epsilon, k)
    seeds = draw_seeds(400, np.random.default_rng(7))
    # Output space given the public seed s: y ∈ [0, g). Joint law over an enumerated seed set S (uniform):
    # P[(s, y) | v] = P[y | s, v]/|S|.
    ys = np.arange(o.g)
    joint = np.stack(
        [
            np.concatenate([o.likelihood(np.stack([np.full(o.g, s), ys], axis=1), v) for s in seeds]) / seeds.size
            for v in range(k)
        ]
    )
    np.testing.assert_allclose(joint.sum(axis=1), 1.0, rtol=1e-10)
    assert _max_ratio(joint) == pytest.approx(math.exp(epsilon), rel=1e-10)
    # For one fixed seed the ratio is e^ε if the seed separates some pair of items, and never more.
    per_seed = []
    for s in seeds[:50]:
        table = np.stack([o.likelihood(np.stack([np.full(o.g, s), ys], axis=1), v) for v in range(k)])
        per_seed.append(_max_ratio(table))
        separates = np.unique(hash_values(s, np.arange(k), o.g)).size > 1
        assert per_seed[-1] == pytest.approx(math.exp(epsilon) if separates else 1.0, rel=1e-10)
    assert max(per_seed) <= math.exp(epsilon) * (1 + 1e-12)
    # Attack events marginalised over the seeds (h_s(v1) = y, with or without h_s(v2) ≠ y): ratio ≤ e^ε.
    v1, v2 = 0, 1
    hit1 = np.concatenate([hash_values(s, v1, o.g) == ys for s in seeds])
    hit2 = np.concatenate([hash_values(s, v2, o.g) == ys for s in seeds])
    for event in (hit1, hit1 & ~hit2):
        ratio = joint[v1, event].sum() / joint[v2, event].sum()
        assert ratio <= math.exp(epsilon) * (1 + 1e-12)
    assert joint[v1, hit1 & ~hit2].sum() / joint[v2, hit1 & ~hit2].sum() == pytest.approx(math.exp(epsilon))


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_hadamard_exact_ratio(epsilon):
    k = 6
    o = HadamardResponse(epsilon, k, rows=1)
    table = np.stack([o.likelihood(np.arange(o.K), v) for v in range(k)])
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=RTOL)
    assert _max_ratio(table) == pytest.approx(math.exp(epsilon), rel=RTOL)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_public_matrix_exact_ratio_per_user(epsilon):
    k = 6
    o = PublicMatrixOracle(epsilon, k, key="exact")
    ratios = []
    for i in range(64):  # each user's output space given its public index: y ∈ {-1, +1}
        outputs = np.array([[i, -1], [i, 1]])
        table = np.stack([o.likelihood(outputs, v) for v in range(k)])
        np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=RTOL)
        ratios.append(_max_ratio(table))
        column = o.entries(np.arange(k), i)
        separates = np.unique(column).size > 1
        assert ratios[-1] == pytest.approx(math.exp(epsilon) if separates else 1.0, rel=RTOL)
    assert max(ratios) == pytest.approx(math.exp(epsilon), rel=RTOL)


# --- the samplers follow the exact laws used above ------------------------------------------------------------------


def _chisquare_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_samplers_match_likelihood(epsilon):
    rng = np.random.default_rng(11)
    n, k, v = 40_000, 5, 3
    values = np.full(n, v)
    grr = GRR(epsilon, k)
    assert (
        _chisquare_pvalue(np.bincount(grr.privatize(values, rng), minlength=k), grr.likelihood(np.arange(k), v)) > 1e-4
    )
    for unary in (SUE(epsilon, k), OUE(epsilon, k)):
        bits = unary.privatize(values, rng)
        codes = bits @ (1 << np.arange(k)[::-1])  # row → integer in [0, 2^k)
        outputs = np.array(list(itertools.product((0, 1), repeat=k)), dtype=np.uint8)
        assert _chisquare_pvalue(np.bincount(codes, minlength=2**k), unary.likelihood(outputs, v)) > 1e-4
    hr = HadamardResponse(epsilon, k, rows=1)
    assert (
        _chisquare_pvalue(np.bincount(hr.privatize(values, rng), minlength=hr.K), hr.likelihood(np.arange(hr.K), v))
        > 1e-4
    )
    for lh in (BLH(epsilon, k), OLH(epsilon, k)):
        reports = lh.privatize(values, rng)
        offset = (reports[:, 1] - hash_values(reports[:, 0], v, lh.g)) % lh.g  # 0 w.p. p, else uniform
        probs = np.full(lh.g, lh.q_grr)
        probs[0] = lh.p
        assert _chisquare_pvalue(np.bincount(offset, minlength=lh.g), probs) > 1e-4
    pm = PublicMatrixOracle(epsilon, k, key=b"sampler")
    reports = pm.privatize(values, rng)
    agree = int(np.count_nonzero(reports[:, 1] == pm.entries(v, reports[:, 0])))
    assert stats.binomtest(agree, n, pm.p).pvalue > 1e-4


def test_unary_reports_are_bits_and_pack_roundtrip(rng):
    o = OUE(1.0, 13)
    bits = o.privatize(rng.integers(0, 13, 1000), rng)
    assert bits.dtype == np.uint8 and bits.shape == (1000, 13) and set(np.unique(bits)) <= {0, 1}
    packed = o.pack(bits)
    assert packed.shape == (1000, 2)
    np.testing.assert_array_equal(o.unpack(packed), bits)
    np.testing.assert_array_equal(o.support_counts(bits.astype(bool)), bits.sum(axis=0))
    np.testing.assert_array_equal(o.support_counts(bits.astype(np.int64)), bits.sum(axis=0))


# --- decoders equal brute force -------------------------------------------------------------------------------------


def test_hash_one_is_hash_values_of_one_seed_and_item():
    """A device's report hashes one item in Python integers (protocols.hashing.hash_one): the decoders' numpy hash,
    for extreme seeds and items and 4,000 random pairs, at g from 2 to 2^30."""
    rng = np.random.default_rng(3)
    seeds = np.concatenate([[0, 1, (1 << 31) - 1, 1 << 31, (1 << 62) - 1], draw_seeds(4000, rng)])
    items = np.concatenate([[0, 1, MAX_ITEM - 1, MAX_ITEM], rng.integers(0, MAX_ITEM + 1, 4001)])
    for g in (2, 7, 360, 1 << 30):
        expected = hash_values(seeds, items, g)
        assert [hash_one(int(s), int(v), g) for s, v in zip(seeds, items, strict=True)] == expected.tolist()


@pytest.mark.parametrize("g", [2, 3, 4, 7, 56])
@pytest.mark.parametrize("chunk", [7, 97, 1 << 17])
def test_support_counts_walk_equals_hash_matrix(g, chunk):
    rng = np.random.default_rng(g)
    n, k = 1500, 37
    seeds = draw_seeds(n, rng)
    y = rng.integers(0, g, n)
    expected = (hash_matrix(seeds, k, g) == y[:, None]).sum(axis=0)
    np.testing.assert_array_equal(support_counts(seeds, y, k, g, chunk=chunk, strategy="walk"), expected)


@pytest.mark.parametrize("n", [300, 2500])  # the blocks path, the walk (from WALK_MIN_USERS users on)
@pytest.mark.parametrize("g", [2, 7, 56])
def test_support_prefix_moments_equal_hash_matrix(n, g):
    rng = np.random.default_rng(n + g)
    k = 37
    seeds = draw_seeds(n, rng)
    y = rng.integers(0, g, n)
    hits = hash_matrix(seeds, k, g) == y[:, None]
    counts, squares = support_prefix_moments(seeds, y, k, g)
    np.testing.assert_array_equal(counts, hits.sum(axis=0))
    np.testing.assert_array_equal(squares, (np.cumsum(hits, axis=1) ** 2).sum(axis=0))


def test_lh_extreme_seeds_do_not_overflow():
    g, k = 5, 300
    seeds = np.array([0, 1, (1 << 62) - 1, (1 << 62) - 2, (1 << 31) - 1, 1 << 31, 3 << 60], dtype=np.int64)
    y = np.arange(seeds.size) % g
    expected = (hash_matrix(seeds, k, g) == y[:, None]).sum(axis=0)
    np.testing.assert_array_equal(support_counts(seeds, y, k, g), expected)


def test_hadamard_support_counts_equal_brute_force(rng):
    o = HadamardResponse(1.0, 11, rows=1)
    reports = o.privatize(rng.integers(0, 11, 3000), rng)
    h = hadamard_entries(np.arange(1, 12)[:, None], reports[None, :])
    np.testing.assert_array_equal(o.support_counts(reports), (h == 1).sum(axis=1))


@pytest.mark.parametrize("k", [5, 128, 200, 300])
def test_public_matrix_support_counts_equal_brute_force(k, rng):
    o = PublicMatrixOracle(1.0, k, key=k)
    ids = rng.permutation(50_000)[:700] * 97_003  # distinct, unordered, large indices
    reports = o.privatize(rng.integers(0, k, ids.size), rng, user_ids=ids)
    z = o.entries(np.arange(k)[:, None], ids[None, :])  # (k, n)
    np.testing.assert_array_equal(o.columns(ids).T, (z == 1).astype(np.uint8))
    np.testing.assert_array_equal(o.support_counts(reports), (z == reports[:, 1]).sum(axis=1))
    np.testing.assert_array_equal(o.correlations(reports), (z * reports[:, 1]).sum(axis=1))
    assert o.estimate(reports) == pytest.approx(
        (math.exp(1) + 1) / (math.exp(1) - 1) * (z * reports[:, 1]).sum(axis=1) / ids.size
    )


def test_public_matrix_fresh_keys_differ():
    k1, k2 = PublicMatrixOracle.fresh_key(), PublicMatrixOracle.fresh_key()
    assert len(k1) == 16 and k1 != k2
    cols = [PublicMatrixOracle(1.0, 64, key=key).columns(np.arange(50)) for key in (k1, k2)]
    assert not np.array_equal(*cols)


def test_public_matrix_is_keyed_and_balanced():
    a, b = PublicMatrixOracle(1.0, 300, key="a"), PublicMatrixOracle(1.0, 300, key="b")
    za, zb = a.columns(np.arange(2000)), b.columns(np.arange(2000))
    np.testing.assert_array_equal(za, PublicMatrixOracle(2.0, 300, key="a").columns(np.arange(2000)))
    assert abs(za.mean() - 0.5) < 0.01 and abs((za == zb).mean() - 0.5) < 0.01
    assert abs(np.corrcoef(za[:, 0], za[:, 1])[0, 1]) < 0.1


def test_philox_known_answers():
    # Random123 tests/kat_vectors, philox4x32 10 rounds: counter, key -> output.
    cases = [
        ([0, 0, 0, 0], (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            (0xA4093822, 0x299F31D0),
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for counter, key, expected in cases:
        assert philox4x32(np.array(counter, dtype=np.uint32), key).tolist() == expected


# --- FWHT -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [1, 2, 8, 64])
def test_fwht_matches_sylvester_matrix(K, rng):
    x = rng.normal(size=(3, K))
    np.testing.assert_allclose(fwht(x), x @ linalg.hadamard(K), atol=1e-9)
    ints = rng.integers(-5, 6, size=K)
    np.testing.assert_array_equal(fwht(ints), ints @ linalg.hadamard(K))
    np.testing.assert_allclose(fwht(fwht(x)) / K, x, atol=1e-12)


def test_fwht_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        fwht(np.ones(6))


def test_hadamard_entries_match_matrix():
    H = linalg.hadamard(16)
    np.testing.assert_array_equal(hadamard_entries(np.arange(16)[:, None], np.arange(16)[None, :]), H)


# --- consistency post-processing ------------------------------------------------------------------------------------


def _project_by_bisection(f: np.ndarray) -> np.ndarray:
    lo, hi = f.min() - 1, f.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.maximum(f - mid, 0).sum() > 1 else (lo, mid)
    return np.maximum(f - (lo + hi) / 2, 0)


def test_project_simplex(rng):
    np.testing.assert_allclose(project_simplex([0.5, 0.7, -0.2]), [0.4, 0.6, 0.0])
    np.testing.assert_allclose(project_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
    for _ in range(20):
        f = rng.normal(0.1, 0.3, size=12)
        out = project_simplex(f)
        assert out.min() >= 0 and out.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(out, _project_by_bisection(f), atol=1e-9)
    rows = rng.normal(size=(4, 6))
    np.testing.assert_allclose(project_simplex(rows), np.stack([project_simplex(r) for r in rows]))


def test_clip_normalise():
    np.testing.assert_allclose(clip_normalise([0.5, -0.1, 1.5]), [0.25, 0.0, 0.75])
    np.testing.assert_allclose(clip_normalise([-1.0, -2.0]), [0.5, 0.5])
    np.testing.assert_allclose(clip_normalise([[1.0, 1.0], [0.0, 2.0]]), [[0.5, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match="finite"):
        clip_normalise([np.nan, 1.0])
    with pytest.raises(ValueError, match="non-empty"):
        project_simplex([])


def test_repr_names_parameters():
    assert repr(OLH(1.0, 10)) == "OLH(epsilon=1.0, k=10)"
    assert repr(LocalHashing(1.0, 10, g=3)) == "LocalHashing(epsilon=1.0, k=10, g=3)"
    assert repr(GRR(2.0, 4)) == "GRR(epsilon=2.0, k=4)"
