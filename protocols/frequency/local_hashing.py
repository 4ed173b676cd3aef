"""Local hashing oracles: binary (BLH, g = 2) and optimized (OLH, g = round(e^ε) + 1).

Wang, Blocki, Li, Jha, USENIX Security 2017, §4.4 (BLH is Bassily–Smith's random-projection oracle, STOC 2015).
Each user draws a fresh public hash seed ``s`` (:func:`protocols.hashing.draw_seeds`), hashes
``h_s(x) ∈ [0, g)`` with the 2-universal family of :mod:`protocols.hashing`, and perturbs the hash with GRR over
``[g]``: ``y = h_s(x)`` w.p. ``p = e^ε/(e^ε+g-1)``, each other value w.p. ``q' = 1/(e^ε+g-1)``. The report is
the pair ``[s, y]`` (an ``(n, 2)`` int64 array).

Privacy (exact): the seed is drawn independently of x, so ``P[(s, y)|v1]/P[(s, y)|v2] = P[y|s, v1]/P[y|s, v2]``,
which is ``p/q' = e^ε`` when ``h_s(v1) ≠ h_s(v2)`` and ``1`` otherwise; the worst case over outputs is e^ε.

Decoding: report ``(s, y)`` *supports* v iff ``h_s(v) = y``. A holder of v supports it w.p. ``p``; a non-holder
w.p. ``q* = 1/g`` (over the seed: ``h_s(v)`` is uniform and independent of ``h_s(x)`` for ``x ≠ v``), so the
generic estimator ``f̂_v = (C_v/n - 1/g)/(p - 1/g)`` is unbiased with per-user variance
``(q*(1-q*) + f(p-q*)(1-p-q*))/(p-q*)²``; for OLH at f = 0 this is about ``4e^ε/(e^ε-1)²``. (The Carter–Wegman
family over P = 2^31-1 makes q* = 1/g only up to O(1/P) ≈ 5·10^-10, far below any sampling error.)

Fast support counts (:func:`protocols.hashing.support_counts`, shared with LOLOHA): with
``h_s(v) = ((a·v + b) mod P) mod g`` the residues ``r_v = (a·v + b) mod P`` satisfy ``r_0 = b`` and
``r_{v+1} = r_v + a - P·[r_v + a ≥ P]``, so the decoder walks the k items once, updating all users' residues
with a handful of uint32 numpy operations per item (``min(r, r - P)`` with wrap-around implements the
conditional subtraction; ``mod g`` is a bit mask when g is a power of two and a libdivide-backed floor division
otherwise) and counts matches with ``count_nonzero``. No (user, item) hash is
computed from scratch, there is no per-user Python loop, and memory is O(chunk) — a few MiB — not O(n·k).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.base import FrequencyOracle, check_category, check_int
from protocols.frequency._common import keep_probability, oracle_epsilon, report_matrix, user_values
from protocols.frequency.direct import grr_perturb, grr_perturb_one
from protocols.hashing import (MAX_ITEM, SEED_BITS, draw_seeds, hash_one, hash_values, support_counts,
                               support_prefix_moments)

__all__ = ["LocalHashing", "BLH", "OLH"]

#: Largest hash range: residues mod P are < 2^31, so g beyond P would leave values unused.
MAX_G = 1 << 30


class LocalHashing(FrequencyOracle):
    """Local hashing with hash range ``g``; reports are ``(n, 2)`` int64 ``[seed, y]``. See the module docstring."""

    #: dtype of the report rows ``privatize`` returns ([seed, y]).
    report_dtype = np.int64
    #: ``((a·v+b) mod P) mod g`` is 2-universal but not 3-wise independent: the supports of two items by a holder
    #: of a third are correlated, so a sum of several item estimates has more variance than the idealised formula
    independent_supports = False

    def __init__(self, epsilon: float, k: int, g: int) -> None:
        self.epsilon = oracle_epsilon(epsilon)
        self.k = check_int(k, "k", minimum=2, maximum=MAX_ITEM + 1)
        self.g = check_int(g, "g", minimum=2, maximum=MAX_G)
        #: p: P[y = h_s(x)]; q_grr: probability of each other hash value (client side); q = 1/g (server side).
        self.p, self.q_grr = keep_probability(self.epsilon, self.g - 1)
        self.q = 1.0 / self.g

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        x = user_values(values, self.k)
        seeds = draw_seeds(x.shape[0], rng)
        y = grr_perturb(hash_values(seeds, x, self.g), self.g, self.p, rng)
        return np.stack([seeds, y], axis=1)

    def privatize_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        """``[seed, y]`` of one value: the seed, then GRR's draws, as :meth:`privatize` draws them
        (:func:`protocols.hashing.hash_one`)."""
        x = check_category(value, self.k)
        seed = int(rng.integers(0, 1 << SEED_BITS, dtype=np.int64))
        y = grr_perturb_one(hash_one(seed, x, self.g), self.g, self.p, rng)
        return np.array([seed, y], dtype=np.int64)

    def support_counts(self, reports: np.ndarray) -> np.ndarray:
        seeds, y = self._split(reports)
        return support_counts(seeds, y, self.k, self.g)

    def support_prefix_moments(self, reports: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The support counts and ``Σ_i S_i(m)²``, S_i(m) the number of items ≤ m report i supports
        (:func:`protocols.hashing.support_prefix_moments`)."""
        seeds, y = self._split(reports)
        return support_prefix_moments(seeds, y, self.k, self.g)

    def n_reports(self, reports: np.ndarray) -> int:
        return int(np.asarray(reports).shape[0])

    def likelihood(self, reports: Any, value: int) -> np.ndarray:
        """Exact ``P[y | s, value]`` for each report ``[s, y]``: p if ``h_s(value) = y`` else q'.

        The seed's own probability (uniform over 2^62 seeds) does not depend on the input, so it cancels in every
        likelihood ratio; this is the conditional law given the public seed.
        """
        seeds, y = self._split(reports)
        v = int(user_values(value, self.k)[0])
        return np.where(hash_values(seeds, v, self.g) == y, self.p, self.q_grr)

    def _split(self, reports: Any) -> tuple[np.ndarray, np.ndarray]:
        arr = report_matrix(reports, 2).astype(np.int64, copy=False)
        seeds, y = arr[:, 0], arr[:, 1]
        if arr.size:
            if seeds.min() < 0 or seeds.max() >= (1 << SEED_BITS):
                raise ValueError(f"hash seeds must lie in [0, 2^{SEED_BITS})")
            if y.min() < 0 or y.max() >= self.g:
                raise ValueError(f"hashed reports must lie in [0, {self.g}); got [{y.min()}, {y.max()}]")
        return seeds, y

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "g": self.g}


class BLH(LocalHashing):
    """Binary local hashing (g = 2)."""

    def __init__(self, epsilon: float, k: int) -> None:
        super().__init__(epsilon, k, g=2)

    def _params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "k": self.k}


class OLH(LocalHashing):
    """Optimized local hashing: ``g = round(e^ε) + 1`` minimises the variance (Wang et al. 2017, §4.4)."""

    def __init__(self, epsilon: float, k: int) -> None:
        eps = oracle_epsilon(epsilon)
        if eps > math.log(MAX_G - 1):
            raise ValueError(f"epsilon={eps} gives g = round(e^ε)+1 > {MAX_G}: too large for OLH's hash range")
        super().__init__(eps, k, g=round(math.exp(eps)) + 1)

    def _params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "k": self.k}
