"""Whole-transcript audits: one device's τ reports as a single mechanism for :func:`protocols.audit.audit`.

``TranscriptMechanism(protocol, epsilon=claimed, **fixed).privatize(sequences, rng)`` takes a batch of value
sequences (N, τ) — N independent devices (fresh memo keys) with the public per-device parameters pinned by
``fixed`` (e.g. LOLOHA ``seeds=``, RAPPOR ``cohorts=``, dBitFlipPM ``sampled=``, 1BitMean ``u=``) — and returns
the list of τ per-round report batches. Events are functions of that list (e.g. ``lambda R: (R[0] == a) &
(R[1] == a)``). The claimed ε is what the audit compares against: the ledger's total for the transcript, or
:meth:`~protocols.longitudinal.base.LongitudinalProtocol.transcript_epsilon_bound`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocols.base import check_epsilon
from protocols.longitudinal.base import LongitudinalProtocol

__all__ = ["TranscriptMechanism"]


class TranscriptMechanism:
    """Adapter: ``privatize((N, τ) sequences, rng) -> [reports_1, ..., reports_τ]`` for τ rounds of one device."""

    delta = 0.0

    def __init__(self, protocol: LongitudinalProtocol, epsilon: float, **fixed: Any) -> None:
        self.protocol = protocol
        self.epsilon = check_epsilon(epsilon)
        self.fixed = fixed

    def privatize(self, sequences: Any, rng: np.random.Generator) -> list[Any]:
        seq = np.asarray(sequences)
        if seq.ndim != 2 or seq.shape[1] == 0:
            raise ValueError(f"sequences must have shape (N, tau), got {seq.shape}")
        fleet = self.protocol.new_fleet(seq.shape[0], rng, **self.fixed)
        return [self.protocol.privatize_round(seq[:, t], fleet, rng)[0] for t in range(seq.shape[1])]
