"""Two-stage (PRR then IRR) randomizer chains: exact parameters from (ε∞, ε1) and the unbiased estimator.

Per reported symbol (GRR) or per bit (unary encoding), stage 1 — the memoized PRR — supports the true value
with probability p1 and any other given value with q1; stage 2 — the fresh IRR — keeps a supported symbol/bit
with p2 and creates one with q2. The chain supports the truth with

    p* = p1·p2 + (1 - p1)·q2,        q* = q1·p2 + (1 - q1)·q2 = q1(p2 - q2) + q2,

so with C_v reports supporting v among n users, E[C_v] = n(f_v p* + (1 - f_v) q*) and

    f̂_v = (C_v - n q1 (p2 - q2) - n q2) / (n (p1 - q1)(p2 - q2))                                  (SPEC §3.10)

is unbiased; per user its variance is  (f p*(1-p*) + (1-f) q*(1-q*)) / ((p1 - q1)(p2 - q2))²  (exact for a
fixed population; Arcolezi et al. 2022 give the f-mixture form σ(1-σ)/(...)², σ = f p* + (1-f) q*).

The IRR parameters are chosen so that one report is exactly ε1-LDP (Arcolezi, Couchot, Al Bouna & Xiao,
"Improving the utility of locally differentially private protocols for longitudinal and multidimensional frequency
estimates", Digital Communications and Networks 2022; closed forms re-derived here):

* L-GRR over k symbols (GRR(ε∞) then GRR(ε2)): one report has ratio (e^{ε∞}e^{ε2} + k - 1)/(e^{ε∞} + e^{ε2} + k - 2);
  setting it to e^{ε1} gives  e^{ε2} = (e^{ε1}(e^{ε∞} - 1) + (e^{ε1} - 1)(k - 1)) / (e^{ε∞} - e^{ε1}).
  For k = 2 this is LOLOHA's ε_IRR = ln((e^{ε∞+ε1} - 1)/(e^{ε∞} - e^{ε1})) (SPEC §3.10).
* L-OSUE (OUE(ε∞) then SUE): p* = 1/2 and q* must equal 1/(e^{ε1} + 1), so
  p2 = (e^{ε∞+ε1} - 1) / ((e^{ε∞} - 1)(e^{ε1} + 1)),  q2 = 1 - p2.
* L-SUE (SUE(ε∞) then SUE): the chain is symmetric (q* = 1 - p*), one report is ln((p*/(1-p*))²), so
  p* = e^{ε1/2}/(e^{ε1/2} + 1) and p2 = (p* - q1)/(p1 - q1),  q2 = 1 - p2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.base import check_epsilon, check_int

__all__ = [
    "TwoStageChain",
    "check_budget_pair",
    "grr_chain",
    "grr_irr_epsilon",
    "osue_chain",
    "sue_chain",
    "ue_epsilon",
    "grr_epsilon",
]


def check_budget_pair(epsilon_inf: Any, epsilon_1: Any) -> tuple[float, float]:
    """Validate (ε∞, ε1): both finite and positive, with ε1 < ε∞ strictly."""
    e_inf = check_epsilon(epsilon_inf, "epsilon_inf")
    e_1 = check_epsilon(epsilon_1, "epsilon_1")
    if not e_1 < e_inf:
        raise ValueError(f"epsilon_1 must be < epsilon_inf (one report leaks less than the memo), got {e_1} >= {e_inf}")
    return e_inf, e_1


@dataclass(frozen=True)
class TwoStageChain:
    """Support probabilities of a PRR→IRR chain (see module docstring)."""

    p1: float
    q1: float
    p2: float
    q2: float

    def __post_init__(self) -> None:
        for name in ("p1", "q1", "p2", "q2"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be a probability, got {value}")
        if not (self.p1 > self.q1 and self.p2 > self.q2):
            raise ValueError("a chain needs p1 > q1 and p2 > q2")

    @property
    def p_star(self) -> float:
        """P[a report supports v | the user holds v] = p1 p2 + (1 - p1) q2."""
        return self.p1 * self.p2 + (1.0 - self.p1) * self.q2

    @property
    def q_star(self) -> float:
        """P[a report supports v | the user holds another value] = q1 (p2 - q2) + q2."""
        return self.q1 * (self.p2 - self.q2) + self.q2

    @property
    def gain(self) -> float:
        """(p1 - q1)(p2 - q2) = p* - q*."""
        return (self.p1 - self.q1) * (self.p2 - self.q2)

    def estimate(self, counts: Any, n: int) -> np.ndarray:
        """f̂ = (C - n q1(p2 - q2) - n q2) / (n (p1 - q1)(p2 - q2)), unbiased."""
        if n <= 0:
            raise ValueError("cannot estimate frequencies from zero reports")
        counts = np.asarray(counts, dtype=float)
        return (counts - n * self.q_star) / (n * self.gain)

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of f̂_v at true frequency f: (f p*(1-p*) + (1-f) q*(1-q*)) / ((p1-q1)(p2-q2))²."""
        f = np.asarray(f, dtype=float)
        p, q = self.p_star, self.q_star
        out = (f * p * (1 - p) + (1 - f) * q * (1 - q)) / self.gain**2
        return float(out) if out.ndim == 0 else out


def grr_epsilon(p: float, q: float) -> float:
    """ε of a GRR-type randomizer that outputs the input w.p. p and each other symbol w.p. q: ln(p/q)."""
    return math.log(p / q)


def ue_epsilon(p: float, q: float) -> float:
    """ε of unary encoding with bit probabilities (p, q): ln(p(1-q) / (q(1-p))) (two bits differ)."""
    return math.log(p * (1 - q) / (q * (1 - p)))


def grr_irr_epsilon(epsilon_inf: float, epsilon_1: float, k: int) -> float:
    """ε2 of the IRR GRR so that GRR_k(ε∞) then GRR_k(ε2) is exactly ε1-LDP (module docstring)."""
    e_inf, e_1 = check_budget_pair(epsilon_inf, epsilon_1)
    k = check_int(k, "k", 2)
    a, c = math.exp(e_inf), math.exp(e_1)
    b = (c * (a - 1.0) + (c - 1.0) * (k - 1)) / (a - c)
    return math.log(b)


def grr_chain(epsilon_inf: float, epsilon_1: float, k: int) -> TwoStageChain:
    """L-GRR over k symbols: p1 = e^{ε∞}/(e^{ε∞}+k-1), q1 = 1/(e^{ε∞}+k-1), p2, q2 likewise with ε2."""
    e_inf, _ = check_budget_pair(epsilon_inf, epsilon_1)
    b = math.exp(grr_irr_epsilon(epsilon_inf, epsilon_1, k))
    a = math.exp(e_inf)
    return TwoStageChain(a / (a + k - 1), 1.0 / (a + k - 1), b / (b + k - 1), 1.0 / (b + k - 1))


def osue_chain(epsilon_inf: float, epsilon_1: float) -> TwoStageChain:
    """L-OSUE: OUE(ε∞) memoized (p1 = 1/2, q1 = 1/(e^{ε∞}+1)) then SUE with p2 = (e^{ε∞+ε1}-1)/((e^{ε∞}-1)(e^{ε1}+1))."""
    e_inf, e_1 = check_budget_pair(epsilon_inf, epsilon_1)
    a, c = math.exp(e_inf), math.exp(e_1)
    p2 = (a * c - 1.0) / ((a - 1.0) * (c + 1.0))
    return TwoStageChain(0.5, 1.0 / (a + 1.0), p2, 1.0 - p2)


def sue_chain(epsilon_inf: float, epsilon_1: float) -> TwoStageChain:
    """L-SUE (basic RAPPOR on unary encoding): SUE(ε∞) memoized then SUE with p2 = (p* - q1)/(p1 - q1)."""
    e_inf, e_1 = check_budget_pair(epsilon_inf, epsilon_1)
    p1 = math.exp(e_inf / 2) / (math.exp(e_inf / 2) + 1.0)
    p_star = math.exp(e_1 / 2) / (math.exp(e_1 / 2) + 1.0)
    p2 = (p_star - (1.0 - p1)) / (2.0 * p1 - 1.0)
    return TwoStageChain(p1, 1.0 - p1, p2, 1.0 - p2)
