"""The common result of every distribution mechanism: histogram, CDF, quantiles, intervals, consistency.

A :class:`DistributionEstimate` holds, over a grid of D buckets with edges ``x_0 < x_1 < … < x_D``:

* ``histogram`` — the mechanism's raw estimate of the fraction of users in each bucket (unbiased for the flat,
  hierarchical and Haar mechanisms; Square Wave's EMS estimate is biased — ``unbiased`` says which);
* ``cdf`` — the raw estimate of ``F_j = P[X ≤ x_{j+1}]`` for j = 0..D-1 (the last one is the total, 1 for
  mechanisms that know it exactly). Range-query mechanisms estimate each prefix directly (its own range query),
  so ``cdf`` is *not* in general the cumulative sum of ``histogram``;
* ``histogram_variance`` / ``cdf_variance`` — per-user analytic variances (divide by n) where the mechanism has a
  formula, evaluated at plug-in frequencies (the raw estimate clipped to [0, 1]); None otherwise (Square Wave).

**Intervals** are normal approximations ``estimate ± z·sqrt(variance/n)`` (pointwise, not simultaneous), z the
standard normal quantile of the two-sided level (``statistics.NormalDist``: no scipy on this path).

**Consistency (documented post-processing).** The raw CDF need not be monotone nor lie in [0, 1].
:attr:`consistent_cdf` is the weighted isotonic regression of the raw prefix estimates ``F_0..F_{D-2}`` (weights
``1/variance`` when known, else equal; pool-adjacent-violators, O(D)), clipped to [0, 1] (clipping an isotonic
fit is the bounded isotonic fit), with ``F_{D-1} = 1`` fixed (every user is in some bucket).
:attr:`consistent_histogram` is its first difference: non-negative, summing to 1. Post-processing costs no
privacy but is biased near 0 and 1; the raw estimates stay available for unbiased work.

**Quantiles.** The consistent CDF is made continuous by linear interpolation inside each bucket (the values of a
bucket are taken as spread uniformly): through ``(x_0, 0)`` and ``(x_{j+1}, F_j)``. The q-quantile is its
generalised inverse ``inf{x : F(x) ≥ q}``. **Quantile intervals invert the CDF band**: with the pointwise band
``[F_j - z·s_j, F_j + z·s_j]`` (on the consistent CDF, clipped to [0, 1]) made monotone conservatively (the lower
curve by a running minimum from the right, the upper by a running maximum from the left, so no pointwise
interval shrinks), the interval for the q-quantile x* is **at bucket resolution**: from the last edge x_j with
``U_j < q`` to the first edge x_k with ``L_k ≥ q``. If the band covers F at those two edges, F(x_j) < q ≤ F(x_k),
so x_j < x* ≤ x_k whatever the values' shape inside the buckets: its coverage is at least the band's at those
edges, and close to 100 % when the band is narrower than the bucket's mass (the quantile is then known to the
bucket, no finer). ``interpolate=True`` inverts the linearly interpolated band, ``[U^{-1}(q), L^{-1}(q)]``: up to a
bucket narrower, but valid only if the values spread uniformly within each bucket — on a skewed metric whose
median sits in a steep bucket it under-covers (docs/generated/results.md, section 9, measures both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from protocols.base import confidence_interval, normal_half_width, normal_quantile

__all__ = ["DistributionEstimate", "isotonic_regression"]


def isotonic_regression(y: Any, w: Any = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of ``y`` (pool-adjacent-violators; weights > 0, default 1)."""
    y = np.asarray(y, dtype=float).reshape(-1)
    w = np.ones_like(y) if w is None else np.broadcast_to(np.asarray(w, dtype=float), y.shape)
    if y.size and (not np.all(np.isfinite(y)) or not np.all(w > 0) or not np.all(np.isfinite(w))):
        raise ValueError("isotonic regression needs finite values and finite positive weights")
    means: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist()):
        means.append(yi)
        weights.append(wi)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, s2 = means.pop(), weights.pop(), sizes.pop()
            tw = weights[-1] + w2
            means[-1] = (means[-1] * weights[-1] + m2 * w2) / tw
            weights[-1] = tw
            sizes[-1] += s2
    return np.repeat(np.asarray(means), np.asarray(sizes, dtype=np.int64))


def _generalised_inverse(edges: np.ndarray, F: np.ndarray, q: np.ndarray) -> np.ndarray:
    """inf{x : G(x) ≥ q} for the piecewise-linear non-decreasing G through (edges[i], F[i]), F[0] ≤ q ≤ F[-1]."""
    i = np.searchsorted(F, q, side="left")  # first point with F ≥ q
    i = np.clip(i, 1, F.size - 1)
    f0, f1 = F[i - 1], F[i]
    x0, x1 = edges[i - 1], edges[i]
    frac = np.where(f1 > f0, (q - f0) / np.where(f1 > f0, f1 - f0, 1.0), 0.0)
    out = x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0)
    return np.where(q <= F[0], edges[0], out)


@dataclass(frozen=True)
class DistributionEstimate:
    """See the module docstring. ``edges`` defaults to the unit grid ``j/D``; pass a grid's edges for raw units."""

    histogram: np.ndarray
    cdf: np.ndarray
    n: int
    method: str
    unbiased: bool
    histogram_variance: np.ndarray | None = None
    cdf_variance: np.ndarray | None = None
    level: float = 0.95
    edges: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        D = np.asarray(self.histogram).shape[0]
        if np.asarray(self.cdf).shape != (D,):
            raise ValueError("histogram and cdf must both have shape (D,)")
        if self.n <= 0:
            raise ValueError("n must be positive")
        normal_quantile(self.level)
        if self.edges is None:
            object.__setattr__(self, "edges", np.linspace(0.0, 1.0, D + 1))
        elif np.asarray(self.edges).shape != (D + 1,) or np.any(np.diff(self.edges) <= 0):
            raise ValueError(f"edges must be {D + 1} increasing values")

    @property
    def D(self) -> int:
        return int(np.asarray(self.histogram).shape[0])

    @property
    def z(self) -> float:
        return normal_quantile(self.level)

    def _interval(self, est: np.ndarray, var: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        if var is None:
            return None
        return confidence_interval(est, np.maximum(np.asarray(var, dtype=float), 0.0), self.n, self.level)

    def histogram_interval(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Pointwise normal interval of the raw histogram (None without an analytic variance)."""
        return self._interval(np.asarray(self.histogram, dtype=float), self.histogram_variance)

    def cdf_interval(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Pointwise normal interval of the raw CDF at the right bucket edges (None without a variance)."""
        return self._interval(np.asarray(self.cdf, dtype=float), self.cdf_variance)

    @cached_property
    def consistent_cdf(self) -> np.ndarray:
        """Monotone CDF in [0, 1] at the right edges, last value 1 (see the module docstring)."""
        raw = np.asarray(self.cdf, dtype=float)
        out = np.ones(self.D)
        if self.D > 1:
            w = None
            if self.cdf_variance is not None:
                w = 1.0 / np.maximum(np.asarray(self.cdf_variance, dtype=float)[:-1], 1e-12)
            out[:-1] = np.clip(isotonic_regression(raw[:-1], w), 0.0, 1.0)
        return out

    @cached_property
    def consistent_histogram(self) -> np.ndarray:
        """First difference of :attr:`consistent_cdf`: ≥ 0, sums to 1."""
        return np.diff(np.concatenate([[0.0], self.consistent_cdf]))

    def _curve(self, values: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], values])

    def quantile(self, q: Any) -> np.ndarray:
        """q-quantiles (q in (0, 1)) of the consistent, piecewise-linear CDF, in the units of ``edges``."""
        qa = _check_q(q)
        return _generalised_inverse(np.asarray(self.edges), self._curve(self.consistent_cdf), qa)

    def cdf_band(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Monotone pointwise band around :attr:`consistent_cdf` (right edges), or None without a variance."""
        if self.cdf_variance is None:
            return None
        half = normal_half_width(np.maximum(np.asarray(self.cdf_variance, dtype=float), 0.0), self.n, self.level)
        half[-1] = 0.0  # F at the upper bound is 1 by definition
        lower = np.clip(self.consistent_cdf - half, 0.0, 1.0)
        upper = np.clip(self.consistent_cdf + half, 0.0, 1.0)
        lower = np.minimum.accumulate(lower[::-1])[::-1]
        upper = np.maximum.accumulate(upper)
        return lower, upper

    def quantile_interval(self, q: Any, interpolate: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """The inverted CDF band at bucket resolution (module docstring): from the last edge where the upper
        curve is below q to the first edge where the lower curve reaches q. ``interpolate=True`` inverts the
        linearly interpolated band instead, ``[U^{-1}(q), L^{-1}(q)]`` (narrower; valid only if the values spread
        uniformly within each bucket). None without a variance."""
        band = self.cdf_band()
        if band is None:
            return None
        qa = _check_q(q)
        lower, upper = band
        edges = np.asarray(self.edges)
        if interpolate:
            return (_generalised_inverse(edges, self._curve(upper), qa),
                    _generalised_inverse(edges, self._curve(lower), qa))
        first_upper = np.searchsorted(self._curve(upper), qa, side="left")  # U(x_0) = 0 < q, so ≥ 1
        first_lower = np.searchsorted(self._curve(lower), qa, side="left")  # L(x_D) = 1 ≥ q, so ≤ D
        return edges[first_upper - 1], edges[np.minimum(first_lower, self.D)]


def _check_q(q: Any) -> np.ndarray:
    qa = np.asarray(q, dtype=float)
    if qa.size == 0 or not (np.all(qa > 0) and np.all(qa < 1)):
        raise ValueError("quantile levels must lie in (0, 1)")
    return qa
