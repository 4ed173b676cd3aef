"""The Square Wave mechanism with EMS reconstruction.

Li, Wang, Lopuhaä-Zwakenberg, Li, Škorić, Li, "Estimating numerical distributions under local differential
privacy", SIGMOD 2020.

**Client** (input u ∈ [0, 1], the value scaled by the public bounds). With

    b = (ε·e^ε − e^ε + 1) / (2·e^ε·(e^ε − 1 − ε)),   p = e^ε / (2b·e^ε + 1),   q = 1 / (2b·e^ε + 1),

the output ũ ∈ [−b, 1 + b] has density p on the window [u − b, u + b] and q elsewhere (2b·p + 1·q = 1). Sampled
exactly: w.p. 2b·p uniform on the window, otherwise uniform on the rest of [−b, 1+b], which has length 1 and is
reached as ``−b + w`` for w < u and ``u + b + (w − u)`` for w ≥ u, w ~ U[0, 1).

**Privacy (exact).** Every output's density is p or q under every input, so the worst-case density ratio is
p/q = e^ε: exactly ε-LDP (:meth:`SquareWave.likelihood`). b → 0 as ε grows.

**Server: EMS** (expectation–maximisation with smoothing; Silverman, Jones, Wilson, Nychka, JRSS-B 1990, as used by
Li et al.). EMS runs on a fine grid of ``r`` input buckets over [0, 1] and r output buckets over [−b, 1 + b]
(``resolution`` r, default the smallest multiple of D that is ≥ 256: smoothing acts per fine bucket, and on a
coarse grid the (1, 2, 1) kernel over-smooths — at D = 32, ε = 1 it doubles the CDF error), then sums the fine
histogram onto the D buckets. The transition matrix ``M[j, i] = P[ũ ∈ out_j | u uniform in fine bucket i]`` is (computed exactly: the window overlap is
piecewise linear in u, integrated by the trapezoid rule on its breakpoints). From the output-bucket counts c,
starting from the uniform histogram x, each iteration does

* E+M: ``x_i ← x_i · Σ_j M[j, i]·c_j / (n·(M x)_j)`` (the EM step for the multinomial mixture);
* S (smoothing): convolve x with the binomial kernel (1, 2, 1)/4 (at the two ends the truncated kernel is
  renormalised: (2, 1)/3), then renormalise x to sum 1;

until the log-likelihood ``Σ_j c_j·log (M x)_j`` improves by less than ``tol`` (default ``1e-3·e^ε``) or
``max_iter`` iterations. The result is a proper distribution over the D buckets.

**Bias.** EMS is a penalised (smoothed) maximum-likelihood estimator: it is **biased** (smoothing flattens sharp
features; non-negativity pulls up empty buckets) and has **no closed-form variance**, so it is a plain
:class:`~protocols.distribution.base.DistributionMechanism` (not an ``AnalyticDistribution``: no ``range_variance``,
``variance`` or ``bias``; ``unbiased`` is False), its estimates carry no intervals, and
the ``auto`` policy excludes it (its accuracy is measured instead:
``tests/protocols/distribution/test_distribution_stats.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int
from protocols.distribution.base import DistributionMechanism
from protocols.distribution.grid import MAX_BUCKETS

__all__ = ["SquareWave", "square_wave_parameters", "ems"]

#: Square Wave's b is computed from e^ε; beyond this ε the window is narrower than float resolution matters.
MAX_EPSILON = 20.0


def square_wave_parameters(epsilon: float) -> tuple[float, float, float]:
    """(b, p, q) for ε (see the module docstring); ε − e^{-ε}-stable forms via expm1."""
    eps = check_epsilon(epsilon)
    e = math.exp(eps)
    b = (eps * e - e + 1.0) / (2.0 * e * (math.expm1(eps) - eps))
    p = e / (2.0 * b * e + 1.0)
    q = 1.0 / (2.0 * b * e + 1.0)
    return b, p, q


def _overlap_integral(x0: np.ndarray, x1: np.ndarray, c0: np.ndarray, c1: np.ndarray, b: float) -> np.ndarray:
    """∫_{x0}^{x1} |[c0, c1] ∩ [u − b, u + b]| du, exactly (trapezoid on the breakpoints), broadcasting."""
    x0, x1, c0, c1 = np.broadcast_arrays(x0, x1, c0, c1)
    pts = np.stack([x0, x1, c0 - b, c1 - b, c0 + b, c1 + b], axis=-1)
    pts = np.sort(np.clip(pts, x0[..., None], x1[..., None]), axis=-1)
    g = np.clip(np.minimum(c1[..., None], pts + b) - np.maximum(c0[..., None], pts - b), 0.0, None)
    return np.sum((pts[..., 1:] - pts[..., :-1]) * (g[..., 1:] + g[..., :-1]) / 2.0, axis=-1)


def _smooth(x: np.ndarray) -> np.ndarray:
    """Binomial (1, 2, 1)/4 smoothing, truncated kernel renormalised at the ends."""
    if x.size < 2:
        return x.copy()
    out = np.empty_like(x)
    out[1:-1] = (x[:-2] + 2.0 * x[1:-1] + x[2:]) / 4.0
    out[0] = (2.0 * x[0] + x[1]) / 3.0
    out[-1] = (2.0 * x[-1] + x[-2]) / 3.0
    return out


def ems(M: np.ndarray, counts: np.ndarray, *, smoothing: bool = True, tol: float = 1e-3,
        max_iter: int = 10_000) -> tuple[np.ndarray, int]:
    """EM (with binomial smoothing when ``smoothing``) for the histogram x with ``P[out j] = (M x)_j``.

    Returns (x, iterations). Stops when the log-likelihood improves by less than ``tol``.
    """
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n <= 0:
        raise ValueError("cannot estimate from zero reports")
    x = np.full(M.shape[1], 1.0 / M.shape[1])
    old = -np.inf
    it = 0
    for it in range(1, max_iter + 1):
        px = M @ x
        ratio = np.divide(counts, px, out=np.zeros_like(counts), where=px > 0)
        x = x * (M.T @ ratio) / n
        if smoothing:
            x = _smooth(x)
        x = x / x.sum()
        px = M @ x
        ll = float(np.sum(counts[counts > 0] * np.log(px[counts > 0])))
        if abs(ll - old) < tol:
            break
        old = ll
    return x, it


class SquareWave(DistributionMechanism):
    """Square Wave over [0, 1] with EMS onto D buckets (see the module docstring). Reports: (n,) float64."""

    bucketised = False
    method = "square_wave"

    def __init__(self, epsilon: float, D: int, *, resolution: int | None = None, smoothing: bool = True,
                 tol: float | None = None, max_iter: int = 10_000) -> None:
        self.epsilon = check_epsilon(epsilon)
        if self.epsilon > MAX_EPSILON:
            raise ValueError(f"epsilon must be <= {MAX_EPSILON:g} for Square Wave, got {epsilon!r}")
        self.D = check_int(D, "D", minimum=2, maximum=MAX_BUCKETS)
        if resolution is None:
            resolution = self.D * -(-256 // self.D)
        self.resolution = check_int(resolution, "resolution", minimum=self.D, maximum=MAX_BUCKETS)
        if self.resolution % self.D:
            raise ValueError(f"resolution must be a multiple of D={self.D}, got {self.resolution}")
        if not isinstance(smoothing, bool):
            raise ValueError(f"smoothing must be True or False, got {smoothing!r}")
        self.smoothing = smoothing
        self.tol = 1e-3 * math.exp(self.epsilon) if tol is None else check_epsilon(tol, "tol")
        self.max_iter = check_int(max_iter, "max_iter", minimum=1)
        self.b, self.p, self.q = square_wave_parameters(self.epsilon)
        self._matrix: np.ndarray | None = None

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "resolution": self.resolution}

    # ------------------------------------------------------------------ client
    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Unit values u ∈ [0, 1] (one per user) → outputs in [−b, 1 + b]."""
        u = np.asarray(values, dtype=float).reshape(-1)
        if u.size and not (u.min() >= 0.0 and u.max() <= 1.0):
            raise ValueError("Square Wave inputs must lie in [0, 1] (scale by the public bounds first)")
        n = u.size
        near = rng.random(n) < 2.0 * self.b * self.p
        window = u - self.b + 2.0 * self.b * rng.random(n)
        w = rng.random(n)
        far = np.where(w < u, w - self.b, w + self.b)  # −b + w, or u + b + (w − u) = w + b
        return np.where(near, window, far)

    def privatize_unit(self, u: Any, rng: np.random.Generator) -> np.ndarray:
        return self.privatize(u, rng)

    def likelihood(self, outputs: Any, value: float) -> np.ndarray:
        """Exact output density at each output under input ``value``: p on [value − b, value + b], q elsewhere
        on [−b, 1 + b], 0 outside."""
        y = np.asarray(outputs, dtype=float)
        v = float(value)
        if not 0.0 <= v <= 1.0:
            raise ValueError("value must lie in [0, 1]")
        inside = (y >= -self.b) & (y <= 1.0 + self.b)
        return np.where(inside, np.where(np.abs(y - v) <= self.b, self.p, self.q), 0.0)

    # ------------------------------------------------------------------ server
    @property
    def transition_matrix(self) -> np.ndarray:
        """M (r × r): probability of output bucket j given an input uniform in fine bucket i (columns sum to 1)."""
        if self._matrix is None:
            x = np.linspace(0.0, 1.0, self.resolution + 1)
            c = np.linspace(-self.b, 1.0 + self.b, self.resolution + 1)
            x0, x1 = x[None, :-1], x[None, 1:]
            c0, c1 = c[:-1, None], c[1:, None]
            overlap = _overlap_integral(x0, x1, c0, c1, self.b) / (x1 - x0)
            self._matrix = self.q * (c1 - c0) + (self.p - self.q) * overlap
        return self._matrix

    def output_counts(self, reports: Any) -> np.ndarray:
        """Sufficient statistic: counts of the outputs in the r output buckets (additive over reports)."""
        y = np.asarray(reports, dtype=float).reshape(-1)
        if y.size and (not np.all(np.isfinite(y)) or y.min() < -self.b - 1e-12 or y.max() > 1 + self.b + 1e-12):
            raise ValueError(f"Square Wave reports must lie in [-b, 1+b] = [{-self.b:.6g}, {1 + self.b:.6g}]")
        idx = np.floor((y + self.b) / (1.0 + 2.0 * self.b) * self.resolution).astype(np.int64)
        return np.bincount(np.clip(idx, 0, self.resolution - 1), minlength=self.resolution).astype(float)

    def estimate_counts(self, counts: Any) -> np.ndarray:
        x, _ = ems(self.transition_matrix, counts, smoothing=self.smoothing, tol=self.tol, max_iter=self.max_iter)
        return x.reshape(self.D, -1).sum(axis=1)

    def statistics_total(self, reports: Any) -> np.ndarray:
        """The histogram of the outputs on the r output buckets (:meth:`output_counts`)."""
        return self.output_counts(reports)

    @property
    def statistics_size(self) -> int:
        return self.resolution

    def estimate_statistics(self, total: Any, n: int) -> np.ndarray:
        return self.estimate_counts(total)

    def estimate(self, reports: Any) -> np.ndarray:
        """The EMS histogram over the D buckets (a distribution; biased — see the module docstring)."""
        return self.estimate_counts(self.output_counts(reports))
