"""The mechanisms the evaluation compares, each with the audit that verifies its ε.

Only mechanisms whose ε is checked exactly (tests/unit) and empirically (tests/audit) are compared; :data:`AUDITS`
names the audit test of each, and :func:`audit_rows` checks that the named test file exists so the report never
cites a missing audit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocols.frequency import GRR, OLH, OUE, HadamardResponse
from protocols.numeric import DuchiMultiDim, KSampling
from simulations.eval.common import Stat, summarise

__all__ = [
    "VectorMethod",
    "VECTOR_METHODS",
    "vector_methods",
    "FREQUENCY_ORACLES",
    "AUDITS",
    "audit_rows",
    "MeanRun",
    "MeanStats",
    "mean_error_stats",
    "run_vector_mean",
]

_NUMERIC_AUDIT = "tests/audit/test_audit_numeric.py"
_FREQ_AUDIT = "tests/audit/test_audit_frequency.py"
_LONG_AUDIT = "tests/audit/test_audit_longitudinal.py"

#: mechanism label → the audit test(s) that check its claimed ε (pytest node ids, relative to the repo root).
AUDITS: dict[str, str] = {
    "HM k-sampling": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[hybrid], [ksampling], "
    "::test_ksampling_with_k_two_is_audited_at_full_epsilon",
    "PM k-sampling": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[piecewise], [ksampling]",
    "Duchi multi-dim": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[duchi_md3], [duchi_md4]",
    "GRR": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[GRR-*]",
    "OUE": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[OUE-*]",
    "OLH": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[OLH-*]",
    "HR": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[HR-*]",
    "HaarHRR": "tests/audit/test_audit_haarhrr.py::test_haarhrr_audit",
    "L-GRR": f"{_LONG_AUDIT}::test_lgrr_transcript_audit",
    "L-OSUE": f"{_LONG_AUDIT}::test_unary_chain_transcript_audit[*-LOSUE]",
    "BiLOLOHA / OLOLOHA": f"{_LONG_AUDIT}::test_loloha_transcript_audit[*-2], [*-optimal]",
    "RAPPOR": f"{_LONG_AUDIT}::test_rappor_transcript_audit",
    "dBitFlipPM": f"{_LONG_AUDIT}::test_dbitflip_transcript_audit, ::test_dbitflip_memoization_reveals_value_changes",
    "α-rounding + memoization (1BitMean)": f"{_LONG_AUDIT}::test_one_bit_mean_transcript_audit",
    "Hybrid (HM)": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[hybrid]",
}


@dataclass(frozen=True)
class VectorMethod:
    """A mean-estimation mechanism for records in [-1, 1]^d, built per (ε, d).

    ``make(ε, d)`` returns an object with ``privatize(x, rng)`` on an ``(n, d)`` array, ``estimate(reports)``
    giving the ``(d,)`` unbiased means, and ``variance(x)`` giving per-user, per-coordinate variances.
    """

    key: str
    label: str
    make: Callable[[float, int], Any]

    @property
    def audit(self) -> str:
        return AUDITS[self.label]


VECTOR_METHODS: dict[str, VectorMethod] = {
    m.key: m
    for m in (
        VectorMethod("hm", "HM k-sampling", lambda eps, d: KSampling(eps, d, "hybrid")),
        VectorMethod("pm", "PM k-sampling", lambda eps, d: KSampling(eps, d, "piecewise")),
        VectorMethod("duchi", "Duchi multi-dim", lambda eps, d: DuchiMultiDim(eps, d)),
    )
}


def vector_methods() -> list[VectorMethod]:
    """The compared vector mean mechanisms, in report order."""
    return list(VECTOR_METHODS.values())


#: Frequency oracles by label (all pure ε-LDP, audited).
FREQUENCY_ORACLES: dict[str, Callable[[float, int], Any]] = {
    "GRR": GRR,
    "OUE": OUE,
    "OLH": OLH,
    "HR": HadamardResponse,
}


@dataclass(frozen=True)
class MeanRun:
    """One run of a vector mechanism: the estimated and true column means and the analytic per-user variances."""

    estimate: np.ndarray
    truth: np.ndarray
    expected_mse: np.ndarray  # analytic E[(estimate_j - sample mean_j)^2] = mean_i Var(x_ij) / n

    @property
    def attribute_mse(self) -> float:
        """Squared error of each attribute's mean, averaged over the attributes."""
        return float(np.mean((self.estimate - self.truth) ** 2))

    @property
    def overall_se(self) -> float:
        """Squared error of the mean over all attributes (the record's overall mean)."""
        return float((self.estimate.mean() - self.truth.mean()) ** 2)


def run_vector_mean(
    method: VectorMethod, epsilon: float, x: np.ndarray, rng: np.random.Generator, truth: np.ndarray | None = None
) -> MeanRun:
    """Privatize every row of ``x`` (n, d) with ``method`` at ε and estimate the column means.

    ``truth`` defaults to the column means of ``x`` (pass the population means when x is a subsample).
    """
    mech = method.make(epsilon, x.shape[1])
    estimate = np.asarray(mech.estimate(mech.privatize(x, rng)), dtype=float)
    expected = np.asarray(mech.variance(x), dtype=float).mean(axis=0) / x.shape[0]
    return MeanRun(estimate, x.mean(axis=0) if truth is None else np.asarray(truth, dtype=float), expected)


@dataclass(frozen=True)
class MeanStats:
    """Repeated :func:`run_vector_mean`: per-attribute MSE and overall-mean squared error (mean ± std), analytic MSE."""

    attribute_mse: Stat
    overall_se: Stat
    analytic_mse: float


def mean_error_stats(
    method: VectorMethod, epsilon: float, x: np.ndarray, rngs: list[np.random.Generator]
) -> MeanStats:
    """One :func:`run_vector_mean` per generator in ``rngs`` (one per repetition), summarised."""
    runs = [run_vector_mean(method, epsilon, x, rng) for rng in rngs]
    return MeanStats(
        summarise(r.attribute_mse for r in runs),
        summarise(r.overall_se for r in runs),
        float(np.mean([r.expected_mse.mean() for r in runs])),
    )


def audit_rows(repo_root: Path, labels: list[str] | None = None) -> list[tuple[str, str, bool]]:
    """(mechanism, audit node ids, whether the audit file exists) for the report's audit table."""
    out = []
    for label in labels or list(AUDITS):
        node = AUDITS[label]
        out.append((label, node, (repo_root / node.split("::")[0]).is_file()))
    return out
