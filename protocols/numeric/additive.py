"""Additive-noise mechanisms on t ∈ [-1, 1]: local Laplace (pure ε) and Gaussian ((ε, δ)), SPEC §3.7.

The inputs differ by at most Δ = 2 (Δ₁ = Δ₂ = 2 on [-1, 1]); outputs are ``t + noise`` and already unbiased.

References: Dwork & Roth, *The Algorithmic Foundations of Differential Privacy* (2014), Thm 3.6 (Laplace) and
Thm A.1 (classic Gaussian); Balle & Wang, *Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising*, ICML 2018, Thm 8 (exact (ε, δ) curve) — the "analytic Gaussian mechanism";
Mironov, *Rényi Differential Privacy*, CSF 2017, Prop. 7 (RDP of the Gaussian).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from decimal import Context, Decimal
from fractions import Fraction

from protocols.base import check_delta, check_epsilon, check_int, check_unit_interval
from protocols.exact import (
    MAX_GRID,
    discrete_gaussian,
    discrete_gaussian_one,
    discrete_laplace,
    discrete_laplace_one,
    rational_epsilon,
)

from ._common import as_result
from ._grid import GridMechanism

__all__ = ["Laplace", "Gaussian", "gaussian_exact_delta", "analytic_gaussian_sigma", "discrete_gaussian_delta", "SENSITIVITY"]

#: Sensitivity of the identity on [-1, 1] in both ℓ1 and ℓ2: |t1 - t2| ≤ 2.
SENSITIVITY = 2.0


#: Tail mass beyond the clamped range of the additive mechanisms' released grid: 2^-40 on each side.
TAIL_BITS = 40


class _Clamped(GridMechanism):
    """An additive lattice mechanism (SPEC §3.0): input grid ``x_i = −1 + 2i/m`` (i = 0…m), released index
    ``clamp(i + Z, −M, m + M) + M`` with Z an exact integer noise (discrete Laplace or Gaussian), i.e. the value
    ``−1 + 2(index − M)/m``. Clamping is a function of ``i + Z`` (post-processing): it cannot raise ε or δ. It adds a
    bias, computed exactly by :meth:`bias` from the noise's tail (at most ``2^-40`` of mass beyond ``M``)."""

    m: int
    offset: int

    def _setup_lattice(self, m: int, offset: int) -> None:
        self.m, self.offset = m, offset
        self.grid = m + 2 * offset + 1
        if self.grid > MAX_GRID:
            raise ValueError(f"the released grid would hold {self.grid} values (> {MAX_GRID})")
        self.inputs = m + 1

    def _estimates(self) -> np.ndarray:
        return -1.0 + 2.0 * (np.arange(self.grid, dtype=float) - self.offset) / self.m

    def _default_grid(self) -> int:
        return self.grid  # derived from ε (and δ), below a cap (Laplace: its ``grid`` parameter)

    def _noise(self, size: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def _noise_one(self, rng: np.random.Generator) -> int:
        raise NotImplementedError

    def _release(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.clip(positions + self._noise(positions.size, rng) + self.offset, 0, self.grid - 1)

    def _release_one(self, position: int, rng: np.random.Generator) -> int:
        return min(max(position + self._noise_one(rng) + self.offset, 0), self.grid - 1)

    def noise_pmf(self, z: np.ndarray) -> np.ndarray:
        """``P[Z = z]`` in floats (for moments and tests)."""
        raise NotImplementedError

    def channel_row(self, i: int) -> list[Any]:
        return [Decimal(p) for p in self._row_probabilities(i)]

    def _row_probabilities(self, i: int) -> np.ndarray:
        """``P[index | x_i]`` in floats: the noise pmf on the interior, its tails on the two clamped ends."""
        reach = np.arange(-self.offset - i - 20 * self.m - 64, self.grid - i - self.offset + 20 * self.m + 64)
        pmf = self.noise_pmf(reach)
        idx = np.clip(reach + i + self.offset, 0, self.grid - 1)
        return np.bincount(idx, weights=pmf, minlength=self.grid)

    def bias(self, t: Any = 1.0) -> Any:
        """``E[debias(index) | t] − t``: the clamping's bias (0 without clamping), exact on the grid inputs by
        enumeration of the row (its magnitude is about the 2^-40 tail times the grid's reach)."""
        tt = check_unit_interval(t, "t")
        flat = tt.reshape(-1)
        out = np.empty(flat.size)
        for n, value in enumerate(flat):  # diagnostics only: a few inputs
            x = (value + 1.0) * self.m / 2.0
            lo = min(int(math.floor(x)), self.m - 1)
            f = x - lo
            means = [float(self._row_probabilities(i) @ self._table) for i in (lo, lo + 1)]
            out[n] = (1 - f) * means[0] + f * means[1] - value
        return as_result(out.reshape(tt.shape), t)

    def noise_variance(self) -> float:
        raise NotImplementedError

    def row_moments(self, i: Any) -> tuple[np.ndarray, np.ndarray]:
        x = -1.0 + 2.0 * np.asarray(i, dtype=float) / self.m
        return x, np.full(x.shape, self.noise_variance() * (2.0 / self.m) ** 2)


class Laplace(_Clamped):
    """Local Laplace mechanism, released exactly: the discrete Laplace on the input lattice (SPEC §3.1 and §3.0).

    Continuous: ``y = t + Lap(2/ε)``. Released: ``t`` rounded randomly to ``x_i = −1 + 2i/m``, then the index
    ``i + Z`` with ``P[Z = z] ∝ exp(−ε'|z|/m)`` (Canonne–Kamath–Steinke's exact sampler,
    :func:`protocols.exact.discrete_laplace`; ``ε' ≤ ε`` is ε rounded down to a multiple of 2^-32), clamped to
    ``[−M, m + M]`` with ``M = ⌈40·ln 2·m/ε'⌉`` (tail mass ≤ 2^-40 per side). Two grid inputs differ by at most m
    lattice steps, so ``P[j|i]/P[j|i'] ≤ exp(ε'·|i − i'|/m) ≤ e^{ε'}`` on the interior and on the clamped ends
    (tails of the same geometric law): exactly ε'-LDP. ``m`` is the largest with ``m + 2M + 1 ≤ 65,536`` released
    values (``grid``, the cap, is a parameter for tests that enumerate small grids). ``Var = (2/m)²·2ρ/(1 − ρ)²`` with ``ρ = e^{−ε'/m}`` (→ 8/ε² as m grows) plus the rounding's
    ``f(1 − f)(2/m)²``; the clamping's bias is :meth:`bias`.
    """

    def __init__(self, epsilon: float, grid: int = MAX_GRID) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0
        self.max_grid = check_int(grid, "grid", 8, MAX_GRID)
        self.rational_epsilon = rational_epsilon(self.epsilon)
        reach = TAIL_BITS * math.log(2) / float(self.rational_epsilon)  # M/m
        m = int((self.max_grid - 3) / (1 + 2 * reach))
        while m >= 2 and m + 2 * math.ceil(reach * m) + 1 > self.max_grid:
            m -= 1
        if m < 2:
            raise ValueError(f"epsilon {epsilon!r} is too small for a {self.max_grid}-value Laplace grid")
        self._setup_lattice(m, math.ceil(reach * m))
        self.noise_scale = Fraction(m) / self.rational_epsilon  # in lattice steps
        self.scale = SENSITIVITY / self.epsilon

    def _noise(self, size: int, rng: np.random.Generator) -> np.ndarray:
        return discrete_laplace(rng, self.noise_scale, size)

    def _noise_one(self, rng: np.random.Generator) -> int:
        return discrete_laplace_one(rng, self.noise_scale)

    def noise_pmf(self, z: np.ndarray) -> np.ndarray:
        rho = math.exp(-1.0 / float(self.noise_scale))
        return (1 - rho) / (1 + rho) * np.power(rho, np.abs(z))

    def channel_row(self, i: int) -> list[Any]:
        """Exact in 60-digit decimals: ``c·ρ^|j − i|`` inside, ``c·ρ^d/(1 − ρ)`` on a clamped end."""
        ctx = Context(prec=60)
        rho = (-Decimal(self.rational_epsilon.numerator) / Decimal(self.rational_epsilon.denominator * self.m)).exp(ctx)
        c = ctx.divide(1 - rho, 1 + rho)
        row = []
        for j in range(self.grid):
            d = abs(j - self.offset - i)
            p = c * ctx.power(rho, d)
            if j in (0, self.grid - 1):
                p = ctx.divide(p, 1 - rho)
            row.append(p)
        return row

    def noise_variance(self) -> float:
        rho = math.exp(-1.0 / float(self.noise_scale))
        return 2 * rho / (1 - rho) ** 2

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), **({"grid": self.max_grid} if self.max_grid != MAX_GRID else {})}

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """The continuous Laplace density (the law the grid approximates; for plots and the float-release controls)."""
        t = check_unit_interval(t, "t")
        y = np.asarray(y, dtype=float)
        return np.exp(-np.abs(y - t) / self.scale) / (2 * self.scale)


def gaussian_exact_delta(epsilon: float, sigma: float, sensitivity: float = SENSITIVITY) -> float:
    """The smallest δ for which ``t + N(0, σ²)`` is (ε, δ)-DP at ℓ2 sensitivity Δ (Balle & Wang 2018, Thm 8):

        δ(ε) = Φ(Δ/(2σ) - εσ/Δ) - e^ε · Φ(-Δ/(2σ) - εσ/Δ).

    Exact (a necessary and sufficient condition), so it certifies any calibration of σ.
    """
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    from scipy import special  # lazy: scipy is not loaded on devices unless needed

    first = float(special.ndtr(a - b))
    second = math.exp(epsilon + float(special.log_ndtr(-a - b)))
    return max(0.0, first - second)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = SENSITIVITY) -> float:
    """The smallest σ with ``gaussian_exact_delta(ε, σ) ≤ δ`` (analytic Gaussian mechanism, any ε > 0).

    δ(σ) decreases strictly from 1 (σ → 0) to 0 (σ → ∞), so a bracketing root finder on log σ is exact to
    floating-point tolerance; the result is nudged up so the guarantee holds after rounding.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)

    def excess(log_sigma: float) -> float:
        return gaussian_exact_delta(epsilon, math.exp(log_sigma), sensitivity) - delta

    lo = math.log(sensitivity) - 30.0
    hi = math.log(sensitivity)
    while excess(hi) > 0:
        hi += 2.0
    from scipy import optimize

    root = optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    sigma = math.exp(root)
    while gaussian_exact_delta(epsilon, sigma, sensitivity) > delta:
        sigma *= 1 + 1e-12
    return sigma


def discrete_gaussian_delta(epsilon: float, sigma2: int, sensitivity: int) -> float:
    """δ(ε) of the discrete Gaussian ``P[Z = z] ∝ exp(−z²/(2σ²))`` (σ² an integer) for integer shifts up to Δ
    (Canonne, Kamath, Steinke 2020, Thm 7): ``P[Z > εσ²/Δ − Δ/2] − e^ε P[Z > εσ²/Δ + Δ/2]``, summed on the lattice
    (the worst shift is Δ; clamping the release is post-processing and cannot raise it)."""
    sigma = math.sqrt(sigma2)
    z = np.arange(-int(50 * sigma) - 2 * sensitivity - 64, int(50 * sigma) + 2 * sensitivity + 65)
    logw = -(z.astype(float) ** 2) / (2 * sigma2)
    w = np.exp(logw - logw.max())
    pmf = w / w.sum()
    a = epsilon * sigma2 / sensitivity
    first = pmf[z > a - sensitivity / 2].sum()
    second = pmf[z > a + sensitivity / 2].sum()
    return max(0.0, float(first - math.exp(epsilon) * second))


class Gaussian(_Clamped):
    """Local Gaussian mechanism, (ε, δ)-LDP, released exactly: the discrete Gaussian on the input lattice.

    σ (in units of t, ℓ2 sensitivity 2) is calibrated as before:

    * ``"classic"`` (default, SPEC §3.7): ``σ = Δ₂ · sqrt(2 ln(1.25/δ)) / ε``. The Dwork–Roth proof (Thm A.1)
      only covers **ε < 1**, so this calibration refuses ε ≥ 1 with a ValueError rather than claim an unproven
      guarantee.
    * ``"analytic"`` (Balle & Wang 2018): the smallest σ whose exact privacy curve gives δ at ε; valid for every
      ε > 0 and never larger than the classic σ.

    Released (SPEC §3.0): t rounded randomly to ``x_i = −1 + 2i/m`` with ``m ≈ 512/σ`` (so about 256 lattice steps
    per σ), then ``i + Z`` with Z the discrete Gaussian of integer variance parameter ``σ_L² ≥ (σm/2)²``
    (:func:`protocols.exact.discrete_gaussian`, exact), clamped at ``M`` steps beyond the range (tail ≤ 2^-40). The
    release's δ at ε is **the discrete law's own** (:func:`discrete_gaussian_delta`, Δ = m lattice steps), and σ_L²
    is raised until it is ≤ δ: :attr:`discrete_delta` states it. ``Var = (2/m)²·Var(Z)`` plus the rounding term.
    Rényi DP: the discrete Gaussian satisfies ``ε(α) = αΔ²/(2σ_L²)`` (CKS 2020, Prop. 5).
    """

    def __init__(
        self, epsilon: float, delta: float, calibration: Literal["classic", "analytic"] = "classic"
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        if calibration == "classic":
            if self.epsilon >= 1:
                raise ValueError(
                    f"the classic Gaussian calibration is only proven for epsilon < 1 (got {self.epsilon}); "
                    "use calibration='analytic' (Balle & Wang 2018) for epsilon >= 1"
                )
            self.sigma = SENSITIVITY * math.sqrt(2 * math.log(1.25 / self.delta)) / self.epsilon
        elif calibration == "analytic":
            self.sigma = analytic_gaussian_sigma(self.epsilon, self.delta)
        else:
            raise ValueError(f"calibration must be 'classic' or 'analytic', got {calibration!r}")
        self.calibration = calibration
        m = min(8192, max(2, round(512 / self.sigma)))
        sigma2 = max(1, math.ceil((self.sigma * m / 2) ** 2))
        while discrete_gaussian_delta(self.epsilon, sigma2, m) > self.delta:
            sigma2 = math.ceil(sigma2 * 1.001) + 1
        self.lattice_sigma2 = sigma2
        self.discrete_delta = discrete_gaussian_delta(self.epsilon, sigma2, m)
        offset = math.ceil(math.sqrt(2 * sigma2 * TAIL_BITS * math.log(2)))
        while 2 * offset + m + 1 > MAX_GRID and m > 2:  # a very wide law: a coarser lattice
            m //= 2
            sigma2 = max(1, math.ceil((self.sigma * m / 2) ** 2))
            offset = math.ceil(math.sqrt(2 * sigma2 * TAIL_BITS * math.log(2)))
        self._setup_lattice(m, offset)

    def _noise(self, size: int, rng: np.random.Generator) -> np.ndarray:
        return discrete_gaussian(rng, self.lattice_sigma2, size)

    def _noise_one(self, rng: np.random.Generator) -> int:
        return discrete_gaussian_one(rng, self.lattice_sigma2)

    def noise_pmf(self, z: np.ndarray) -> np.ndarray:
        full = np.arange(-int(50 * math.sqrt(self.lattice_sigma2)) - 64, int(50 * math.sqrt(self.lattice_sigma2)) + 65)
        norm = np.exp(-(full.astype(float) ** 2) / (2 * self.lattice_sigma2)).sum()
        return np.exp(-(np.asarray(z, dtype=float) ** 2) / (2 * self.lattice_sigma2)) / norm

    def noise_variance(self) -> float:
        full = np.arange(-int(50 * math.sqrt(self.lattice_sigma2)) - 64, int(50 * math.sqrt(self.lattice_sigma2)) + 65)
        return float(np.sum(self.noise_pmf(full) * full.astype(float) ** 2))

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """The continuous density the grid approximates (ratio unbounded: (ε, δ), not pure ε)."""
        t = check_unit_interval(t, "t")
        z = (np.asarray(y, dtype=float) - t) / self.sigma
        return np.exp(-0.5 * z * z) / (self.sigma * math.sqrt(2 * math.pi))

    def rdp(self, alpha: float) -> float:
        """Rényi-DP curve ``ε(α) = α Δ²/(2σ_L²)`` (Δ = m lattice steps) for order α > 1."""
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha > 1):
            raise ValueError(f"Renyi order alpha must be a finite number > 1, got {alpha!r}")
        return alpha * self.m**2 / (2 * self.lattice_sigma2)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "calibration": self.calibration}
