"""L-GRR: longitudinal generalized randomized response (GRR memoized with ε∞, then fresh GRR so one report is ε1).

Arcolezi, Couchot, Al Bouna & Xiao, "Improving the utility of locally differentially private protocols for
longitudinal and multidimensional frequency estimates" (Digital Communications and Networks, 2022).
PRR: z = v w.p. p1 = e^{ε∞}/(e^{ε∞}+k-1), else uniform over the k-1 others (memoized per value).
IRR: y = z w.p. p2 = e^{ε2}/(e^{ε2}+k-1), else uniform over the others (fresh), with ε2 from
:func:`protocols.longitudinal.chains.grr_irr_epsilon` so that P[y | v]/P[y | v'] ≤ e^{ε1} exactly.
Estimator and variance: :class:`protocols.longitudinal.chains.TwoStageChain`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import check_categories, check_int
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol, grr_fresh
from protocols.longitudinal.chains import TwoStageChain, check_budget_pair, grr_chain, grr_irr_epsilon
from protocols.longitudinal.prf import prf_uniform

__all__ = ["LGRR", "LGRRClient", "grr_from_uniforms", "check_category"]

_STREAM_KEEP, _STREAM_OTHER = 101, 102


def check_category(value: Any, k: int, name: str = "value") -> int:
    """One categorical input: an integer in [0, k)."""
    return int(check_categories(np.asarray([value]), k, name)[0])


def grr_from_uniforms(v: Any, u_keep: Any, u_other: Any, k: int, p: float) -> np.ndarray:
    """GRR over [k] driven by given uniforms: v if u_keep < p, else the (⌊u_other·(k-1)⌋+1)-th symbol after v."""
    v = np.asarray(v, dtype=np.int64)
    other = (v + 1 + np.floor(np.asarray(u_other) * (k - 1)).astype(np.int64)) % k
    return np.where(np.asarray(u_keep) < p, v, other)


class LGRR(MemoizedProtocol):
    """Longitudinal GRR over [0, k). ``epsilon_inf`` > ``epsilon_1`` > 0."""

    name = "L-GRR"

    def __init__(self, epsilon_inf: float, epsilon_1: float, k: int) -> None:
        self.epsilon_inf, self.epsilon_1 = check_budget_pair(epsilon_inf, epsilon_1)
        self.k = check_int(k, "k", 2)
        self.chain: TwoStageChain = grr_chain(self.epsilon_inf, self.epsilon_1, self.k)
        self.epsilon_irr = grr_irr_epsilon(self.epsilon_inf, self.epsilon_1, self.k)

    def params(self) -> dict[str, Any]:
        return {"epsilon_inf": self.epsilon_inf, "epsilon_1": self.epsilon_1, "k": self.k}

    @property
    def n_slots(self) -> int:
        return self.k

    @property
    def irr_input_epsilon(self) -> float:
        return self.epsilon_irr

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of f̂_v (divide by n): see :meth:`TwoStageChain.variance`."""
        return self.chain.variance(f)

    def _check_values(self, values: Any) -> np.ndarray:
        return check_categories(values, self.k)

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        v = self._check_fleet_values(values, fleet)
        c = self.chain
        z = grr_from_uniforms(
            v, prf_uniform(fleet.keys, v, _STREAM_KEEP), prf_uniform(fleet.keys, v, _STREAM_OTHER), self.k, c.p1
        )
        y = grr_fresh(z, self.k, c.p2, rng)
        fleet.rounds += 1
        return y, self._charge(fleet, v)

    def round_counts(self, reports: Any) -> np.ndarray:
        """Sufficient statistics of a round: how many reports name each symbol (additive over reports)."""
        y = check_categories(reports, self.k, "reports").ravel()
        return np.bincount(y, minlength=self.k)

    def estimate_counts(self, counts: Any, n: int) -> np.ndarray:
        return self.chain.estimate(np.asarray(counts, dtype=float), n)

    def estimate_round(self, reports: Any) -> np.ndarray:
        y = check_categories(reports, self.k, "reports").ravel()
        return self.estimate_counts(self.round_counts(y), y.size)


class LGRRClient(MemoizedClient):
    """Device side of L-GRR; ``report(v)`` returns the reported symbol (int)."""

    protocol: LGRR

    def _slot(self, value: Any) -> int:
        return check_category(value, self.protocol.k)

    def _draw_prr(self, slot: int, gen: np.random.Generator) -> int:
        u = gen.random(2)
        return int(grr_from_uniforms(slot, u[0], u[1], self.protocol.k, self.protocol.chain.p1))

    def _irr(self, prr: int) -> int:
        return int(grr_fresh(np.asarray([prr]), self.protocol.k, self.protocol.chain.p2, self.rng)[0])


LGRR.client_class = LGRRClient
