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

from protocols.base import NumericMechanism, check_delta, check_epsilon, check_unit_interval

from ._common import as_result, check_reports, check_rng

__all__ = ["Laplace", "Gaussian", "gaussian_exact_delta", "analytic_gaussian_sigma", "SENSITIVITY"]

#: Sensitivity of the identity on [-1, 1] in both ℓ1 and ℓ2: |t1 - t2| ≤ 2.
SENSITIVITY = 2.0


class Laplace(NumericMechanism):
    """Local Laplace mechanism: ``y = t + Lap(λ)``, λ = Δ/ε = 2/ε.

    Density ``f(y | t) = (1/(2λ)) exp(-|y - t|/λ)``; for any y, ``f(y|t1)/f(y|t2) = exp((|y-t2| - |y-t1|)/λ)
    ≤ exp(|t1 - t2|/λ) ≤ exp(2/λ) = e^ε``, with equality for y ≥ 1, t1 = 1, t2 = -1. Unbiased;
    Var = 2λ² = 8/ε² for every t.
    """

    def __init__(self, epsilon: float) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0
        self.scale = SENSITIVITY / self.epsilon

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        return t + check_rng(rng).laplace(0.0, self.scale, size=t.shape)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return check_reports(reports)

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """Density of the output y given input t (broadcasting)."""
        t = check_unit_interval(t, "t")
        y = np.asarray(y, dtype=float)
        return np.exp(-np.abs(y - t) / self.scale) / (2 * self.scale)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        return as_result(np.full(tt.shape, 2 * self.scale**2), t)

    def worst_case_variance(self) -> float:
        return 2 * self.scale**2


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


class Gaussian(NumericMechanism):
    """Local Gaussian mechanism: ``y = t + N(0, σ²)``, (ε, δ)-LDP, ℓ2 sensitivity Δ₂ = 2.

    Calibration:

    * ``"classic"`` (default, SPEC §3.7): ``σ = Δ₂ · sqrt(2 ln(1.25/δ)) / ε``. The Dwork–Roth proof (Thm A.1)
      only covers **ε < 1**, so this calibration refuses ε ≥ 1 with a ValueError rather than claim an unproven
      guarantee.
    * ``"analytic"`` (Balle & Wang 2018): the smallest σ whose exact privacy curve gives δ at ε; valid for every
      ε > 0 and never larger than the classic σ.

    Either way :func:`gaussian_exact_delta` certifies the (ε, δ) claim. Rényi DP (Mironov 2017):
    ``ε_RDP(α) = α Δ₂² / (2σ²)``. Unbiased; Var = σ² for every t.
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

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = check_unit_interval(values)
        return t + check_rng(rng).normal(0.0, self.sigma, size=t.shape)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return check_reports(reports)

    def pdf(self, t: Any, y: Any) -> np.ndarray:
        """Density of the output y given input t (broadcasting). The ratio is unbounded: (ε, δ), not pure ε."""
        t = check_unit_interval(t, "t")
        z = (np.asarray(y, dtype=float) - t) / self.sigma
        return np.exp(-0.5 * z * z) / (self.sigma * math.sqrt(2 * math.pi))

    def rdp(self, alpha: float) -> float:
        """Rényi-DP curve ``ε(α) = α Δ₂² / (2σ²)`` for order α > 1."""
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha > 1):
            raise ValueError(f"Renyi order alpha must be a finite number > 1, got {alpha!r}")
        return alpha * SENSITIVITY**2 / (2 * self.sigma**2)

    def variance(self, t: Any = 0.0) -> Any:
        tt = check_unit_interval(t, "t")
        return as_result(np.full(tt.shape, self.sigma**2), t)

    def worst_case_variance(self) -> float:
        return self.sigma**2

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "calibration": self.calibration}
