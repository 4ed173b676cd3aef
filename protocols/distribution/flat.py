"""Flat baselines: bucketise the value and report the bucket with a frequency oracle (OUE or OLH) over D items.

Wraps :class:`protocols.frequency.OUE` / :class:`protocols.frequency.OLH` (Wang, Blocki, Li, Jha, USENIX Security
2017); nothing is re-implemented. Privacy is exactly the oracle's ε. A range [a, b] is the sum of the ℓ = b-a+1
unbiased bucket estimates, so it is unbiased, with per-user variance (fixed population, true range fraction f)

    Var = (f·p(1-p) + (ℓ - f)·q(1-q)) / (p - q)²

(for a user in the range one supported item has probability p, the other ℓ-1 probability q; for a user outside,
all ℓ have probability q). For OUE this is exact: the bits are independent given the value. For OLH, q = 1/g
and the formula takes the supports of distinct items by a non-holder as independent; that holds for pairs (the
hash family is 2-universal) but not for larger sets (``((a·v+b) mod P) mod g`` is not 3-wise independent), so for
ℓ ≥ 2 the OLH range variance is the idealised formula of the literature (Cormode, Kulkarni, Srivastava 2019) and
an approximation here; ℓ = 1 is exact. For a holder of v, the supports of buckets i, j ≠ v are positively
correlated, and a long prefix's variance exceeds the formula's by a factor that grows with ε (several-fold for
63 of 64 buckets at ε = 4): normal intervals from the formula under-cover.

**Flat OLH's CDF variance is therefore estimated from the reports** (the wire format and the hash unchanged).
User u's contribution to the prefix estimate ``F̂(m) = Σ_{j≤m} f̂_j`` is ``x_u(m) = (S_u(m) − q(m+1))/(p − q)``,
``S_u(m)`` the number of buckets ≤ m its report supports; users are independent and ``E x_u(m) = 1[v_u ≤ m]``.
With the population variance ``s²(m) = (Q_m/n − (Σ_{j≤m} C_j/n)²)/(p − q)²`` of the x_u (``Q_m = Σ_u S_u(m)²``,
``C_j`` the support counts: additive statistics, :meth:`FlatOracle.statistics_moments`),
``E[s²] = (n−1)/n·V + F(1−F)`` and ``E[F̂(1−F̂)] = F(1−F) − V/n`` for the per-user variance
``V = (1/n)Σ_u Var x_u(m)`` of a fixed population, so

    V̂(m) = s²(m) − F̂(m)(1 − F̂(m))

is exactly unbiased (:func:`prefix_moment_variance`; floored at 0), whatever the hash family's higher-order
dependence. Aggregates without ``Q`` (kept before it existed) fall back to the formula. The histogram keeps the
formula (exact for ℓ = 1), and so does flat OUE, whose formula is exact (``Q`` would only add noise).
``tests/protocols/distribution/test_distribution_stats.py`` measures the gap and the coverage of both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols import catalogue
from protocols.base import check_epsilon, check_int
from protocols.catalogue import Role
from protocols.distribution.base import AnalyticDistribution, check_range
from protocols.distribution.grid import MAX_BUCKETS

__all__ = ["FlatOracle", "ORACLES", "check_oracle", "oracle_range_variance", "prefix_moment_variance"]

#: The bucket/level oracles offered: the catalogue's distribution oracles (OUE and OLH), by wire name.
ORACLES = catalogue.names(Role.DISTRIBUTION_ORACLE)


def check_oracle(oracle: Any) -> str:
    if oracle not in ORACLES:
        raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    return str(oracle)


def make_oracle(oracle: str, epsilon: float, k: int) -> Any:
    """The catalogue's oracle ``oracle`` over [0, k) at ε."""
    return catalogue.build(check_oracle(oracle), epsilon=epsilon, k=k)


def oracle_range_variance(p: float, q: float, length: Any, f: Any) -> Any:
    """``(f·p(1-p) + (ℓ - f)·q(1-q))/(p - q)²``: per-user variance of the sum of ℓ unbiased item estimates."""
    f = np.asarray(f, dtype=float)
    return (f * p * (1 - p) + (np.asarray(length, dtype=float) - f) * q * (1 - q)) / (p - q) ** 2


def prefix_moment_variance(total: Any, squares: Any, n: int, p: float, q: float, cdf: Any) -> np.ndarray:
    """``V̂(m) = (Q_m/n − (Σ_{j≤m} C_j/n)²)/(p − q)² − F̂(m)(1 − F̂(m))`` (floored at 0): the unbiased per-user
    variance of each prefix estimate F̂(m) of a flat oracle from its support counts C, ``Q_m = Σ_u S_u(m)²`` and
    the raw prefix estimates ``cdf`` (module docstring)."""
    mean = np.cumsum(np.asarray(total, dtype=float)) / n
    spread = (np.asarray(squares, dtype=float) / n - mean**2) / (p - q) ** 2
    cdf = np.asarray(cdf, dtype=float)
    return np.maximum(spread - cdf * (1.0 - cdf), 0.0)


class FlatOracle(AnalyticDistribution):
    """The bucket reported with OUE or OLH over [0, D); ranges are sums. See the module docstring."""

    def __init__(self, epsilon: float, D: int, oracle: str = "oue") -> None:
        self.epsilon = check_epsilon(epsilon)
        self.D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
        self.oracle_name = check_oracle(oracle)
        self.oracle = make_oracle(self.oracle_name, self.epsilon, self.D)
        self.epsilon = self.oracle.epsilon
        self.p, self.q = self.oracle.p, self.oracle.q
        self.method = f"flat_{self.oracle_name}"

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "oracle": self.oracle_name}

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """The oracle's reports: OUE (n, D) uint8 bits; OLH (n, 2) int64 [seed, y]."""
        return self.oracle.privatize(values, rng)

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact P[report | bucket] (OLH: given the public seed) — the oracle's own."""
        return self.oracle.likelihood(reports, value)

    def estimate(self, reports: Any) -> np.ndarray:
        return np.asarray(self.oracle.estimate(reports), dtype=float)

    def estimate_counts(self, counts: Any, n: int) -> np.ndarray:
        """From the oracle's sufficient statistics (support counts, n)."""
        return np.asarray(self.oracle.estimate_counts(counts, n), dtype=float)

    def n_reports(self, reports: Any) -> int:
        return self.oracle.n_reports(reports)

    def statistics_total(self, reports: Any) -> np.ndarray:
        """The oracle's support counts over the D buckets."""
        return np.asarray(self.oracle.support_counts(reports), dtype=float)

    def estimate_statistics(self, total: Any, n: int) -> np.ndarray:
        return self.estimate_counts(total, n)

    @property
    def squares_size(self) -> int:
        """OLH keeps ``Q_m`` for m in [0, D); OUE nothing (its formula is exact)."""
        return 0 if self.oracle.independent_supports else self.D

    def statistics_moments(self, reports: Any) -> tuple[np.ndarray, np.ndarray]:
        """OLH: the support counts and ``Q_m = Σ_u S_u(m)²`` (one residue walk over the D buckets,
        :meth:`protocols.frequency.OLH.support_prefix_moments`); OUE: the support counts alone."""
        if self.oracle.independent_supports:
            return super().statistics_moments(reports)
        counts, squares = self.oracle.support_prefix_moments(reports)
        return np.asarray(counts, dtype=float), np.asarray(squares, dtype=float)

    def distribution(self, reports: Any, level: float = 0.95, edges: Any = None) -> Any:
        """From :meth:`statistics_moments` of the reports: the same estimate the coordinator makes."""
        total, squares = self.statistics_moments(reports)
        return self.distribution_from_statistics(total, self.n_reports(reports), level, edges, squares)

    def statistics_variances(self, hist: np.ndarray, cdf: np.ndarray, total: np.ndarray, squares: Any,
                             n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The formula's (plug-in) variances, the CDF's replaced by :func:`prefix_moment_variance` when the
        statistics hold ``Q`` (module docstring)."""
        hv, cv = self.plugin_variances(hist, cdf)
        if squares is not None and np.size(squares) == self.D and n > 1:
            cv = prefix_moment_variance(total, squares, n, self.p, self.q, cdf)
        return hv, cv

    def range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        a, b = check_range(a, b, self.D)
        return oracle_range_variance(self.p, self.q, b - a + 1, f)
