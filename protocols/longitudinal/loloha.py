"""LOLOHA — LOngitudinal LOcal HAshing (Arcolezi, Pinzón, Palamidessi & Gambs, "Frequency estimation of evolving
data under local differential privacy", EDBT 2023).

Each device draws a hash seed for life; its value v is hashed to H(v) ∈ [g] (2-universal family of
:mod:`protocols.hashing`). The PRR is GRR over [g] with ε∞, memoized per *hashed* value, so a device creates at
most g memo entries and its long-run spend is ≤ g·ε∞ whatever the number of value changes (SPEC §3.10, §4).
The IRR is GRR over [g] with ε_IRR chosen so that one report is exactly ε1-LDP:

    e^{ε_IRR} = (e^{ε1}(e^{ε∞} - 1) + (e^{ε1} - 1)(g - 1)) / (e^{ε∞} - e^{ε1}),

which for g = 2 (BiLOLOHA) is the paper's ε_IRR = ln((e^{ε∞+ε1} - 1)/(e^{ε∞} - e^{ε1})) (SPEC §3.10). The
paper's analysis applies that g = 2 expression for every g, which for g > 2 makes one report *less* than
ε1-LDP (safe but wasteful); the g-dependent form above is exact. The authors' code and multi-freq-ldpy follow
the paper (its g = 2 expression for every g): exact for BiLOLOHA, over-randomised for OLOLOHA's g > 2.

Report = (seed, y). Server: C_v = #{users with H_seed(v) = y} (:func:`protocols.hashing.support_counts`, the one
local-hashing decoder, shared with OLH/BLH); with q1' = 1/g (a random hash collides with
probability 1/g), f̂_v = (C_v - n/g) / (n (p1 - 1/g)(p2 - q2)) — :class:`TwoStageChain` with q1 = 1/g.
OLOLOHA picks g from the paper's closed form (the minimiser over real g of the approximate variance):

    g = max(2, round((√(e^{4ε∞} - 14e^{2ε∞} - 12e^{2ε∞(α+1)} + 12e^{ε∞(α+1)} + 12e^{ε∞(α+3)} + 1)
                       - e^{2ε∞} + 6e^{ε∞} - 6e^{αε∞} + 1) / (6(e^{ε∞} - e^{αε∞})))),   α = ε1/ε∞.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from protocols.accounting import loloha_bound
from protocols.base import check_categories, check_int
from protocols.hashing import P, draw_seeds, hash_values, support_counts
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol, grr_fresh
from protocols.longitudinal.chains import TwoStageChain, check_budget_pair, grr_chain, grr_irr_epsilon
from protocols.longitudinal.grr import check_category, grr_from_uniforms
from protocols.longitudinal.prf import prf_uniform

__all__ = ["LOLOHA", "LOLOHAClient", "optimal_g"]

_STREAM_KEEP, _STREAM_OTHER = 301, 302


def optimal_g(epsilon_inf: float, epsilon_1: float) -> int:
    """OLOLOHA's hash range from the paper's closed form (module docstring); at least 2."""
    e_inf, e_1 = check_budget_pair(epsilon_inf, epsilon_1)
    alpha = e_1 / e_inf
    ex = math.exp
    disc = (
        ex(4 * e_inf)
        - 14 * ex(2 * e_inf)
        - 12 * ex(2 * e_inf * (alpha + 1))
        + 12 * ex(e_inf * (alpha + 1))
        + 12 * ex(e_inf * (alpha + 3))
        + 1
    )
    num = math.sqrt(disc) - ex(2 * e_inf) + 6 * ex(e_inf) - 6 * ex(alpha * e_inf) + 1
    g = num / (6 * (ex(e_inf) - ex(alpha * e_inf)))
    return max(2, int(round(g)))


class LOLOHA(MemoizedProtocol):
    """LOLOHA over [0, k) with hash range g (an int ≥ 2, or ``"optimal"`` for OLOLOHA).

    Use :meth:`bi` (g = 2) and :meth:`optimal` (OLOLOHA) for the paper's two variants.
    """

    name = "LOLOHA"

    def __init__(self, epsilon_inf: float, epsilon_1: float, k: int, g: int | str = 2) -> None:
        self.epsilon_inf, self.epsilon_1 = check_budget_pair(epsilon_inf, epsilon_1)
        self.k = check_int(k, "k", 2)
        if isinstance(g, str):
            if g != "optimal":
                raise ValueError(f"g must be an integer >= 2 or 'optimal', got {g!r}")
            g = optimal_g(self.epsilon_inf, self.epsilon_1)
        self.g = check_int(g, "g", 2, P - 1)
        self.chain: TwoStageChain = grr_chain(self.epsilon_inf, self.epsilon_1, self.g)
        self.server_chain = TwoStageChain(self.chain.p1, 1.0 / self.g, self.chain.p2, self.chain.q2)
        self.epsilon_irr = grr_irr_epsilon(self.epsilon_inf, self.epsilon_1, self.g)

    @classmethod
    def bi(cls, epsilon_inf: float, epsilon_1: float, k: int) -> LOLOHA:
        """BiLOLOHA: g = 2."""
        return cls(epsilon_inf, epsilon_1, k, g=2)

    @classmethod
    def optimal(cls, epsilon_inf: float, epsilon_1: float, k: int) -> LOLOHA:
        """OLOLOHA: g from :func:`optimal_g`."""
        return cls(epsilon_inf, epsilon_1, k, g="optimal")

    def params(self) -> dict[str, Any]:
        return {"epsilon_inf": self.epsilon_inf, "epsilon_1": self.epsilon_1, "k": self.k, "g": self.g}

    @property
    def n_slots(self) -> int:
        return self.g

    @property
    def irr_input_epsilon(self) -> float:
        return self.epsilon_irr

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """ε∞ · min(g, k, n_distinct): at most g hashed values, and never more than the values seen
        (:func:`protocols.accounting.loloha_bound`)."""
        return loloha_bound(self.g, self.epsilon_inf, self.k, n_distinct)

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of f̂_v: (f p*(1-p*) + (1-f)(1/g)(1-1/g)) / ((p1 - 1/g)(p2 - q2))² (ideal hashing)."""
        return self.server_chain.variance(f)

    def _check_values(self, values: Any) -> np.ndarray:
        return check_categories(values, self.k)

    def memo_slots(self, values: Any, *, seed: int | None = None, **device: Any) -> list[int]:
        """Hashed values H_seed(v) — the memo slots — of a device with hash seed ``seed``."""
        if seed is None or device:
            raise ValueError("LOLOHA memo slots need the device's hash seed: memo_slots(values, seed=...)")
        v = self._check_values(np.asarray(values)).ravel()
        return [int(h) for h in hash_values(np.int64(seed), v, self.g)]

    def _init_fleet(self, fleet: FleetState, rng: np.random.Generator, **fixed: Any) -> None:
        seeds = fixed.pop("seeds", None)
        if fixed:
            raise ValueError(f"unknown fleet parameters {sorted(fixed)}")
        if seeds is None:
            fleet.aux["seeds"] = draw_seeds(fleet.n, rng)
        else:
            fleet.aux["seeds"] = np.broadcast_to(np.asarray(seeds, dtype=np.int64), (fleet.n,)).copy()

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reports (n, 2) int64: column 0 the device's hash seed, column 1 the reported hashed value y ∈ [g]."""
        v = self._check_fleet_values(values, fleet)
        seeds = fleet.aux["seeds"]
        h = hash_values(seeds, v, self.g)
        z = grr_from_uniforms(
            h, prf_uniform(fleet.keys, h, _STREAM_KEEP), prf_uniform(fleet.keys, h, _STREAM_OTHER), self.g, self.chain.p1
        )
        y = grr_fresh(z, self.g, self.chain.p2, rng)
        fleet.rounds += 1
        return np.column_stack([seeds, y]), self._charge(fleet, h)

    def round_counts(self, reports: Any) -> np.ndarray:
        """Sufficient statistics of a round: how many reports support each value (additive over reports)."""
        rep = np.asarray(reports)
        if rep.ndim != 2 or rep.shape[1] != 2:
            raise ValueError(f"LOLOHA reports must have shape (n, 2) [seed, y], got {rep.shape}")
        return support_counts(rep[:, 0], rep[:, 1], self.k, self.g)

    def estimate_counts(self, counts: Any, n: int) -> np.ndarray:
        return self.server_chain.estimate(np.asarray(counts, dtype=float), n)

    def estimate_round(self, reports: Any) -> np.ndarray:
        return self.estimate_counts(self.round_counts(reports), np.asarray(reports).shape[0])


class LOLOHAClient(MemoizedClient):
    """Device side of LOLOHA: a hash seed for life; ``report(v)`` returns ``(seed, y)``."""

    protocol: LOLOHA

    def __init__(self, protocol: LOLOHA, *, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        self.seed = int(draw_seeds(1, self.rng)[0]) if seed is None else self._check_seed(seed)

    @staticmethod
    def _check_seed(seed: Any) -> int:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < (1 << 62):
            raise ValueError(f"hash seed must be an integer in [0, 2^62), got {seed!r}")
        return int(seed)

    def _slot(self, value: Any) -> int:
        v = check_category(value, self.protocol.k)
        return int(hash_values(np.int64(self.seed), np.int64(v), self.protocol.g))

    def _draw_prr(self, slot: int, gen: np.random.Generator) -> int:
        u = gen.random(2)
        return int(grr_from_uniforms(slot, u[0], u[1], self.protocol.g, self.protocol.chain.p1))

    def _irr(self, prr: int) -> tuple[int, int]:
        y = int(grr_fresh(np.asarray([prr]), self.protocol.g, self.protocol.chain.p2, self.rng)[0])
        return (self.seed, y)

    def _device_state(self) -> dict[str, Any]:
        return {"hash_seed": self.seed}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"hash_seed"}:
            raise ValueError("LOLOHA device state must contain exactly 'hash_seed'")
        self.seed = self._check_seed(state["hash_seed"])


LOLOHA.device_parameter = "seed"
LOLOHA.client_class = LOLOHAClient
