"""Empirical audits of longitudinal protocols on whole transcripts (LDP-Auditor style, SPEC §6).

One device reports τ times; :class:`~protocols.longitudinal.TranscriptMechanism` turns its τ-report transcript
into one mechanism, and :func:`protocols.audit.audit` checks ε_emp against what the protocol charged the ledger
(ε∞ per new memo entry) — for value sequences with the same memo pattern that total is a valid bound — or against
:meth:`transcript_epsilon_bound`. Single reports are audited against ε1. Events are likelihood-ratio level sets
computed exactly where the transcript space is small (GRR-type chains, DDRM), and bit patterns otherwise.
The last tests show what memoization does *not* protect: the times at which a value changes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocols.audit import audit
from protocols.hashing import hash_values
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
)
from protocols.longitudinal.memo import encode_value
from protocols.longitudinal.rappor import bloom_indices
from tests.protocols.longitudinal.test_longitudinal_exact import grr_matrix, transcript_distribution

pytestmark = pytest.mark.audit


def _llr_events(llr: np.ndarray, to_index, count: int = 3) -> list:
    """Events {LLR ≥ c} and {LLR ≤ -c} for the `count` largest distinct |LLR| levels (exact level sets)."""
    levels = np.unique(np.round(np.abs(llr[np.isfinite(llr)]), 12))[::-1][:count]
    events = []
    for c in levels:
        if c <= 0:
            continue
        events.append(lambda R, c=c: llr[to_index(R)] >= c - 1e-12)
        events.append(lambda R, c=c: llr[to_index(R)] <= -c + 1e-12)
    return events


def _grr_chain_events(p1: np.ndarray, p2: np.ndarray, slots_a, slots_b, column=None) -> list:
    """Exact LLR events for a GRR-type chain transcript; slots double as PRR inputs (slot id = symbol)."""
    pa = transcript_distribution(p1, p2, slots_a, {s: s for s in slots_a})
    pb = transcript_distribution(p1, p2, slots_b, {s: s for s in slots_b})
    llr = np.log(pa / pb).ravel()
    k, tau = p2.shape[1], len(slots_a)

    def to_index(R):
        ys = [np.asarray(r)[:, column] if column is not None else np.asarray(r) for r in R]
        return np.ravel_multi_index(tuple(ys), (k,) * tau)

    return _llr_events(llr, to_index)


LGRR_CASES = [((0,), (1,)), ((0, 0, 0), (1, 1, 1)), ((0, 0, 1), (1, 1, 0)), ((0, 1, 1), (2, 3, 3))]


@pytest.mark.parametrize("eps_inf,eps_1", [(1.0, 0.5), (2.0, 1.0), (4.0, 1.0)])
@pytest.mark.parametrize("seq_a,seq_b", LGRR_CASES, ids=["one-report", "constant", "change", "change-2"])
def test_lgrr_transcript_audit(rng, audit_trials, eps_inf, eps_1, seq_a, seq_b):
    protocol = LGRR(eps_inf, eps_1, 4)
    charged = max(protocol.charged_total(seq_a), protocol.charged_total(seq_b))
    bound = protocol.transcript_epsilon_bound(seq_a, seq_b)
    assert bound <= charged + 1e-12  # same memo pattern: the ledger's total is a valid bound
    c = protocol.chain
    events = _grr_chain_events(grr_matrix(4, c.p1), grr_matrix(4, c.p2), list(seq_a), list(seq_b))
    mech = TranscriptMechanism(protocol, epsilon=charged)
    res = audit(mech, np.array(seq_a), np.array(seq_b), events, audit_trials, rng)
    assert res.passed, res
    assert res.epsilon_emp <= bound + 1e-12
    if len(seq_a) == 1:
        assert bound == pytest.approx(eps_1)
        if eps_1 <= 1.0:
            assert res.epsilon_emp > 0.6 * eps_1  # the audit has power


@pytest.mark.parametrize("g", [2, "optimal"])
@pytest.mark.parametrize("tau", [1, 3])
def test_loloha_transcript_audit(rng, audit_trials, g, tau):
    k = 20
    protocol = LOLOHA(2.0, 1.0, k, g=g)
    seed = next(s for s in range(1, 1000) if hash_values(s, 0, protocol.g) != hash_values(s, 1, protocol.g))
    seq_a, seq_b = [0] * tau, [1] * tau
    charged = protocol.charged_total(seq_a, seed=seed)
    assert charged == pytest.approx(protocol.epsilon_inf)
    slots_a = protocol.memo_slots(seq_a, seed=seed)
    slots_b = protocol.memo_slots(seq_b, seed=seed)
    c = protocol.chain
    events = _grr_chain_events(grr_matrix(protocol.g, c.p1), grr_matrix(protocol.g, c.p2), slots_a, slots_b, column=1)
    claimed = protocol.epsilon_1 if tau == 1 else charged
    res = audit(TranscriptMechanism(protocol, claimed, seeds=seed), np.array(seq_a), np.array(seq_b), events,
                audit_trials, rng)
    assert res.passed, res
    if tau == 1:
        assert res.epsilon_emp > 0.6 * protocol.epsilon_1


@pytest.mark.parametrize("cls", [LOSUE, LSUE])
@pytest.mark.parametrize("tau", [1, 3])
def test_unary_chain_transcript_audit(rng, audit_trials, cls, tau):
    protocol = cls(2.0, 1.0, 4)
    seq_a, seq_b = np.zeros(tau, dtype=int), np.ones(tau, dtype=int)

    def bits(R, a_on: bool, need: int):
        hits = sum(((np.asarray(r)[:, 0] == 1) == a_on) & ((np.asarray(r)[:, 1] == 0) == a_on) for r in R)
        return hits >= need

    events = [lambda R, s=s, m=m: bits(R, s, m) for s in (True, False) for m in sorted({1, tau})]
    claimed = protocol.epsilon_1 if tau == 1 else protocol.charged_total(seq_a)
    res = audit(TranscriptMechanism(protocol, claimed), seq_a, seq_b, events, audit_trials, rng)
    assert res.passed, res


def test_rappor_transcript_audit(rng, audit_trials):
    protocol = RAPPOR(num_bits=16, num_hashes=2, num_cohorts=4, f=0.5, p=0.5, q=0.75, domain_size=200)
    sets = {v: set(bloom_indices(encode_value(v), 0, 16, 2)) for v in range(200)}
    a, b = next((a, b) for a in sets for b in sets if len(sets[a]) == 2 == len(sets[b]) and not sets[a] & sets[b])
    ia, ib = sorted(sets[a]), sorted(sets[b])
    for tau in (1, 4):

        def score(R):
            return sum(np.asarray(r.bits)[:, ia].sum(axis=1) - np.asarray(r.bits)[:, ib].sum(axis=1) for r in R)

        top = 4 * tau
        events = [lambda R, c=c: score(R) >= c for c in (top, top - 1)]
        events += [lambda R, c=c: score(R) <= -c for c in (top, top - 1)]
        claimed = protocol.epsilon_1 if tau == 1 else protocol.charged_total([a] * tau)
        mech = TranscriptMechanism(protocol, claimed, cohorts=0)
        res = audit(mech, np.full(tau, a), np.full(tau, b), events, audit_trials, rng)
        assert res.passed, res


def test_dbitflip_transcript_audit(rng, audit_trials):
    protocol = DBitFlipPM(1.0, k=10, b=10, d=3)
    sampled = [0, 1, 2]
    seq_a, seq_b = np.array([0, 0]), np.array([1, 1])

    def pattern(R, on: int, off: int):
        return np.all([(np.asarray(r.bits)[:, on] == 1) & (np.asarray(r.bits)[:, off] == 0) for r in R], axis=0)

    events = [lambda R: pattern(R, 0, 1), lambda R: pattern(R, 1, 0)]
    claimed = protocol.charged_total(seq_a, sampled=sampled)
    assert claimed == pytest.approx(1.0)
    res = audit(TranscriptMechanism(protocol, claimed, sampled=sampled), seq_a, seq_b, events, audit_trials, rng)
    assert res.passed, res
    assert res.epsilon_emp > 0.5  # memoized responses repeat verbatim: the exact loss is ε


def test_one_bit_mean_transcript_audit(rng, audit_trials):
    protocol = OneBitMeanMemo(1.0, m=1.0, s=4, gamma=0.1)
    for tau, claimed in ((1, protocol.epsilon_1), (3, protocol.epsilon_inf)):
        ones = lambda R: sum(np.asarray(r, dtype=int) for r in R)  # noqa: E731
        events = [lambda R, c=c: ones(R) >= c for c in range(1, tau + 1)]
        events += [lambda R, c=c: ones(R) <= c for c in range(tau)]
        mech = TranscriptMechanism(protocol, claimed, u=0.0)
        res = audit(mech, np.zeros(tau), np.ones(tau), events, audit_trials, rng)
        assert res.passed, res


@pytest.mark.parametrize(
    "stream_a,stream_b",
    [([0, 0, 0, 1, 1, 1, 1, 1], [1] * 8), ([0] * 8, [0, 0, 0, 0, 0, 1, 1, 1]), ([1, 1, 0, 0, 0, 0, 0, 0], [0] * 8)],
)
def test_ddrm_transcript_audit(rng, audit_trials, stream_a, stream_b):
    protocol = DDRM.for_changes(1.0, horizon=8, changes=2)
    va, vb = protocol.node_values(np.array(stream_a)), protocol.node_values(np.array(stream_b))
    pa, pb = 0.5 + 0.5 * va / protocol.c, 0.5 + 0.5 * vb / protocol.c
    w_plus, w_minus = np.log(pa / pb), np.log((1 - pa) / (1 - pb))

    def llr(R):
        r = np.concatenate([np.asarray(x) for x in R], axis=1)
        return np.where(r > 0, w_plus, w_minus).sum(axis=1)

    top = float(np.maximum(w_plus, w_minus).sum())
    bottom = float(np.minimum(w_plus, w_minus).sum())
    events = [lambda R, c=c: llr(R) >= c - 1e-9 for c in (top, 0.6 * top)]
    events += [lambda R, c=c: llr(R) <= c + 1e-9 for c in (bottom, 0.6 * bottom)]
    charged = max(protocol.charged_total(stream_a), protocol.charged_total(stream_b))
    bound = protocol.transcript_epsilon_bound(stream_a, stream_b)
    assert bound <= charged + 1e-12 and math.isclose(bound, max(top, -bottom), rel_tol=1e-9)
    res = audit(TranscriptMechanism(protocol, charged), np.array(stream_a), np.array(stream_b), events,
                audit_trials, rng)
    assert res.passed, res
    assert res.epsilon_emp <= bound


def test_dbitflip_memoization_reveals_value_changes(rng, audit_trials):
    """Limitation, not a bug: without a fresh IRR, 'a, a' and 'a, b' are told apart by whether the two responses
    are identical. The audit exceeds both ledger totals (ε and 2ε); transcript_epsilon_bound says ∞."""
    protocol = DBitFlipPM(1.0, k=10, b=10, d=3)
    sampled = [0, 1, 2]
    seq_a, seq_b = np.array([0, 0]), np.array([0, 1])
    assert math.isinf(protocol.transcript_epsilon_bound(seq_a, seq_b, sampled=sampled))
    charged = max(protocol.charged_total(seq_a, sampled=sampled), protocol.charged_total(seq_b, sampled=sampled))
    differ = lambda R: np.any(np.asarray(R[0].bits) != np.asarray(R[1].bits), axis=1)  # noqa: E731
    res = audit(TranscriptMechanism(protocol, charged, sampled=sampled), seq_a, seq_b, [differ], audit_trials, rng)
    assert not res.passed and res.epsilon_emp > charged
