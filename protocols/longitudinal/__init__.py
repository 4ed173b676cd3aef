"""Longitudinal (memoized) LDP protocols: report the same or slowly changing value many times with bounded,
accounted privacy loss (SPEC §3.9–§3.12, §4).

Every protocol has a per-device client (``protocol.client()``; ``report(value) -> LongitudinalReport`` carrying the
report and the ε the ledger must charge), a vectorised fleet simulator (``new_fleet`` / ``privatize_round`` /
``simulate_rounds``) and a vectorised aggregator (``estimate_round``); ``epsilon_inf``, ``epsilon_1`` and
``longitudinal_bound`` state the guarantees, ``transcript_epsilon_bound`` the rigorous bound for a pair of value
sequences (memoization protects values, not the times at which they change — see :mod:`.base`).
:class:`LongitudinalProtocol` / :class:`LongitudinalClient` are that common interface; the memoized protocols
derive from :class:`MemoizedProtocol` / :class:`MemoizedClient` (memo slots, PRR, IRR), DDRM's difference trees
from the common interface only.
"""

from protocols.longitudinal.base import (
    FleetState,
    LongitudinalClient,
    LongitudinalProtocol,
    MemoizedClient,
    MemoizedProtocol,
    SimulationResult,
    client_from_state,
    protocol_from_params,
    slot_pattern,
)
from protocols.longitudinal.chains import TwoStageChain, grr_chain, grr_irr_epsilon, osue_chain, sue_chain
from protocols.longitudinal.dbitflip import DBitFlipPM, DBitReports
from protocols.longitudinal.ddrm import DDRM, CategoricalDDRM
from protocols.longitudinal.grr import LGRR
from protocols.longitudinal.loloha import LOLOHA, optimal_g
from protocols.longitudinal.memo import LongitudinalReport, MemoTable, encode_value, prr_generator
from protocols.longitudinal.onebit import OneBitMeanMemo, alpha_round_index
from protocols.longitudinal.rappor import RAPPOR, RapporReports
from protocols.longitudinal.transcript import TranscriptMechanism
from protocols.longitudinal.unary import LOSUE, LSUE

__all__ = [
    "CategoricalDDRM",
    "DBitFlipPM",
    "DBitReports",
    "DDRM",
    "FleetState",
    "LGRR",
    "LOLOHA",
    "LOSUE",
    "LSUE",
    "LongitudinalClient",
    "LongitudinalProtocol",
    "LongitudinalReport",
    "MemoTable",
    "MemoizedClient",
    "MemoizedProtocol",
    "OneBitMeanMemo",
    "RAPPOR",
    "RapporReports",
    "SimulationResult",
    "TranscriptMechanism",
    "TwoStageChain",
    "alpha_round_index",
    "client_from_state",
    "encode_value",
    "grr_chain",
    "grr_irr_epsilon",
    "optimal_g",
    "osue_chain",
    "protocol_from_params",
    "prr_generator",
    "slot_pattern",
    "sue_chain",
]
