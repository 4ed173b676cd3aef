"""Empirical privacy audit: a distinguishing test in the style of LDP-Auditor (Arcolezi & Gambs, PoPETs 2024).

For two inputs v1, v2 and an event S over the output space (the "attack"), run the randomizer N times on each
input and count how often S occurs: TPR = P[M(v1) ∈ S], FPR = P[M(v2) ∈ S]. With a one-sided Clopper–Pearson
lower bound on TPR and upper bound on FPR, an ε-LDP mechanism satisfies, with high probability,

    ε_emp = ln((TPR_lo - δ) / FPR_hi) ≤ ε .

An audit that reports ε_emp > ε (beyond the confidence level) *proves* the claimed ε is false. Several events
may be tried at once; the confidence level is split among them (Bonferroni), so the result stays a valid
lower bound on the true ε. The audit is generic: anything with ``privatize(values, rng)`` can be audited, and
``event`` is any function mapping a batch of reports to a boolean array.

**The float-structure audit** (:func:`float_reachable`, :func:`release_audit`) asks a sharper question of what is
sent: can the *exact* value released under one input be released under another at all? For a mechanism that
releases a double ``f(x, u)`` of its input and a uniform double u, the set of doubles a branch can produce depends on
x (Mironov, CCS 2012); one released value unreachable from the other input makes the privacy loss of that report
infinite, whatever ε the real-valued proof gives. The audit decides reachability exactly (binary search over the
2^53 uniform doubles of a monotone branch); for a grid release it reads the exact channel. The double-releasing PM
and Laplace are its negative controls (tests/protocols/numeric/float_controls.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

Event = Callable[[np.ndarray], np.ndarray]

__all__ = ["AuditResult", "audit", "clopper_pearson", "empirical_epsilon", "threshold_events", "equality_event",
           "float_reachable", "ReleaseAudit", "release_audit", "grid_reachable"]


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided exact binomial bounds (each side holds with probability ≥ 1 - alpha)."""
    if trials <= 0:
        raise ValueError("trials must be positive")
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(alpha, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))
    return lo, hi


def empirical_epsilon(tp: int, fp: int, trials: int, alpha: float = 0.05, delta: float = 0.0) -> float:
    """ε_emp = ln((TPR_lo - δ)/FPR_hi); 0 when the test has no power (TPR_lo ≤ δ)."""
    tpr_lo, _ = clopper_pearson(tp, trials, alpha / 2)
    _, fpr_hi = clopper_pearson(fp, trials, alpha / 2)
    if tpr_lo - delta <= 0 or fpr_hi <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_hi))


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit`: the largest ε_emp over the events tried, and which event gave it."""

    epsilon_emp: float
    claimed_epsilon: float
    event_index: int
    tp: int
    fp: int
    trials: int

    @property
    def passed(self) -> bool:
        """True when the audit found no violation of the claimed ε."""
        return self.epsilon_emp <= self.claimed_epsilon


def audit(
    mechanism: Any,
    v1: Any,
    v2: Any,
    events: Event | Sequence[Event],
    trials: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.05,
    delta: float | None = None,
    batch: int = 200_000,
) -> AuditResult:
    """Audit ``mechanism`` on the pair (v1, v2) with one or several distinguishing events.

    Both orderings (v1 vs v2 and v2 vs v1) are evaluated for each event, since an ε-LDP bound holds in both
    directions; α is divided across all 2·len(events) tests. ``v1``/``v2`` are single inputs (a scalar, or a
    1-D vector for vector mechanisms); they are repeated ``trials`` times and privatized in batches.
    """
    if isinstance(events, Sequence):
        event_list = list(events)
    else:
        event_list = [events]
    if not event_list:
        raise ValueError("at least one event is needed")
    claimed = float(mechanism.epsilon)
    delta = float(getattr(mechanism, "delta", 0.0)) if delta is None else delta

    def count(value: Any) -> np.ndarray:
        hits = np.zeros(len(event_list), dtype=np.int64)
        done = 0
        value = np.asarray(value)
        while done < trials:
            m = min(batch, trials - done)
            inputs = np.broadcast_to(value, (m, *value.shape)).copy()
            reports = mechanism.privatize(inputs, rng)
            for i, ev in enumerate(event_list):
                hits[i] += int(np.count_nonzero(ev(reports)))
            done += m
        return hits

    c1, c2 = count(v1), count(v2)
    per_test_alpha = alpha / (2 * len(event_list))
    best = AuditResult(0.0, claimed, 0, 0, 0, trials)
    for i in range(len(event_list)):
        for tp, fp in ((c1[i], c2[i]), (c2[i], c1[i])):
            e = empirical_epsilon(int(tp), int(fp), trials, per_test_alpha, delta)
            if e > best.epsilon_emp:
                best = AuditResult(e, claimed, i, int(tp), int(fp), trials)
    return best


def threshold_events(thresholds: Sequence[float], column: int | None = None) -> list[Event]:
    """Events ``report > c`` for numeric mechanisms (optionally on one column of vector reports)."""

    def make(c: float) -> Event:
        if column is None:
            return lambda r: np.asarray(r) > c
        return lambda r: np.asarray(r)[:, column] > c

    return [make(float(c)) for c in thresholds]


def equality_event(value: Any) -> Event:
    """Event ``report == value`` (GRR-style outputs)."""
    return lambda r: np.asarray(r) == value


# ------------------------------------------------------------------ float-structure audit (Mironov 2012)

#: A uniform double as numpy draws it: ``k·2^-53`` for an integer ``k ∈ [0, 2^53)``.
_UNIFORM_STEPS = 1 << 53

#: One branch of a double-releasing mechanism: ``release(x, u)``, non-decreasing in the uniform u for a fixed x.
Branch = Callable[[float, float], float]


def float_reachable(branches: Sequence[Branch], x: float, y: float) -> bool:
    """Exactly whether the double ``y`` can be released from input ``x``: for some branch and some uniform double
    ``u = k·2^-53``, ``branch(x, u) == y``. Each branch is monotone in u, so a binary search over k finds the
    smallest k with ``branch(x, u_k) ≥ y`` and the answer is whether it hits y (53 evaluations a branch)."""
    for branch in branches:
        lo, hi = 0, _UNIFORM_STEPS - 1
        if branch(x, hi / _UNIFORM_STEPS) < y or branch(x, 0.0) > y:
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if branch(x, mid / _UNIFORM_STEPS) < y:
                lo = mid + 1
            else:
                hi = mid
        if branch(x, lo / _UNIFORM_STEPS) == y:
            return True
    return False


@dataclass(frozen=True)
class ReleaseAudit:
    """Outcome of :func:`release_audit`: of ``trials`` outputs released from ``x1``, how many ``x2`` cannot produce
    (``distinguishing``, each a proof that the privacy loss of that output is infinite), and one of them."""

    trials: int
    distinguishing: int
    example: Any = None

    @property
    def passed(self) -> bool:
        return self.distinguishing == 0


def release_audit(outputs: Sequence[Any], reachable: Callable[[Any], bool]) -> ReleaseAudit:
    """Count the released ``outputs`` (drawn under one input) that ``reachable`` (the other input's exact support:
    :func:`float_reachable` for a double-releasing mechanism, a positive channel entry for a grid release) refuses."""
    bad = [y for y in outputs if not reachable(y)]
    return ReleaseAudit(len(outputs), len(bad), bad[0] if bad else None)


def grid_reachable(mechanism: Any, x: float) -> Callable[[Any], bool]:
    """The exact support of a grid-releasing numeric mechanism at input x: an index j is reachable iff it is an
    integer on the grid with ``P[j | x] > 0`` under the randomized rounding of x to its two neighbouring grid inputs
    (:meth:`protocols.numeric._grid.GridMechanism.channel_row`). A double is never reachable."""
    pos = (x + 1.0) * (mechanism.inputs - 1) / 2.0
    lo = min(int(math.floor(pos)), mechanism.inputs - 2)
    rows = [mechanism.channel_row(i) for i in {lo, lo + 1}]

    def reachable(j: Any) -> bool:
        if isinstance(j, (float, np.floating)) or not 0 <= int(j) < mechanism.grid:
            return False
        return any(row[int(j)] > 0 for row in rows)

    return reachable
