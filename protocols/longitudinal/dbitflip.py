"""dBitFlipPM (Ding, Kulkarni & Yekhanin, "Collecting telemetry data privately", NeurIPS 2017), SPEC §3.11.

The domain [0, k) is cut into b equal buckets, bucket(v) = ⌊v·b/k⌋. Each device samples d distinct buckets
j_1..j_d once, for life. Its response is d bits: bit i = 1 w.p. e^{ε/2}/(e^{ε/2}+1) if bucket(v) = j_i, else
w.p. 1/(e^{ε/2}+1). Two values change at most two bits, so one response is ε-LDP. Responses are memoized per
memo slot: the position i of bucket(v) among the sampled buckets, or a single slot "⊥" for every bucket that was
not sampled (all its bits have the same distribution), hence at most min(d+1, b) memo entries and a long-run
spend ≤ min(d+1, b)·ε (SPEC §4). There is no fresh IRR: a memoized response is repeated verbatim, so ε1 = ε∞ = ε
and a change of memo slot is visible (see :mod:`protocols.longitudinal.base`).

Server: with w = (bit·(e^{ε/2}+1) - 1)/(e^{ε/2} - 1) (unbiased for the bucket indicator), the fraction of users
in bucket j is estimated by f̂_j = (b/(n d)) Σ_users Σ_i [j_i = j] w_i; per-user variance
(b/d)·e^{ε/2}/(e^{ε/2}-1)² + f_j (b/d - 1).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from protocols.accounting import dbitflip_bound
from protocols.base import check_categories, check_epsilon, check_int
from protocols.longitudinal.base import FleetState, MemoizedClient, MemoizedProtocol
from protocols.longitudinal.grr import check_category
from protocols.longitudinal.prf import prf_uniform

__all__ = ["DBitFlipPM", "DBitFlipClient", "DBitReports"]

_STREAM_PRR = 501


class DBitReports(NamedTuple):
    """A batch of dBitFlipPM responses: sampled buckets (n, d) and their bits (n, d) uint8."""

    buckets: np.ndarray
    bits: np.ndarray


class DBitFlipPM(MemoizedProtocol):
    """dBitFlipPM over [0, k) with b buckets (b ≤ k) and d sampled buckets per device (1 ≤ d ≤ b)."""

    name = "dBitFlipPM"

    def __init__(self, epsilon: float, k: int, b: int, d: int) -> None:
        self.epsilon_inf = self.epsilon_1 = check_epsilon(epsilon)
        self.k = check_int(k, "k", 2)
        self.b = check_int(b, "b", 2, self.k)
        self.d = check_int(d, "d", 1, self.b)
        half = math.exp(self.epsilon_inf / 2)
        self.p_bit, self.q_bit = half / (half + 1), 1 / (half + 1)

    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon_inf, "k": self.k, "b": self.b, "d": self.d}

    @property
    def n_slots(self) -> int:
        return self.d + 1

    def longitudinal_bound(self, n_distinct: int | None = None) -> float:
        """ε · min(d+1, b, n_distinct) (:func:`protocols.accounting.dbitflip_bound`)."""
        return dbitflip_bound(self.d, self.b, self.epsilon_inf, n_distinct)

    @property
    def irr_input_epsilon(self) -> float:
        return math.inf

    def bucket(self, values: Any) -> np.ndarray:
        """⌊v·b/k⌋ for v ∈ [0, k)."""
        return check_categories(values, self.k) * self.b // self.k

    def variance(self, f: Any = 0.0) -> Any:
        """Per-user variance of the bucket frequency estimate at true bucket frequency f (divide by n)."""
        f = np.asarray(f, dtype=float)
        half = math.exp(self.epsilon_inf / 2)
        out = (self.b / self.d) * half / (half - 1) ** 2 + f * (self.b / self.d - 1)
        return float(out) if out.ndim == 0 else out

    def _check_values(self, values: Any) -> np.ndarray:
        return check_categories(values, self.k)

    def _check_sampled(self, sampled: Any, n: int) -> np.ndarray:
        s = np.asarray(sampled, dtype=np.int64)
        s = np.broadcast_to(s, (n, self.d)).copy() if s.ndim == 1 else s
        if s.shape != (n, self.d) or s.min() < 0 or s.max() >= self.b:
            raise ValueError(f"sampled buckets must be d={self.d} distinct integers in [0, {self.b}) per device")
        if np.any(np.diff(np.sort(s, axis=1), axis=1) == 0):
            raise ValueError("sampled buckets must be distinct")
        return s

    def memo_slots(self, values: Any, *, sampled: Any = None, **device: Any) -> list[int]:
        """Memo slot per value for a device with sampled buckets ``sampled``: position in it, or d for ⊥."""
        if sampled is None or device:
            raise ValueError("dBitFlipPM memo slots need the device's sampled buckets: memo_slots(values, sampled=...)")
        s = self._check_sampled(sampled, 1)[0]
        out = []
        for bk in self.bucket(np.asarray(values).ravel()):
            hit = np.flatnonzero(s == bk)
            out.append(int(hit[0]) if hit.size else self.d)
        return out

    def _init_fleet(self, fleet: FleetState, rng: np.random.Generator, **fixed: Any) -> None:
        sampled = fixed.pop("sampled", None)
        if fixed:
            raise ValueError(f"unknown fleet parameters {sorted(fixed)}")
        if sampled is None:
            fleet.aux["sampled"] = np.argsort(rng.random((fleet.n, self.b)), axis=1)[:, : self.d]
        else:
            fleet.aux["sampled"] = self._check_sampled(sampled, fleet.n)

    def privatize_round(
        self, values: Any, fleet: FleetState, rng: np.random.Generator
    ) -> tuple[DBitReports, np.ndarray]:
        v = self._check_fleet_values(values, fleet)
        sampled = fleet.aux["sampled"]
        match = sampled == self.bucket(v)[:, None]
        slot = np.where(match.any(axis=1), match.argmax(axis=1), self.d)
        cells = slot[:, None] * self.d + np.arange(self.d)[None, :]
        u = prf_uniform(fleet.keys[:, None], cells, _STREAM_PRR)
        bits = (u < np.where(match, self.p_bit, self.q_bit)).astype(np.uint8)
        fleet.rounds += 1
        return DBitReports(sampled.copy(), bits), self._charge(fleet, slot)

    def estimate_round(self, reports: DBitReports) -> np.ndarray:
        """Unbiased bucket frequencies (b,)."""
        buckets, bits = np.asarray(reports.buckets), np.asarray(reports.bits, dtype=float)
        if buckets.ndim != 2 or buckets.shape[1] != self.d or bits.shape != buckets.shape:
            raise ValueError(f"reports must hold (n, {self.d}) buckets and bits")
        n = buckets.shape[0]
        if n == 0:
            raise ValueError("cannot estimate frequencies from zero reports")
        half = math.exp(self.epsilon_inf / 2)
        w = (bits * (half + 1) - 1) / (half - 1)
        sums = np.bincount(buckets.ravel(), weights=w.ravel(), minlength=self.b)
        return sums * self.b / (n * self.d)


class DBitFlipClient(MemoizedClient):
    """Device side of dBitFlipPM: d sampled buckets for life; ``report(v)`` returns ``(buckets, bits)``."""

    protocol: DBitFlipPM

    def __init__(self, protocol: DBitFlipPM, *, sampled: Any = None, **kwargs: Any) -> None:
        super().__init__(protocol, **kwargs)
        if sampled is None:
            sampled = self.rng.choice(protocol.b, size=protocol.d, replace=False)
        self.sampled = protocol._check_sampled(sampled, 1)[0]

    def _slot(self, value: Any) -> int:
        bk = int(self.protocol.bucket([check_category(value, self.protocol.k)])[0])
        hit = np.flatnonzero(self.sampled == bk)
        return int(hit[0]) if hit.size else self.protocol.d

    def _draw_prr(self, slot: int, gen: np.random.Generator) -> list[int]:
        match = np.arange(self.protocol.d) == slot
        u = gen.random(self.protocol.d)
        return [int(x) for x in u < np.where(match, self.protocol.p_bit, self.protocol.q_bit)]

    def _irr(self, prr: list[int]) -> tuple[tuple[int, ...], np.ndarray]:
        return (tuple(int(s) for s in self.sampled), np.asarray(prr, dtype=np.uint8))

    def _device_state(self) -> dict[str, Any]:
        return {"sampled": [int(s) for s in self.sampled]}

    def _load_device_state(self, state: dict[str, Any]) -> None:
        if set(state) != {"sampled"}:
            raise ValueError("dBitFlipPM device state must contain exactly 'sampled'")
        self.sampled = self.protocol._check_sampled(state["sampled"], 1)[0]


DBitFlipPM.device_parameter = "sampled"
DBitFlipPM.client_class = DBitFlipClient
