"""Negative controls: the thesis's mechanisms *as written*, which do not satisfy the ε they claim (SPEC §2.4).

These exist only to prove that the audits and exact checks can catch a broken mechanism. They live in tests/
and must never be imported by product code (protocols/, edge_agent/, coordinator/).

* :class:`ThesisPDP` — the PPMC mean perturbation as the thesis's reference code runs it: with probability
  e^ε/(e^ε+1) uniform on a window of width δ centred on the input, otherwise uniform on ``[t - b, t + b]``,
  clipped to [-1, 1]; the published parameters are b = 0.005, δ = 0.001. The *support* moves with the input,
  so inputs more than 2b apart have disjoint outputs: ε = ∞ whatever the claim.
* :class:`ThesisGPM` — Algorithm 1 of thesis 003 ("global perturbation mechanism" for the Haar detail vector):
  a Bernoulli X with P[X = 1] = e^ε/(e^ε+1) picks a mask with an even (X = 1) or odd (X = 0) number of ones;
  coordinate i is drawn uniformly from the narrow interval
  ``N(e_i) = [(e_i e^ε - 1)/(e^ε - 1), (e_i e^ε + 1)/(e^ε - 1)]`` if its mask bit is 0, otherwise from
  ``[-C, C] \\ N(e_i)``, ``C = (e^ε + 1)/(e^ε - 1)``. The thesis proves only that the mask's parity costs ε and
  ignores that the per-coordinate intervals depend on the input; the whole vector is about (d+1)·ε-LDP.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

__all__ = ["ThesisPDP", "ThesisGPM", "gpm_exact_epsilon", "gpm_exact_epsilon_enumerated"]


class ThesisPDP:
    """The thesis's PDP: support ``[t - b, t + b]`` centred on the input (claims ε, is not LDP at all)."""

    def __init__(self, epsilon: float, b: float = 0.005, width: float = 0.001, clip: bool = True) -> None:
        self.epsilon = float(epsilon)
        self.delta = 0.0
        self.b = float(b)
        self.width = float(width)
        self.clip = clip

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        t = np.asarray(values, dtype=float)
        near = rng.random(t.shape) < math.exp(self.epsilon) / (math.exp(self.epsilon) + 1)
        u = rng.random(t.shape)
        out = np.where(near, t - self.width / 2 + self.width * u, t - self.b + 2 * self.b * u)
        return np.clip(out, -1.0, 1.0) if self.clip else out


def _parity_counts(d: int) -> tuple[int, int]:
    """How many even and how many odd mask weights k ∈ [0, d] there are."""
    return d // 2 + 1, (d + 1) // 2


def _mask_weight_probabilities(epsilon: float, d: int, mask_law: str) -> np.ndarray:
    """P[one particular mask with h ones], h = 0..d.

    ``"uniform_k"`` (SPEC's reading, which reproduces its exact values): X picks the parity, the number of
    ones k is uniform among the weights of that parity, then the k positions are uniform;
    ``"uniform_set"``: the mask is uniform over all masks of the chosen parity (|A| = |B| = 2^{d-1}).
    """
    p = math.exp(epsilon) / (math.exp(epsilon) + 1)
    h = np.arange(d + 1)
    parity_prob = np.where(h % 2 == 0, p, 1 - p)
    if mask_law == "uniform_set":
        return parity_prob / 2 ** (d - 1) if d > 0 else parity_prob
    n_even, n_odd = _parity_counts(d)
    per_weight = parity_prob / np.where(h % 2 == 0, n_even, n_odd)
    return per_weight / np.array([math.comb(d, int(k)) for k in h])


def gpm_exact_epsilon(epsilon: float, d: int, mask_law: str = "uniform_k") -> float:
    """The true ε of Algorithm 1 on ``[-1, 1]^d``.

    Given the mask, coordinates are independent with density ``a = (e^ε - 1)/2`` on N(e_i) (bit 0) or
    ``a e^{-ε}`` off it (bit 1), and each bit forces which of the two regions y_i is in. So an output y whose
    coordinates lie off N(e_i) in exactly the set S has density ``a^d e^{-ε|S|} P[mask = 1_S]`` — only the mask
    ``1_S`` can produce it. With ``f(h) = e^{-εh} P[mask of weight h]``, and since every pair (|S1|, |S2|) is
    realised by some y and inputs e1, e2 (N(1) = [1, C] and N(-1) = [-C, -1] are disjoint, and equal inputs
    give equal patterns), the worst ratio is ``max_h f(h) / min_h f(h)``.
    """
    h = np.arange(d + 1)
    f = np.exp(-epsilon * h) * _mask_weight_probabilities(epsilon, d, mask_law)
    return float(np.log(f.max() / f.min()))


def gpm_exact_epsilon_enumerated(epsilon: float, d: int, mask_law: str = "uniform_k") -> float:
    """The same quantity by brute force over masks and output patterns (small d): for each pattern s ∈ {0,1}^d
    (s_i = 1 ⇔ y_i ∉ N(e_i)) sum over *all* masks of P[mask] Π_i f(y_i | bit_i), then take the worst ratio
    between any two patterns."""
    a = math.expm1(epsilon) / 2
    weights = _mask_weight_probabilities(epsilon, d, mask_law)
    codes = np.arange(2**d)
    bits = (codes[:, None] >> np.arange(d)[None, :]) & 1  # rows: masks, and also patterns
    mask_prob = weights[bits.sum(axis=1)]
    # per-coordinate density of y_i given (pattern bit s, mask bit m): m = 0 needs s = 0; m = 1 needs s = 1
    s, m = bits[:, None, :], bits[None, :, :]
    coord = np.where(m == 0, np.where(s == 0, a, 0.0), np.where(s == 1, a * math.exp(-epsilon), 0.0))
    density = (coord.prod(axis=2) * mask_prob[None, :]).sum(axis=1)  # (patterns,)
    return float(np.log(density.max() / density.min()))


class ThesisGPM:
    """Algorithm 1 of thesis 003 (see module docstring); vectorised over users, inputs ``(n, d)``."""

    def __init__(
        self, epsilon: float, d: int, mask_law: Literal["uniform_k", "uniform_set"] = "uniform_k"
    ) -> None:
        self.epsilon = float(epsilon)
        self.delta = 0.0
        self.d = int(d)
        self.mask_law = mask_law
        self.bound = (math.exp(self.epsilon) + 1) / math.expm1(self.epsilon)

    def exact_epsilon(self) -> float:
        return gpm_exact_epsilon(self.epsilon, self.d, self.mask_law)

    def _masks(self, n: int, rng: np.random.Generator) -> np.ndarray:
        even = rng.random(n) < math.exp(self.epsilon) / (math.exp(self.epsilon) + 1)
        if self.mask_law == "uniform_set":  # uniform bits, then fix the parity with the last bit
            bits = rng.random((n, self.d)) < 0.5
            wrong = (bits.sum(axis=1) % 2 == 0) != even
            bits[wrong, -1] = ~bits[wrong, -1]
            return bits
        n_even, n_odd = _parity_counts(self.d)
        k = np.where(even, 2 * rng.integers(0, n_even, n), 1 + 2 * rng.integers(0, max(n_odd, 1), n))
        ranks = np.argsort(np.argsort(rng.random((n, self.d)), axis=1), axis=1)
        return ranks < k[:, None]

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        e = np.asarray(values, dtype=float).reshape(-1, self.d)
        n = e.shape[0]
        mask = self._masks(n, rng)
        ee = math.exp(self.epsilon)
        lo = (e * ee - 1) / (ee - 1)
        hi = (e * ee + 1) / (ee - 1)
        u = rng.random(e.shape)
        narrow = lo + (hi - lo) * u
        wide = -self.bound + (2 * self.bound - (hi - lo)) * u  # uniform on [-C, C] minus the narrow interval
        wide = np.where(wide >= lo, wide + (hi - lo), wide)
        return np.where(mask, wide, narrow)
