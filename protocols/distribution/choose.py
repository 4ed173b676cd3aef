"""``auto`` for distribution streams: pick the mechanism with the least analytic variance for the asked query.

Candidates are the mechanisms with a closed-form variance: the flat OUE and OLH baselines, hierarchical
intervals with OUE or OLH at every branching B = 2..min(16, D) (:func:`optimal_branching`), and HaarHRR.
**Square Wave is excluded**: its EMS estimate is biased and has no closed-form variance, so it cannot be ranked by formula (use it
by name; its measured accuracy is in the statistical tests).

Queries (per-user variance averaged over the query's ranges, each range [a, b] of ℓ buckets evaluated at the
uniform-population fraction f = ℓ/D; at most 64 evenly spaced ranges are averaged):

* ``"range"`` of ``length`` ℓ: all ranges [a, a+ℓ−1];
* ``"cdf"`` and ``"quantile"``: the prefixes [0, j], j = 0..D−2 (a quantile's error is the CDF's error near it,
  divided by the local density, so the same ranking applies);
* ``"histogram"``: the single buckets [j, j].

Hierarchical intervals are ranked by the variance of their *consistent* estimate (what they return; exact to
first order, :meth:`~protocols.distribution.HierarchicalIntervals.query_variances`), not the raw formula. Flat
OLH is a candidate only for single-bucket queries (``"histogram"``, ranges of length 1): for ℓ ≥ 2 buckets its
range variance formula is idealised and too small (its hash family is not 3-wise independent; see
:mod:`protocols.distribution.flat`), so it is not ranked by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int
from protocols.distribution.base import AnalyticDistribution, DistributionMechanism
from protocols.distribution.flat import ORACLES, FlatOracle, check_oracle
from protocols.distribution.grid import MAX_BUCKETS
from protocols.distribution.haar_range import HaarDistribution
from protocols.distribution.hierarchical import HierarchicalIntervals

__all__ = ["QUERIES", "query_ranges", "query_variance", "optimal_branching", "choose_distribution_mechanism",
           "DistributionChoice"]

QUERIES = ("range", "cdf", "quantile", "histogram")
BRANCHINGS = tuple(range(2, 17))
_MAX_RANGES = 64


def query_ranges(D: int, query: str, length: int | None = None) -> list[tuple[int, int]]:
    """The ranges a query averages over (see the module docstring)."""
    if query not in QUERIES:
        raise ValueError(f"query must be one of {QUERIES}, got {query!r}")
    if query == "range":
        if length is None:
            raise ValueError('query="range" needs a length')
        ell = check_int(length, "length", minimum=1, maximum=D)
        starts = np.unique(np.linspace(0, D - ell, min(_MAX_RANGES, D - ell + 1)).round().astype(int))
        return [(int(a), int(a) + ell - 1) for a in starts]
    if length is not None:
        raise ValueError(f"length applies only to query='range', not {query!r}")
    if query == "histogram":
        ends = np.unique(np.linspace(0, D - 1, min(_MAX_RANGES, D)).round().astype(int))
        return [(int(j), int(j)) for j in ends]
    ends = np.unique(np.linspace(0, D - 2, min(_MAX_RANGES, D - 1)).round().astype(int))
    return [(0, int(j)) for j in ends]


def query_variance(mech: AnalyticDistribution, query: str, length: int | None = None) -> float:
    """Mean per-user analytic variance of ``mech`` over the query's ranges (uniform-population fractions)."""
    if not isinstance(mech, AnalyticDistribution):
        raise ValueError(f"{mech.method} has no closed-form variance")
    ranges = query_ranges(mech.D, query, length)
    return float(np.mean([mech.range_variance(a, b, (b - a + 1) / mech.D) for a, b in ranges]))


def optimal_branching(epsilon: float, D: int, oracle: str = "oue", query: str = "range",
                      length: int | None = None) -> int:
    """The branching B in 2..16 whose hierarchical intervals have the least :func:`query_variance`.

    For ``query="range"`` without a length, the average over lengths 1, 2, 4, …, D/2 is used. (CKS 2019 derive
    B ≈ 4–5 for OLH from the leading term; the exact formula here can differ by one step.)
    """
    check_oracle(oracle)
    lengths = [length] if (query != "range" or length is not None) else [1 << i for i in range(max(1, (D - 1).bit_length()))
                                                                          if (1 << i) <= max(1, D // 2)]

    def cost(B: int) -> float:
        mech = HierarchicalIntervals(epsilon, D, B, oracle)
        return float(np.mean([query_variance(mech, query, ell if query == "range" else None) for ell in lengths]))

    return min(BRANCHINGS, key=cost)


@dataclass(frozen=True)
class DistributionChoice:
    """What ``auto`` chose: the built mechanism, and every candidate's per-user query variance (divide by n)."""

    mechanism: DistributionMechanism
    variances: dict[str, float]

    @property
    def method(self) -> str:
        return self.mechanism.method


def choose_distribution_mechanism(epsilon: float, D: int, query: str = "cdf", length: int | None = None
                                  ) -> DistributionChoice:
    """The candidate with the least analytic variance for ``query`` (module docstring). Square Wave excluded."""
    eps = check_epsilon(epsilon)
    D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
    single_buckets = all(a == b for a, b in query_ranges(D, query, length))  # also validates query/length
    # a flat oracle whose supports are not independent (OLH) is ranked only for single buckets: for sums of several
    # buckets its formula is idealised (too small), and its real variance is known only from the reports
    flat = [FlatOracle(eps, D, o) for o in ORACLES]
    candidates: list[DistributionMechanism] = [m for m in flat if single_buckets or m.oracle.independent_supports]
    # B = D is one level (the flat oracle) made consistent with the known total: a distinct candidate, which
    # optimal_branching also considers
    candidates += [HierarchicalIntervals(eps, D, B, o) for o in ORACLES for B in BRANCHINGS if B <= D]
    candidates.append(HaarDistribution(eps, D))
    variances = {m.method: query_variance(m, query, length) for m in candidates}
    best = min(candidates, key=lambda m: variances[m.method])
    return DistributionChoice(best, variances)
