"""Exact likelihood-ratio checks of the longitudinal protocols by enumeration of small output spaces.

For a device that reports τ times, the PRR of every memo slot is drawn once and each report is a fresh IRR of its
slot's PRR, so P[transcript | values] = Σ_{PRR of each distinct slot} Π_slots P1(z_s | slot) Π_t P2(y_t | z_{s_t}).
We enumerate that sum for small k, g, τ and compare max ratios with the claimed guarantees.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from protocols.hashing import hash_values
from protocols.longitudinal import DDRM, LGRR, LOLOHA, LOSUE, LSUE, RAPPOR, OneBitMeanMemo, grr_chain
from protocols.longitudinal.chains import grr_epsilon, ue_epsilon
from protocols.longitudinal.rappor import bloom_indices
from protocols.longitudinal.memo import encode_value

REL = 1e-9


def grr_matrix(k: int, p: float) -> np.ndarray:
    m = np.full((k, k), (1 - p) / (k - 1))
    np.fill_diagonal(m, p)
    return m


def transcript_distribution(p1: np.ndarray, p2: np.ndarray, slots: list, inputs: dict) -> np.ndarray:
    """Exact P[y_1..y_τ] for a GRR-type chain: p1[input, z] (PRR), p2[z, y] (IRR), memo slot per report."""
    k_out = p2.shape[1]
    distinct = list(dict.fromkeys(slots))
    out = np.zeros((k_out,) * len(slots))
    for zs in itertools.product(range(p1.shape[1]), repeat=len(distinct)):
        z = dict(zip(distinct, zs))
        weight = math.prod(p1[inputs[s], z[s]] for s in distinct)
        factors = [p2[z[s]] for s in slots]
        joint = factors[0]
        for f in factors[1:]:
            joint = np.multiply.outer(joint, f)
        out += weight * joint
    return out


def max_log_ratio(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.log(max((a / b).max(), (b / a).max())))


def lgrr_transcript(protocol: LGRR, values: list[int]) -> np.ndarray:
    c = protocol.chain
    slots = protocol.memo_slots(values)
    return transcript_distribution(
        grr_matrix(protocol.k, c.p1), grr_matrix(protocol.k, c.p2), slots, {s: s for s in slots}
    )


@pytest.mark.parametrize("eps_inf,eps_1,k", [(2.0, 1.0, 3), (1.0, 0.9, 3), (4.0, 0.5, 5), (0.5, 0.1, 2)])
def test_lgrr_one_report_is_exactly_eps1(eps_inf, eps_1, k):
    protocol = LGRR(eps_inf, eps_1, k)
    a, b = lgrr_transcript(protocol, [0]), lgrr_transcript(protocol, [1])
    assert math.isclose(max_log_ratio(a, b), eps_1, rel_tol=REL)
    c = protocol.chain
    assert math.isclose(grr_epsilon(c.p1, c.q1), eps_inf, rel_tol=REL)
    assert math.isclose(grr_epsilon(c.p2, c.q2), protocol.epsilon_irr, rel_tol=REL)
    assert protocol.transcript_epsilon_bound([0], [1]) == pytest.approx(eps_1)


@pytest.mark.parametrize("eps_inf,eps_1,k", [(2.0, 1.0, 3), (1.0, 0.9, 3), (3.0, 1.0, 4)])
def test_lgrr_two_report_transcripts_within_charged_totals(eps_inf, eps_1, k):
    protocol = LGRR(eps_inf, eps_1, k)
    same_a, same_b = lgrr_transcript(protocol, [0, 0]), lgrr_transcript(protocol, [1, 1])
    loss = max_log_ratio(same_a, same_b)
    assert eps_1 < loss <= protocol.charged_total([0, 0]) * (1 + REL)  # memoized: charged ε∞ once
    assert loss <= protocol.transcript_epsilon_bound([0, 0], [1, 1]) * (1 + REL)
    swap_a, swap_b = lgrr_transcript(protocol, [0, 1]), lgrr_transcript(protocol, [1, 0])
    assert max_log_ratio(swap_a, swap_b) <= protocol.charged_total([0, 1]) * (1 + REL)
    assert protocol.charged_total([0, 1]) == pytest.approx(2 * eps_inf)
    # three reports, a change in the middle of a memoized run (same pattern on both sides)
    three_a, three_b = lgrr_transcript(protocol, [0, 0, 1]), lgrr_transcript(protocol, [2 % k, 2 % k, 0])
    assert max_log_ratio(three_a, three_b) <= protocol.transcript_epsilon_bound([0, 0, 1], [2 % k, 2 % k, 0]) * (
        1 + REL
    )


def test_lgrr_change_points_are_protected_only_by_the_irr():
    """'a, a' versus 'a, b': different memo patterns. The exact loss is within the IRR bound but can exceed
    what the ledger charged for either sequence (ε∞ resp. 2ε∞) — memoization protects values, not change times."""
    protocol = LGRR(1.0, 0.9, 3)
    aa, ab = lgrr_transcript(protocol, [0, 0]), lgrr_transcript(protocol, [0, 1])
    loss = max_log_ratio(aa, ab)
    bound = protocol.transcript_epsilon_bound([0, 0], [0, 1])
    assert bound == pytest.approx(protocol.epsilon_irr)
    assert loss <= bound * (1 + REL)
    assert loss > max(protocol.charged_total([0, 0]), protocol.charged_total([0, 1]))  # 2.50 > 2.0


def test_loloha_exact_one_report_and_transcripts_with_fixed_seed():
    k, g = 6, 3
    protocol = LOLOHA(2.0, 1.0, k, g=g)
    seed = next(s for s in range(1, 10_000) if len(set(hash_values(s, np.arange(k), g).tolist())) == g)
    slots = protocol.memo_slots(list(range(k)), seed=seed)
    a = 0
    b = next(v for v in range(k) if slots[v] != slots[a])
    same = next((v for v in range(1, k) if slots[v] == slots[a]), None)
    c = protocol.chain
    p1, p2 = grr_matrix(g, c.p1), grr_matrix(g, c.p2)

    def dist(values):
        s = protocol.memo_slots(values, seed=seed)
        return transcript_distribution(p1, p2, s, {h: h for h in s})

    assert math.isclose(max_log_ratio(dist([a]), dist([b])), 1.0, rel_tol=REL)
    if same is not None:
        np.testing.assert_allclose(dist([a, same]), dist([a, a]))  # hash collision: indistinguishable, charged once
        assert protocol.charged_total([a, same], seed=seed) == pytest.approx(2.0)
    loss = max_log_ratio(dist([a, a, a]), dist([b, b, b]))
    assert 1.0 < loss <= protocol.charged_total([a, a, a], seed=seed) * (1 + REL)
    # however many values a device goes through, at most g hashed values: spend ≤ g·ε∞
    walk = [v % k for v in range(40)]
    assert protocol.charged_total(walk, seed=seed) <= protocol.longitudinal_bound() == pytest.approx(g * 2.0)


def test_loloha_irr_formula_matches_spec_for_g2_and_is_exact_for_larger_g():
    eps_inf, eps_1 = 2.0, 0.8
    spec = math.log((math.exp(eps_inf + eps_1) - 1) / (math.exp(eps_inf) - math.exp(eps_1)))
    assert math.isclose(LOLOHA(eps_inf, eps_1, 10, g=2).epsilon_irr, spec, rel_tol=REL)
    for g in (3, 5, 9):
        protocol = LOLOHA(eps_inf, eps_1, 10, g=g)
        c = protocol.chain
        one = transcript_distribution(grr_matrix(g, c.p1), grr_matrix(g, c.p2), [0], {0: 0})
        two = transcript_distribution(grr_matrix(g, c.p1), grr_matrix(g, c.p2), [0], {0: 1})
        assert math.isclose(max_log_ratio(one, two), eps_1, rel_tol=REL)
        # the SPEC's g-independent IRR would leak strictly less than ε1 for g > 2 (safe, but wastes utility)
        p2_spec = math.exp(spec) / (math.exp(spec) + g - 1)
        spec_two = transcript_distribution(grr_matrix(g, c.p1), grr_matrix(g, p2_spec), [0], {0: 1})
        spec_one = transcript_distribution(grr_matrix(g, c.p1), grr_matrix(g, p2_spec), [0], {0: 0})
        assert max_log_ratio(spec_one, spec_two) < eps_1


def _ue_bit_pair(p1, q1, p2, q2, reports: int) -> tuple[np.ndarray, np.ndarray]:
    """P[bit transcript | true bit 1], P[... | true bit 0] for one memoized unary-encoding bit."""
    prr = {1: (1 - p1, p1), 0: (1 - q1, q1)}
    irr = np.array([[1 - q2, q2], [1 - p2, p2]])  # irr[z, s]
    out = {}
    for bit in (0, 1):
        dist = np.zeros((2,) * reports)
        for z in (0, 1):
            joint = irr[z]
            for _ in range(reports - 1):
                joint = np.multiply.outer(joint, irr[z])
            dist += prr[bit][z] * joint
        out[bit] = dist
    return out[1], out[0]


def _two_bit_loss(on: np.ndarray, off: np.ndarray) -> float:
    """Max over outputs of ln P[out | a]/P[out | b] when a sets one bit and b another (bits independent)."""
    return float(math.log((on / off).max()) + math.log((off / on).max()))


@pytest.mark.parametrize("cls", [LOSUE, LSUE])
@pytest.mark.parametrize("eps_inf,eps_1", [(2.0, 1.0), (1.0, 0.9), (4.0, 0.5)])
def test_unary_chains_exact(cls, eps_inf, eps_1):
    protocol = cls(eps_inf, eps_1, 4)
    c = protocol.chain
    assert math.isclose(ue_epsilon(c.p1, c.q1), eps_inf, rel_tol=REL)
    assert math.isclose(ue_epsilon(c.p_star, c.q_star), eps_1, rel_tol=REL)
    # values a, b differ in two bits (a's and b's); bits are independent, so the max ratio is a product
    for reports, claimed in ((1, eps_1), (3, eps_inf)):
        on, off = _ue_bit_pair(c.p1, c.q1, c.p2, c.q2, reports)
        loss = _two_bit_loss(on, off)
        assert loss <= claimed * (1 + REL)
        if reports == 1:
            assert math.isclose(loss, eps_1, rel_tol=REL)


def test_rappor_exact_one_report_and_memoized_transcript():
    protocol = RAPPOR(num_bits=16, num_hashes=2, num_cohorts=4, f=0.5, p=0.4, q=0.8)
    assert protocol.epsilon_inf == pytest.approx(4 * math.log(3))
    cohort = 0
    sets = {v: set(bloom_indices(encode_value(v), cohort, 16, 2)) for v in range(200)}
    a, b = next((a, b) for a in sets for b in sets if len(sets[a]) == 2 == len(sets[b]) and not sets[a] & sets[b])
    f, p, q = protocol.f, protocol.p, protocol.q
    for reports, claimed in ((1, protocol.epsilon_1), (4, protocol.epsilon_inf)):
        on, off = _ue_bit_pair(1 - f / 2, f / 2, q, p, reports)
        loss = 2 * _two_bit_loss(on, off)  # 2h = 4 bits differ: h go 1 -> 0 and h go 0 -> 1
        assert loss <= claimed * (1 + REL)
        if reports == 1:
            assert math.isclose(loss, protocol.epsilon_1, rel_tol=REL)
    # many reports of one value approach ε∞
    on, off = _ue_bit_pair(1 - f / 2, f / 2, q, p, 12)
    assert 2 * _two_bit_loss(on, off) > 0.8 * protocol.epsilon_inf


def test_one_bit_mean_output_perturbation_exact():
    protocol = OneBitMeanMemo(1.5, m=1.0, s=4, gamma=0.15)
    rho = protocol.gamma + (1 - 2 * protocol.gamma) * protocol.pi(np.array([0.0, 1.0]))
    one = math.log(max(rho[1] / rho[0], (1 - rho[0]) / (1 - rho[1])))
    assert math.isclose(one, protocol.epsilon_1, rel_tol=REL)
    # τ reports of a memoized bit: P[r_1..r_τ | y] = Σ_b π_b Π_t flip(r_t | b); ratio ≤ e^{ε} for any τ
    for tau in (2, 5):
        worst = 0.0
        for bits in itertools.product((0, 1), repeat=tau):
            probs = []
            for y in (0.0, 1.0):
                pi = float(protocol.pi(y))
                total = 0.0
                for b, pb in ((1, pi), (0, 1 - pi)):
                    total += pb * math.prod(1 - protocol.gamma if r == b else protocol.gamma for r in bits)
                probs.append(total)
            worst = max(worst, abs(math.log(probs[0] / probs[1])))
        assert protocol.epsilon_1 < worst <= protocol.epsilon_inf * (1 + REL)


def test_ddrm_exact_transcript_loss_equals_bound_and_within_charges():
    protocol = DDRM.for_changes(1.0, horizon=8, changes=1)
    e = math.exp(1.0)
    streams = [[0] * 8, [1] * 8, [0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]]
    for a, b in itertools.combinations(streams, 2):
        va, vb = protocol.node_values(np.array(a)), protocol.node_values(np.array(b))
        # exact: nodes independent, so in each direction the worst transcript takes the worst r per node
        directions = []
        for first, second in ((va, vb), (vb, va)):
            total = 0.0
            for x, y in zip(first, second):
                pa, pb = 0.5 + 0.5 * x / protocol.c, 0.5 + 0.5 * y / protocol.c
                total += max(math.log(pa / pb), math.log((1 - pa) / (1 - pb)))
            directions.append(total)
        loss = max(directions)
        assert math.isclose(loss, protocol.transcript_epsilon_bound(a, b), rel_tol=REL, abs_tol=1e-12)
        assert loss <= max(protocol.charged_total(a), protocol.charged_total(b)) + 1e-12
        assert loss <= protocol.longitudinal_bound() + 1e-12
    assert protocol.cost_nonzero_vs_zero + protocol.cost_zero_vs_nonzero == pytest.approx(1.0)
    assert protocol.cost_nonzero_vs_zero == pytest.approx(math.log(2 * e / (e + 1)))


def test_grr_chain_is_a_valid_randomizer_pair():
    c = grr_chain(3.0, 1.0, 7)
    assert c.p1 + 6 * c.q1 == pytest.approx(1.0) and c.p2 + 6 * c.q2 == pytest.approx(1.0)
    assert c.p_star + 6 * c.q_star == pytest.approx(1.0)
