"""The mechanisms the evaluation compares, the audits that verify their ε, and the mean-error computations.

Only mechanisms whose ε is checked exactly (unit tests) and empirically (audit tests) are compared; :data:`AUDITS`
names the audit test of each (the report's audit table), and :func:`audit_rows` checks that every test file it names
exists so the report never cites a missing audit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocols.frequency import GRR, OLH, OUE, HadamardResponse
from protocols.haar import haar_forward, padded_size
from protocols.numeric import DuchiMultiDim, KSampling
from protocols.pipeline import AutoRecord, HaarRecord
from protocols.pipeline.auto import query_variance
from simulations.eval.common import Stat, summarise

__all__ = [
    "VectorMethod",
    "VECTOR_METHODS",
    "vector_methods",
    "FREQUENCY_ORACLES",
    "AUDITS",
    "audit_rows",
    "MeanRun",
    "SPLIT_FOR_QUERY",
    "analytic_query_variance",
    "overall_mean",
    "MeanStats",
    "mean_error_stats",
    "run_vector_mean",
]

_NUMERIC_AUDIT = "tests/protocols/numeric/test_numeric_audit.py"
_FREQ_AUDIT = "tests/protocols/frequency/test_frequency_audit.py"
_LONG_AUDIT = "tests/protocols/longitudinal/test_longitudinal_audit.py"
_PIPELINE_AUDIT = "tests/protocols/pipeline/test_record_audit.py"

#: mechanism label → the audit test(s) that check its claimed ε (pytest node ids, relative to the repo root).
AUDITS: dict[str, str] = {
    "Haar record": f"{_PIPELINE_AUDIT}::test_default_record_mechanism_passes_the_audit, "
    "::test_even_split_passes_the_audit_with_power",
    "auto": "delegates to the chosen mechanism (Haar record, HM k-sampling or Duchi multi-dim: see their rows); "
    "choice: tests/protocols/pipeline/test_auto.py",
    "HM k-sampling": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[hybrid], [ksampling], "
    "::test_ksampling_with_k_two_is_audited_at_full_epsilon",
    "PM k-sampling": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[piecewise], [ksampling]",
    "Duchi multi-dim": f"{_NUMERIC_AUDIT}::test_audit_never_exceeds_claim[duchi_md3], [duchi_md4]",
    "GRR": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[GRR-*]",
    "OUE": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[OUE-*]",
    "OLH": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[OLH-*]",
    "HR": f"{_FREQ_AUDIT}::test_audit_never_exceeds_epsilon[HR-*]",
    "HaarHRR": "tests/protocols/test_haar_audit.py::test_haarhrr_audit",
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


VECTOR_METHODS: dict[str, VectorMethod] = {
    m.key: m
    for m in (
        VectorMethod("haar", "Haar record", lambda eps, d: HaarRecord(eps, d)),
        VectorMethod("haar_total", "Haar record, split for the total",
                     lambda eps, d: HaarRecord(eps, d, split_objective="total")),
        VectorMethod("hm", "HM k-sampling", lambda eps, d: KSampling(eps, d, "hybrid")),
        VectorMethod("pm", "PM k-sampling", lambda eps, d: KSampling(eps, d, "piecewise")),
        VectorMethod("duchi", "Duchi multi-dim", lambda eps, d: DuchiMultiDim(eps, d)),
        VectorMethod("auto", "auto (mean query)", lambda eps, d: AutoRecord(eps, d, "mean")),
        VectorMethod("auto_total", "auto (total query)", lambda eps, d: AutoRecord(eps, d, "total")),
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
    overall_estimate: float
    overall_expected: float  # analytic E[(overall_estimate - sample overall mean)^2]

    @property
    def attribute_mse(self) -> float:
        """Squared error of each attribute's mean, averaged over the attributes."""
        return float(np.mean((self.estimate - self.truth) ** 2))

    @property
    def overall_se(self) -> float:
        """Squared error of the mean over all attributes (the record's overall mean)."""
        return float((self.overall_estimate - self.truth.mean()) ** 2)


def run_vector_mean(
    method: VectorMethod, epsilon: float, x: np.ndarray, rng: np.random.Generator, truth: np.ndarray | None = None
) -> MeanRun:
    """Privatize every row of ``x`` (n, d) with ``method`` at ε and estimate the column means.

    ``truth`` defaults to the column means of ``x`` (pass the population means when x is a subsample).
    """
    mech = method.make(epsilon, x.shape[1])
    reports = mech.privatize(x, rng)
    estimate = np.asarray(mech.estimate(reports), dtype=float)
    expected = np.asarray(mech.variance(x), dtype=float).mean(axis=0) / x.shape[0]
    truth = x.mean(axis=0) if truth is None else np.asarray(truth, dtype=float)
    overall, overall_var = overall_mean(mech, reports, estimate, x)
    return MeanRun(estimate, truth, expected, overall, overall_var)


#: HaarRecord's split objective for each query family of :func:`analytic_query_variance`.
SPLIT_FOR_QUERY = {"mean": "coordinate", "total": "total", "range": "range", "dyadic": "dyadic"}


def analytic_query_variance(mech: Any, query: str, x: np.ndarray) -> float:
    """Exact per-user variance of a query family, averaged over the records x (n, d) and the family's queries.

    ``mean``: a coordinate mean; ``total``: the sum of all d coordinates; ``range``: every contiguous range sum;
    ``dyadic``: every dyadic block sum (:func:`protocols.pipeline.auto.query_variance`). For a Haar record the total
    is ``D·m̂`` (padding-aware, see :func:`overall_mean`).
    """
    inner = mech.mechanism if isinstance(mech, AutoRecord) else mech
    if query == "total" and isinstance(inner, HaarRecord):
        m_users, _ = haar_forward(x)
        return float(inner.D**2 * np.mean(inner.mean.variance(np.clip(m_users, -1.0, 1.0))))
    return query_variance(inner, query, x)


def overall_mean(mech: Any, reports: np.ndarray, estimate: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """The method's unbiased estimate of the mean over all d attributes and its analytic variance (over n users).

    * Haar record (also when ``auto`` chose it): ``(D/d)·m̂`` — the padded leaves are known zeros, so
      ``Σ_{i<d} x_i = D·m`` exactly and no detail coefficient is needed; variance ``(D/d)²·mean_i Var_m(m_i)/n``
      with ``Var_m`` the mean mechanism's variance at each user's m_i.
    * otherwise: the average of the d coordinate estimates, with the exact variance of the sum from the
      pipeline's variance model (:func:`protocols.pipeline.auto.query_variance`, covariances included) / d².
    """
    n, d = x.shape
    inner = mech.mechanism if isinstance(mech, AutoRecord) else mech
    variance = analytic_query_variance(inner, "total", x) / d**2 / n
    if isinstance(inner, HaarRecord):
        m_hat, _ = inner.coefficients(reports)
        return inner.D / inner.d * m_hat, variance
    return float(estimate.mean()), variance


@dataclass(frozen=True)
class MeanStats:
    """Repeated :func:`run_vector_mean`: per-attribute MSE and overall-mean squared error (mean ± std), analytic MSE."""

    attribute_mse: Stat
    overall_se: Stat
    analytic_mse: float
    analytic_overall: float


def mean_error_stats(
    method: VectorMethod, epsilon: float, x: np.ndarray, rngs: list[np.random.Generator]
) -> MeanStats:
    """One :func:`run_vector_mean` per generator in ``rngs`` (one per repetition), summarised."""
    runs = [run_vector_mean(method, epsilon, x, rng) for rng in rngs]
    return MeanStats(
        summarise(r.attribute_mse for r in runs),
        summarise(r.overall_se for r in runs),
        float(np.mean([r.expected_mse.mean() for r in runs])),
        float(np.mean([r.overall_expected for r in runs])),
    )


def haar_versus_hm(attribute: dict[str, float], overall: dict[str, float], d: int) -> str:
    """One sentence comparing the Haar record with HM k-sampling on analytic MSEs (SPEC §2.4's prediction)."""
    D = padded_size(d)
    haar, hm = attribute["Haar record"], attribute["HM k-sampling"]
    best_overall = min(overall, key=overall.get)  # type: ignore[arg-type]
    haar_total = min(overall["Haar record"], overall["Haar record, split for the total"])
    return (
        f"Haar record / HM k-sampling (analytic): per attribute ×{haar / hm:.1f} "
        f"(1 + log2 D = {D.bit_length()}), "
        f"overall mean ×{haar_total / overall['HM k-sampling']:.2f} (best Haar split); "
        f"lowest analytic overall-mean error: {best_overall}."
    )


def audit_rows(repo_root: Path, labels: list[str] | None = None) -> list[tuple[str, str, bool]]:
    """(mechanism, audit node ids, whether every test file it names exists) for the report's audit table."""
    out = []
    for label in labels or list(AUDITS):
        node = AUDITS[label]
        files = re.findall(r"tests/[\w/]+\.py", node)
        out.append((label, node, bool(files) and all((repo_root / f).is_file() for f in files)))
    return out
