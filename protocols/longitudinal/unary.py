"""L-OSUE and L-SUE: unary-encoding chains (the user's one-hot vector, PRR memoized per value, IRR per bit).

Arcolezi, Couchot, Al Bouna & Xiao (Digital Communications and Networks, 2022): L-SUE is "basic one-time RAPPOR"
(SUE(ε∞) memoized, then SUE) and L-OSUE starts with OUE(ε∞) (p1 = 1/2, q1 = 1/(e^{ε∞}+1)) then SUE, which has
lower variance. Bit j of the PRR is 1 w.p. p1 if j = v else q1; bit j of the report is 1 w.p. p2 if the PRR bit
is 1 else q2 = 1 - p2. One report is ln(p*(1-q*)/(q*(1-p*))) = ε1-LDP; see :mod:`protocols.longitudinal.chains`.
Reports are (k,) uint8 vectors (fleet: (n, k)); C_v is the column sum.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import numpy as np

from protocols.base import check_categories, check_int
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol
from protocols.longitudinal.chains import TwoStageChain, check_budget_pair, osue_chain, sue_chain, ue_epsilon
from protocols.longitudinal.grr import check_category
from protocols.longitudinal.prf import prf_uniform

__all__ = ["LOSUE", "LSUE", "LongitudinalUE", "LongitudinalUEClient"]

_STREAM_PRR = 201


def _pack_bits(bits: np.ndarray) -> str:
    return np.packbits(np.asarray(bits, dtype=np.uint8)).tobytes().hex()


def _unpack_bits(blob: str, k: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes.fromhex(blob), dtype=np.uint8))[:k].astype(bool)


class LongitudinalUE(MemoizedProtocol):
    """Common code of the unary-encoding chains (subclasses pick the chain)."""

    def __init__(self, epsilon_inf: float, epsilon_1: float, k: int) -> None:
        self.epsilon_inf, self.epsilon_1 = check_budget_pair(epsilon_inf, epsilon_1)
        self.k = check_int(k, "k", 2)
        self.chain: TwoStageChain = self._make_chain()
        if not math.isclose(ue_epsilon(self.chain.p_star, self.chain.q_star), self.epsilon_1, rel_tol=1e-9):
            raise ValueError(f"(ε∞={self.epsilon_inf:g}, ε1={self.epsilon_1:g}) is outside the range where the unary "
                             "chain's parameters are numerically exact")

    @abstractmethod
    def _make_chain(self) -> TwoStageChain:
        """The two-stage chain of (ε∞, ε1): OUE or SUE first, then SUE."""

    def params(self) -> dict[str, Any]:
        return {"epsilon_inf": self.epsilon_inf, "epsilon_1": self.epsilon_1, "k": self.k}

    @property
    def n_slots(self) -> int:
        return self.k

    @property
    def irr_input_epsilon(self) -> float:
        """All k PRR bits may differ between two memo entries: k · ln(p2/q2)."""
        return self.k * math.log(self.chain.p2 / self.chain.q2)

    def variance(self, f: Any = 0.0) -> Any:
        return self.chain.variance(f)

    def _check_values(self, values: Any) -> np.ndarray:
        return check_categories(values, self.k)

    def prr_bits(self, v: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        """PRR bits from uniforms (…, k): bit j = [u_j < p1] if j = v else [u_j < q1]."""
        onehot = np.arange(self.k) == np.asarray(v)[..., None]
        return uniforms < np.where(onehot, self.chain.p1, self.chain.q1)

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        v = self._check_fleet_values(values, fleet)
        cells = v[:, None] * self.k + np.arange(self.k)[None, :]
        prr = self.prr_bits(v, prf_uniform(fleet.keys[:, None], cells, _STREAM_PRR))
        reports = (rng.random(prr.shape) < np.where(prr, self.chain.p2, self.chain.q2)).astype(np.uint8)
        fleet.rounds += 1
        return reports, self._charge(fleet, v)

    def estimate_round(self, reports: Any) -> np.ndarray:
        bits = np.asarray(reports)
        if bits.ndim != 2 or bits.shape[1] != self.k:
            raise ValueError(f"reports must have shape (n, {self.k}), got {bits.shape}")
        return self.chain.estimate(bits.sum(axis=0, dtype=np.int64), bits.shape[0])


class LOSUE(LongitudinalUE):
    """L-OSUE: OUE(ε∞) memoized, then SUE (lowest-variance unary chain of Arcolezi et al.)."""

    name = "L-OSUE"

    def _make_chain(self) -> TwoStageChain:
        return osue_chain(self.epsilon_inf, self.epsilon_1)


class LSUE(LongitudinalUE):
    """L-SUE: SUE(ε∞) memoized, then SUE (basic one-time RAPPOR on a one-hot vector)."""

    name = "L-SUE"

    def _make_chain(self) -> TwoStageChain:
        return sue_chain(self.epsilon_inf, self.epsilon_1)


class LongitudinalUEClient(MemoizedClient):
    """Device side of L-OSUE / L-SUE; ``report(v)`` returns a (k,) uint8 vector."""

    protocol: LongitudinalUE

    def _slot(self, value: Any) -> int:
        return check_category(value, self.protocol.k)

    def _draw_prr(self, slot: int, gen: np.random.Generator) -> str:
        return _pack_bits(self.protocol.prr_bits(np.asarray(slot), gen.random(self.protocol.k)))

    def _irr(self, prr: str) -> np.ndarray:
        bits = _unpack_bits(prr, self.protocol.k)
        c = self.protocol.chain
        return (self.rng.random(self.protocol.k) < np.where(bits, c.p2, c.q2)).astype(np.uint8)


LongitudinalUE.client_class = LongitudinalUEClient
