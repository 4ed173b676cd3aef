"""Generalized randomized response (GRR, a.k.a. direct encoding / k-RR).

Wang, Blocki, Li, Jha, "Locally differentially private protocols for frequency estimation", USENIX Security 2017.
A user holding ``x ∈ [0, k)`` reports ``x`` with probability ``p = e^ε/(e^ε+k-1)`` and each other value with
probability ``q = 1/(e^ε+k-1)``; the worst-case likelihood ratio is ``p/q = e^ε`` exactly. A report supports only
its own value, so ``C_v`` is the histogram of the reports and ``Var[f̂_v] = (q(1-q) + f(p-q)(1-p-q))/(p-q)²`` per
user, i.e. ``(e^ε+k-2)/(e^ε-1)²`` at ``f = 0`` (SPEC §3.8).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_category, check_int
from protocols.frequency._common import keep_probability, oracle_epsilon, report_vector, user_values

__all__ = ["GRR", "grr_perturb", "grr_perturb_one"]


def grr_perturb(values: np.ndarray, k: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Keep each value in ``[0, k)`` w.p. ``p``, else replace it by a uniform *other* value (vectorised).

    ``(x + 1 + U{0..k-2}) mod k`` is uniform over the k-1 values different from x, so every other value has
    probability ``(1-p)/(k-1)``.
    """
    n = values.shape[0]
    keep = rng.random(n) < p
    other = (values + 1 + rng.integers(0, k - 1, size=n)) % k
    return np.where(keep, values, other)


def grr_perturb_one(value: int, k: int, p: float, rng: np.random.Generator) -> int:
    """:func:`grr_perturb` of one value: the same draws in the same order (a uniform, then the other value's
    offset, drawn even when the value is kept)."""
    keep = rng.random() < p
    other = (value + 1 + int(rng.integers(0, k - 1))) % k
    return value if keep else other


class GRR(FrequencyOracle):
    """Generalized randomized response over ``[0, k)``; reports are int64 values in ``[0, k)``."""

    def __init__(self, epsilon: float, k: int) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2, maximum=1 << 62)  # x + 1 + U{0..k-2} stays below 2^63 (int64)
        self.p, self.q = keep_probability(self.epsilon, self.k - 1)

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        x = user_values(values, self.k)
        return grr_perturb(x, self.k, self.p, rng)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> int:
        return grr_perturb_one(check_category(value, self.k), self.k, self.p, rng)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        y = report_vector(reports, self.k)
        return np.bincount(y, minlength=self.k).astype(np.int64)

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[privatize(value) = report]`` for each report: p if ``report == value`` else q."""
        y = report_vector(reports, self.k)
        v = int(user_values(value, self.k)[0])
        return np.where(y == v, self.p, self.q)
