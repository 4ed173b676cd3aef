"""The longitudinal protocols compared on the evolving dimension (experiments 4 and 6), and the peers' versions.

Budgets: every protocol gets the same long-run budget per memo entry **ε∞ = ε**. Two-stage chains (L-GRR,
L-OSUE, LOLOHA, RAPPOR) add a fresh IRR so that one report is **ε1 = ε/2**-LDP (α = ε1/ε∞ = 0.5, as in Arcolezi et
al., EDBT 2023); dBitFlipPM and memoized 1BitMean have no IRR (ε1 = ε∞ = ε). RAPPOR is calibrated to the same pair:
f from ε∞ = 2h·ln((1 - f/2)/(f/2)), then the IRR's (p, q) = (1 - q, q) solving ε1 numerically (h = 1, 128 Bloom bits,
32 cohorts: the best of the configurations we tried on Syn).

Peers: multi-freq-ldpy 0.2.5 (``long_freq_est``: L_GRR, L_OSUE, L_LH = LOLOHA's per-round report with
``optimal=False`` (g = 2, BiLOLOHA) or ``True`` (OLOLOHA), dBitFlipPM). Their clients are stateless functions (a
fresh PRR per call), so one call per user reproduces the per-round report distribution of the memoized protocol —
per-round utility, not memoization, is what they are compared on. Their ``*_Aggregator_MI`` estimators clip at 0
and renormalise.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq

from protocols.longitudinal import LGRR, LOLOHA, LOSUE, RAPPOR, DBitFlipPM, LongitudinalProtocol

__all__ = [
    "IRR_FRACTION",
    "rappor_for",
    "frequency_protocols",
    "PeerProtocol",
    "peer_protocols",
]

#: ε1 = IRR_FRACTION · ε∞ for the two-stage chains.
IRR_FRACTION = 0.5


def rappor_for(epsilon_inf: float, epsilon_1: float, k: int, num_hashes: int = 1, num_bits: int = 128,
               num_cohorts: int = 32) -> RAPPOR:
    """RAPPOR with exactly (ε∞, ε1): f/2 = 1/(1 + e^{ε∞/(2h)}); IRR p = 1 - q with q solving ε1 (bisection).

    ε1 increases continuously from 0 (q → 1/2) to ε∞ (q → 1), so any ε1 < ε∞ has one solution.
    """
    if not 0 < epsilon_1 < epsilon_inf:
        raise ValueError(f"need 0 < ε1 < ε∞, got ε1={epsilon_1}, ε∞={epsilon_inf}")
    f = 2.0 / (1.0 + math.exp(epsilon_inf / (2 * num_hashes)))

    def make(q: float) -> RAPPOR:
        return RAPPOR(num_bits, num_hashes, num_cohorts, f, 1.0 - q, q, domain_size=k)

    q = brentq(lambda q: make(q).epsilon_1 - epsilon_1, 0.5 + 1e-12, 1.0 - 1e-12, xtol=1e-14)
    return make(q)


def frequency_protocols(epsilon: float, k: int) -> dict[str, LongitudinalProtocol]:
    """The item-level frequency protocols at ε∞ = ε, ε1 = ε/2 (chains) over [0, k)."""
    e1 = IRR_FRACTION * epsilon
    return {
        "L-GRR": LGRR(epsilon, e1, k),
        "L-OSUE": LOSUE(epsilon, e1, k),
        "BiLOLOHA": LOLOHA.bi(epsilon, e1, k),
        "OLOLOHA": LOLOHA.optimal(epsilon, e1, k),
        "RAPPOR": rappor_for(epsilon, e1, k),
        "dBitFlipPM (b=k, d=1)": DBitFlipPM(epsilon, k, k, 1),
        "dBitFlipPM (b=k, d=k)": DBitFlipPM(epsilon, k, k, k),
    }


@dataclass(frozen=True)
class PeerProtocol:
    """A peer's per-round protocol: ``report(values)`` (one Python call per user) and ``estimate(reports)``."""

    label: str
    report: Callable[[np.ndarray], list[Any]]
    estimate: Callable[[list[Any]], np.ndarray]


def peer_protocols(epsilon: float, k: int, jit: bool = True) -> list[PeerProtocol]:
    """multi-freq-ldpy's longitudinal protocols at the same (ε∞, ε1) (empty if the peer is not installed).

    ``jit=False`` leaves out dBitFlipPM, whose numba client is compiled anew (seconds) in every new process.
    """
    try:
        mod = {n: importlib.import_module(f"multi_freq_ldpy.long_freq_est.{n}")
               for n in ("L_GRR", "L_OSUE", "L_LH", "dBitFlipPM")}
    except ImportError:
        return []
    from simulations.bench.frequency import xxhash_str_compat  # the peers' xxhash needs bytes on xxhash >= 4

    xxhash_str_compat(mod["L_LH"])
    e1 = IRR_FRACTION * epsilon
    grr, osue, lh, dbit = mod["L_GRR"], mod["L_OSUE"], mod["L_LH"], mod["dBitFlipPM"]
    peers = [
        PeerProtocol("L-GRR",
                     lambda v: [grr.L_GRR_Client(int(x), k, epsilon, e1) for x in v],
                     lambda r: np.asarray(grr.L_GRR_Aggregator_MI(r, k, epsilon, e1), dtype=float)),
        PeerProtocol("L-OSUE",
                     lambda v: [osue.L_OSUE_Client(int(x), k, epsilon, e1) for x in v],
                     lambda r: np.asarray(osue.L_OSUE_Aggregator_MI(r, epsilon, e1), dtype=float)),
        PeerProtocol("BiLOLOHA",
                     lambda v: [lh.L_LH_Client(int(x), k, epsilon, e1, False) for x in v],
                     lambda r: np.asarray(lh.L_LH_Aggregator_MI(r, k, epsilon, e1, False), dtype=float)),
        PeerProtocol("OLOLOHA",
                     lambda v: [lh.L_LH_Client(int(x), k, epsilon, e1, True) for x in v],
                     lambda r: np.asarray(lh.L_LH_Aggregator_MI(r, k, epsilon, e1, True), dtype=float)),
        PeerProtocol("dBitFlipPM (b=k, d=k)",
                     lambda v: [dbit.dBitFlipPM_Client(int(x), k, k, k, epsilon) for x in v],
                     lambda r: np.asarray(dbit.dBitFlipPM_Aggregator_MI(r, k, k, epsilon), dtype=float)),
    ]
    return peers if jit else [p for p in peers if not p.label.startswith("dBitFlipPM")]
