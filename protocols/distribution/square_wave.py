"""The Square Wave mechanism with EMS reconstruction.

Li, Wang, Lopuhaä-Zwakenberg, Li, Škorić, Li, "Estimating numerical distributions under local differential
privacy", SIGMOD 2020.

**Client** (input u ∈ [0, 1], the value scaled by the public bounds). With

    b = (ε·e^ε − e^ε + 1) / (2·e^ε·(e^ε − 1 − ε)),   p = e^ε / (2b·e^ε + 1),   q = 1 / (2b·e^ε + 1),

the output ũ ∈ [−b, 1 + b] has density p on the window [u − b, u + b] and q elsewhere (2b·p + 1·q = 1). Sampled
exactly: w.p. 2b·p uniform on the window, otherwise uniform on the rest of [−b, 1+b], which has length 1 and is
reached as ``−b + w`` for w < u and ``u + b + (w − u)`` for w ≥ u, w ~ U[0, 1).

**Privacy (exact).** Every output's density is p or q under every input, so the worst-case density ratio is
p/q = e^ε. b → 0 as ε grows.

**The release (SPEC §3.0).** A real-valued output would leak u through which doubles it can take, so the device
releases an index on a public grid instead: ``[−b, 1 + b]`` is cut into ``cells = r·⌊32768/r⌋`` cells (r the
resolution below), the window into ``K ≈ cells·2b/(1 + 2b)`` of them, u is rounded randomly to a window start
``s ∈ {0, …, cells − K}`` and the cell drawn from the exact :class:`~protocols.exact.WindowChannel` (weights H on the
window and L elsewhere, ``H/L ≤ e^ε``, one total for every s). So ``P[j|s]/P[j|s'] ≤ H/L ≤ e^ε`` on what is sent
(:meth:`SquareWave.channel_row`, enumerated in tests); an output bucket of EMS is exactly c = cells/r cells.

**Server: EMS** (expectation–maximisation with smoothing; Silverman, Jones, Wilson, Nychka, JRSS-B 1990, as used by
Li et al.). EMS runs on a fine grid of ``r`` input buckets over [0, 1] and r output buckets over [−b, 1 + b]
(``resolution`` r, default the smallest multiple of D that is ≥ 256: smoothing acts per fine bucket, and on a
coarse grid the (1, 2, 1) kernel over-smooths — at D = 32, ε = 1 it doubles the CDF error), then sums the fine
histogram onto the D buckets. The transition matrix ``M[j, i] = P[ũ ∈ out_j | u uniform in fine bucket i]`` is (computed exactly from the grid law: the
probability of an output bucket given a window start is ``(L·c + (H − L)·overlap)/W``, linear between integer starts,
and the rounding interpolates linearly, so its average over an input bucket is the overlap's integral — piecewise
linear, integrated by the trapezoid rule on its breakpoints). From the output-bucket counts c,
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
from fractions import Fraction
from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int
from protocols.distribution.base import DistributionMechanism
from protocols.distribution.grid import MAX_BUCKETS
from protocols.exact import WindowChannel, randomized_round
from protocols.numeric._grid import check_indices

__all__ = ["SquareWave", "square_wave_parameters", "ems"]

#: Square Wave's b is computed from e^ε; beyond this ε the window is narrower than float resolution matters.
MAX_EPSILON = 20.0
#: At most this many released cells (the grid of one report).
MAX_CELLS = 1 << 15


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
    """Square Wave over [0, 1] with EMS onto D buckets (see the module docstring). Reports: (n,) int64 cell indices."""

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
        self.cells = self.resolution * (MAX_CELLS // self.resolution)
        self.per_bucket = self.cells // self.resolution
        window = max(1, min(self.cells - 1, round(self.cells * 2.0 * self.b / (1.0 + 2.0 * self.b))))
        self.channel = WindowChannel(self.cells, window, self.epsilon)
        self.grid = self.cells
        self._matrix: np.ndarray | None = None

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "resolution": self.resolution}

    # ------------------------------------------------------------------ client
    def _check_unit(self, values: Any) -> np.ndarray:
        u = np.asarray(values, dtype=float).reshape(-1)
        if u.size and not (u.min() >= 0.0 and u.max() <= 1.0):
            raise ValueError("Square Wave inputs must lie in [0, 1] (scale by the public bounds first)")
        return u

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Unit values u ∈ [0, 1] (one per user) → cell indices in ``[0, cells)``."""
        u = self._check_unit(values)
        positions = randomized_round(u * (self.channel.positions - 1), rng)
        return self.channel.sample(positions, rng)

    def privatize_unit(self, u: Any, rng: np.random.Generator) -> np.ndarray:
        return self.privatize(u, rng)

    def channel_row(self, position: int) -> list[Fraction]:
        """Exact ``P[cell | window start s]`` for every cell."""
        return [Fraction(int(w), self.channel.total) for w in self.channel.weights(position)]

    def likelihood(self, outputs: Any, value: float) -> np.ndarray:
        """``P[cell | u]`` for each released cell index under input ``value`` (the mixture over the two window
        starts the rounding may choose); 0 for anything that is not a cell index."""
        v = float(value)
        if not 0.0 <= v <= 1.0:
            raise ValueError("value must lie in [0, 1]")
        j = np.asarray(outputs)
        x = v * (self.channel.positions - 1)
        lo = min(int(math.floor(x)), self.channel.positions - 2)
        f = x - lo
        valid = (j >= 0) & (j < self.cells) & (np.mod(j, 1) == 0)
        jj = np.where(valid, j, 0).astype(np.int64)
        ch = self.channel

        def at(s: int) -> np.ndarray:
            inside = (jj >= s) & (jj < s + ch.window)
            return np.where(inside, ch.high, ch.low) / ch.total

        return np.where(valid, (1 - f) * at(lo) + f * at(lo + 1), 0.0)

    # ------------------------------------------------------------------ server
    @property
    def transition_matrix(self) -> np.ndarray:
        """M (r × r): probability of output bucket j given an input uniform in fine bucket i (columns sum to 1)."""
        if self._matrix is None:
            ch, r = self.channel, self.resolution
            half = ch.window / 2.0
            x = np.linspace(0.0, ch.positions - 1.0, r + 1) + half  # window centres over each input bucket
            a = np.arange(r + 1, dtype=float) * self.per_bucket
            x0, x1 = x[None, :-1], x[None, 1:]
            c0, c1 = a[:-1, None], a[1:, None]
            overlap = _overlap_integral(x0, x1, c0, c1, half) / (x1 - x0)
            self._matrix = (ch.low * self.per_bucket + (ch.high - ch.low) * overlap) / ch.total
        return self._matrix

    def output_counts(self, reports: Any) -> np.ndarray:
        """Sufficient statistic: counts of the released cells in the r output buckets (additive over reports)."""
        idx = check_indices(np.asarray(reports).reshape(-1), self.cells)
        return np.bincount(idx // self.per_bucket, minlength=self.resolution).astype(float)

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
