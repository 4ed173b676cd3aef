"""The interface shared by the distribution mechanisms (a refinement of :class:`protocols.base.Mechanism`).

A distribution mechanism reports one numeric value per user on a public grid of D buckets
(:class:`~protocols.distribution.grid.BucketGrid`) and estimates, on the server, the histogram over the buckets
and range/prefix fractions. Inputs to ``privatize`` are bucket indices in [0, D) for the bucketised mechanisms
(flat, hierarchical, Haar); Square Wave takes the unit value u ∈ [0, 1] itself. ``privatize_unit(u, rng)``
accepts u ∈ [0, 1] for every mechanism (the bucketised ones bucketise first), so a stream can drive any of them
the same way. Device-side paths (``privatize``, ``privatize_unit``) use numpy only.

Variances follow the library convention: *per user* (divide by n), for a fixed population of values, as a
function of the true fraction(s) involved. The mechanisms with a closed form derive from
:class:`AnalyticDistribution`, whose ``range_variance(a, b, f)`` is the per-user variance of the range estimate of
the inclusive bucket range [a, b] when a fraction f of users lies in it; Square Wave + EMS (biased, no closed form)
derives from :class:`DistributionMechanism` alone and has no ``range_variance``, ``variance`` or ``bias``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from protocols.base import AnalyticMechanism, Mechanism, check_int
from protocols.distribution.grid import unit_to_bucket
from protocols.distribution.result import DistributionEstimate

__all__ = ["DistributionMechanism", "AnalyticDistribution", "check_range"]


def check_range(a: Any, b: Any, D: int) -> tuple[int, int]:
    """An inclusive bucket range ``0 ≤ a ≤ b < D`` (ValueError otherwise)."""
    a = check_int(a, "a", minimum=0, maximum=D - 1)
    b = check_int(b, "b", minimum=0, maximum=D - 1)
    if a > b:
        raise ValueError(f"range [a, b] needs a <= b, got a={a}, b={b}")
    return a, b


class DistributionMechanism(Mechanism):
    """ε-LDP histogram / range / CDF estimation over D ordered buckets."""

    D: int
    #: The histogram and range estimates are unbiased (True for :class:`AnalyticDistribution`).
    unbiased: bool = False
    #: The input is bucketised before the randomizer (False for Square Wave, which takes the unit value itself).
    bucketised: bool = True
    #: Short method name used in results and by :func:`~protocols.distribution.choose.choose_distribution_mechanism`.
    method: str = ""

    # ------------------------------------------------------------------ client
    def privatize_unit(self, u: Any, rng: np.random.Generator) -> np.ndarray:
        """Privatize unit values u ∈ [0, 1] (bucketised on the public grid first)."""
        return self.privatize(unit_to_bucket(u, self.D), rng)

    # ------------------------------------------------------------------ server
    @abstractmethod
    def estimate(self, reports: Any) -> np.ndarray:
        """Estimated fraction of users in each of the D buckets."""

    def range_query(self, reports: Any, a: int, b: int) -> float:
        """Estimated fraction of users in buckets [a, b]: the sum of the histogram (flat, Haar, Square Wave)."""
        a, b = check_range(a, b, self.D)
        return float(np.sum(self.estimate(reports)[a : b + 1]))

    def prefix_estimates(self, reports: Any) -> np.ndarray:
        """Raw CDF estimates ``F̂_j`` = range [0, j], j = 0..D-1 (default: cumulative sum of the histogram)."""
        return np.cumsum(self.estimate(reports))

    def n_reports(self, reports: Any) -> int:
        return int(np.asarray(reports).shape[0])

    def distribution(self, reports: Any, level: float = 0.95, edges: Any = None) -> DistributionEstimate:
        """Histogram, CDF (at right bucket edges), their variances and the derived quantiles
        (:class:`DistributionEstimate`): the plug-in analytic variances (each evaluated at the raw estimate clipped
        to [0, 1]) unless the mechanism estimates them from its statistics (:meth:`statistics_variances`)."""
        return self._distribution(self.estimate(reports), self.prefix_estimates(reports), self.n_reports(reports),
                                  level, edges)

    # ------------------------------------------------------------------ sufficient statistics (catalogue)
    @abstractmethod
    def statistics_total(self, reports: Any) -> np.ndarray:
        """The additive sufficient statistic of report rows (a fixed-length float vector; sums over disjoint sets
        of rows add). ``n`` is :meth:`n_reports`."""

    def statistics_moments(self, reports: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(total, squares)``: :meth:`statistics_total` and the mechanism's additive second-moment statistic
        (``Statistics.squares``; flat OLH: :meth:`FlatOracle.statistics_moments
        <protocols.distribution.flat.FlatOracle.statistics_moments>`). Default: none (empty)."""
        return np.asarray(self.statistics_total(reports), dtype=float), np.zeros(0)

    @property
    def statistics_size(self) -> int:
        """Length of :meth:`statistics_total` (default: D)."""
        return self.D

    @property
    def squares_size(self) -> int:
        """Length of the second-moment statistic of :meth:`statistics_moments` (default: 0, none)."""
        return 0

    @abstractmethod
    def estimate_statistics(self, total: Any, n: int) -> np.ndarray:
        """The histogram :meth:`estimate` gives, from ``statistics_total`` of the rows and their number alone."""

    def prefix_from_statistics(self, total: Any, n: int) -> np.ndarray:
        """The raw CDF :meth:`prefix_estimates` gives, from the statistics alone (default: cumulative sum)."""
        return np.cumsum(self.estimate_statistics(total, n))

    def distribution_from_statistics(self, total: Any, n: int, level: float = 0.95, edges: Any = None,
                                     squares: Any = None) -> DistributionEstimate:
        """:meth:`distribution` from the sufficient statistics alone (what the coordinator keeps at ingest);
        ``squares`` the second-moment statistic where the mechanism keeps one (None or empty — e.g. aggregates kept
        before it existed — : the analytic formula)."""
        hist = np.asarray(self.estimate_statistics(total, n), dtype=float)
        cdf = np.asarray(self.prefix_from_statistics(total, n), dtype=float)
        variances = self.statistics_variances(hist, cdf, np.asarray(total, dtype=float), squares, int(n))
        return self._distribution(hist, cdf, int(n), level, edges, variances)

    def statistics_variances(self, hist: np.ndarray, cdf: np.ndarray, total: np.ndarray, squares: Any,
                             n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per-user (histogram, CDF) variances from the statistics; default :meth:`plugin_variances`."""
        return self.plugin_variances(hist, cdf)

    def _distribution(self, hist: Any, cdf: Any, n: int, level: float, edges: Any,
                      variances: tuple[np.ndarray | None, np.ndarray | None] | None = None) -> DistributionEstimate:
        hist = np.asarray(hist, dtype=float)
        cdf = np.asarray(cdf, dtype=float)
        hv, cv = self.plugin_variances(hist, cdf) if variances is None else variances
        return DistributionEstimate(hist, cdf, n, self.method, self.unbiased, hv, cv, level,
                                    None if edges is None else np.asarray(edges, dtype=float))

    def plugin_variances(self, hist: np.ndarray, cdf: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per-user variances of the histogram and the CDF: none without a closed form."""
        return None, None

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "D": self.D}


class AnalyticDistribution(DistributionMechanism, AnalyticMechanism):
    """A distribution mechanism with unbiased histogram and range estimates and a closed-form range variance
    (flat, hierarchical, Haar). Only these get normal intervals and are candidates of ``auto``."""

    unbiased = True

    @abstractmethod
    def range_variance(self, a: int, b: int, f: Any = 0.0) -> Any:
        """Per-user variance of the range estimate of [a, b] at true range fraction f (divide by n)."""

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of one bucket's estimate at true bucket fraction f (the same for every bucket)."""
        return self.range_variance(0, 0, f)

    def plugin_variances(self, hist: np.ndarray, cdf: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Per-user variances of each bucket's and each prefix's estimate at plug-in fractions (the raw estimate
        clipped to [0, 1]); mechanisms whose variance depends on the whole histogram override this."""
        hv = np.array([self.range_variance(j, j, float(np.clip(hist[j], 0, 1))) for j in range(self.D)])
        cv = np.array([self.range_variance(0, j, float(np.clip(cdf[j], 0, 1))) for j in range(self.D)])
        return hv, cv
