"""The ``auto`` mechanism choice (SPEC §2.4): the lowest analytic variance for the query, with the numbers compared.

Candidates for a group of d dimensions with total budget ε per report:

* ``haar`` — :class:`~protocols.pipeline.HaarRecord` (mean mechanism chosen among PDP/PM/HM, split optimised for
  the query's family), once with HM k-sampling and once with Duchi multi-dim on the details;
* ``ksampling`` — HM k-sampling directly on x (``KSampling(ε, d)``, Wang et al. ICDE 2019);
* ``duchi_md`` — Duchi et al.'s multi-dimensional mechanism directly on x;
* with a domain size ``k`` (categorical or rounded dimensions): a frequency oracle per dimension at ε/d
  (sequential composition over the d dimensions) — the best of GRR, OUE and OLH.

**Metrics** (per-user variances in the normalised domain [-1, 1]; divide by n for an estimate over n users):

* ``mean``: the average over the d coordinates of the worst-case (over records in [-1,1]^d) variance of the
  coordinate's estimate;
* ``range``: the average over all d(d+1)/2 contiguous ranges [a, b] of the worst-case variance of the range-sum
  estimate ``Σ_{i=a..b} t̂_i``; ``dyadic``: the same over dyadic blocks; ``total``: the sum of all d coordinates;
* ``frequency`` (needs k): the average over the k items of the per-item variance of f̂_v, which by linearity in f
  equals ``variance(1/k)`` for any distribution (:meth:`protocols.base.FrequencyOracle.variance`).

Worst cases are maxima over records of the exact variance formulas (:mod:`protocols.pipeline._variance`: vertex
enumeration in reduced variables, then coordinate ascent) — including the covariances of k-sampling and Duchi multi-dim, and the coupling of the
Haar coefficients (m = ±1 forces c = 0), so Haar is not charged a bound that no record attains. For a frequency
oracle used for a *mean* the histogram is mapped to the grid ``a_v = -1 + 2v/(k-1)`` and the mean's variance is
exact for GRR and OUE and uses the ideal-hash model for OLH (Wang et al., USENIX Security 2017).

SPEC §2.4's rule of thumb — each Haar coordinate sums log2(D)+1 noisy coefficients, so per-coordinate error is
about (1+log2 D)× that of HM k-sampling, while Haar wins for the overall mean and dyadic ranges — is measured by
:func:`comparison_table`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols import catalogue
from protocols.base import NumericMechanism, check_epsilon, check_int
from protocols.frequency import GRR
from protocols.haar import haar_synthesis_matrix
from protocols.numeric import DuchiMultiDim, KSampling

from ._variance import QuadraticModel, ksampling_cross, quadratic_coefficients
from .record import DETAIL_MECHANISMS, HaarRecord, _dyadic_ranges, range_weight_vector

__all__ = ["AUTO_QUERIES", "MechanismChoice", "choose_mechanism", "AutoRecord", "comparison_table", "query_variance"]

#: Queries the choice can optimise for.
AUTO_QUERIES = ("mean", "range", "dyadic", "total", "frequency")
_SPLIT_OBJECTIVE = {"mean": "coordinate", "range": "range", "dyadic": "dyadic", "total": "total"}


@dataclass(frozen=True)
class MechanismChoice:
    """The winner of :func:`choose_mechanism` and everything it was compared with.

    Attributes:
        name: registry name of the winner (``haar``, ``ksampling``, ``duchi_md``, ``grr``, ``oue``, ``olh``).
        label: the winning candidate's label in ``variances`` (e.g. ``haar[pdp+ksampling]``).
        params: constructor parameters, so that ``protocols.catalogue.build(name, **params)`` rebuilds it.
        mechanism: the built mechanism (a frequency oracle is per dimension, at ε/d).
        query: the query optimised for.
        variances: label → compared per-user variance (see the module docstring for the metric).
        metric: a one-line description of the metric.
    """

    name: str
    label: str
    params: dict[str, Any]
    mechanism: Any = field(repr=False)
    query: str
    variances: dict[str, float]
    metric: str

    def deployed(self) -> tuple[str, dict[str, Any], Any]:
        """``(name, params, mechanism)`` a stream runs and states for this choice — the device's ``auto`` streams
        (:mod:`edge_agent.plans`) and the fleet simulator's ``auto``: the winner, except that k-sampling of d = 1
        coordinate is its base mechanism itself (sampling one coordinate of one, SPEC §3.6), run and named as that
        base (``hybrid``)."""
        if self.name == "ksampling" and int(self.mechanism.d) == 1:
            name, params = str(self.params.get("base", "hybrid")), {"epsilon": float(self.params["epsilon"])}
            return name, params, catalogue.build(name, **params)
        return self.name, self.params, self.mechanism


def _query_ranges(d: int, query: str) -> list[tuple[int, int]]:
    if query == "range":
        return [(a, b) for a in range(d) for b in range(a, d)]
    if query == "dyadic":
        return _dyadic_ranges(d)
    if query == "total":
        return [(0, d - 1)]
    raise ValueError(f"not a range query: {query!r}")


def numeric_model(mech: Any) -> QuadraticModel:
    """The exact variance model of a numeric candidate (HaarRecord, KSampling, DuchiMultiDim)."""
    if isinstance(mech, HaarRecord):
        return mech.model
    if isinstance(mech, KSampling):
        cross = ksampling_cross(mech.d, mech.k)
    elif isinstance(mech, DuchiMultiDim):
        cross = 1.0 if mech.d > 1 else 0.0
    else:
        raise ValueError(f"no variance model for {type(mech).__name__}")
    a, g = quadratic_coefficients(mech.variance, type(mech).__name__)
    return QuadraticModel(
        analysis=np.eye(mech.d),
        base=np.full(mech.d, a),
        curvature=np.full(mech.d, g + cross),
        correlated=np.ones(mech.d, dtype=bool),
        cross=cross,
    )


def _query_weights(mech: Any, query: str) -> np.ndarray:
    d = mech.d
    haar = isinstance(mech, HaarRecord)
    if query == "mean":
        return haar_synthesis_matrix(d) if haar else np.eye(d)
    ranges = _query_ranges(d, query)
    if haar:
        return np.array([range_weight_vector(d, a, b) for a, b in ranges])
    w = np.zeros((len(ranges), d))
    for i, (a, b) in enumerate(ranges):
        w[i, a : b + 1] = 1.0
    return w


def query_variance(mech: Any, query: str, records: Any = None) -> float:
    """The compared metric of a numeric candidate: worst case (``records=None``) or averaged over given records."""
    if query not in _SPLIT_OBJECTIVE:
        raise ValueError(f"query must be one of {', '.join(_SPLIT_OBJECTIVE)} for a numeric mechanism, got {query!r}")
    model = numeric_model(mech)
    w = _query_weights(mech, query)
    if records is None:
        return float(model.worst(w).mean())
    return float(model.variance(np.asarray(records, dtype=float), w).mean())


def _oracle_mean_variance(oracle: Any, k: int) -> float:
    """Worst case over x of the per-user variance of ``Σ_v a_v f̂_v`` (a_v = -1 + 2v/(k-1))."""
    a = np.linspace(-1.0, 1.0, k)
    p, q = oracle.p, oracle.q
    A, S = float(a @ a), float(a.sum())
    if isinstance(oracle, GRR):
        mean_y = p * a + q * (S - a)
        second = p * a**2 + q * (A - a**2)
        var = (second - mean_y**2) / (p - q) ** 2
    else:  # independent support indicators: OUE exactly, OLH under the ideal-hash model
        var = (a**2 * p * (1 - p) + q * (1 - q) * (A - a**2)) / (p - q) ** 2
    return float(var.max())


def _oracle_metric(oracle: Any, k: int, d: int, query: str) -> float:
    if query == "frequency":
        return float(np.max(oracle.variance(1.0 / k)))
    per_dim = _oracle_mean_variance(oracle, k)
    if query == "mean":
        return per_dim
    sizes = np.array([b - a + 1 for a, b in _query_ranges(d, query)], dtype=float)
    return float(per_dim * sizes.mean())  # dimensions use independent randomness: variances add


def choose_mechanism(epsilon: float, d: int, query: str = "mean", k: int | None = None) -> MechanismChoice:
    """The lowest-variance mechanism for ``query`` on a group of d dimensions with budget ε (module docstring).

    ``k`` (domain size of categorical or rounded dimensions) adds the per-dimension frequency oracles; it is
    required for ``query="frequency"``, where the numeric candidates do not apply. What a stream runs is
    :meth:`MechanismChoice.deployed`.
    """
    epsilon = check_epsilon(epsilon)
    d = check_int(d, "d", minimum=1)
    if query not in AUTO_QUERIES:
        raise ValueError(f"query must be one of {', '.join(AUTO_QUERIES)}, got {query!r}")
    if k is not None:
        k = check_int(k, "k", minimum=2)
    if query == "frequency" and k is None:
        raise ValueError("query='frequency' needs the domain size k")
    candidates: dict[str, tuple[str, dict[str, Any], Any, float]] = {}
    if query != "frequency":
        objective = _SPLIT_OBJECTIVE[query]
        for detail in DETAIL_MECHANISMS:
            mech = HaarRecord(epsilon, d, detail_mechanism=detail, split_objective=objective)
            params = mech._params()
            candidates[f"haar[{mech.mean_mechanism}+{detail}]"] = ("haar", params, mech, query_variance(mech, query))
        ks = KSampling(epsilon, d)
        candidates["ksampling"] = ("ksampling", {"epsilon": epsilon, "d": d, "base": "hybrid"}, ks, query_variance(ks, query))
        dmd = DuchiMultiDim(epsilon, d)
        candidates["duchi_md"] = ("duchi_md", {"epsilon": epsilon, "d": d}, dmd, query_variance(dmd, query))
    if k is not None:
        per_dim = epsilon / d
        for name in catalogue.names(catalogue.Role.AUTO, catalogue.Family.FREQUENCY):
            oracle = catalogue.build(name, epsilon=per_dim, k=k)
            candidates[name] = (name, {"epsilon": per_dim, "k": k}, oracle, _oracle_metric(oracle, k, d, query))
    label = min(candidates, key=lambda c: candidates[c][3])
    name, params, mech, _ = candidates[label]
    metric = {
        "mean": "average over coordinates of the worst-case per-user variance of a coordinate mean",
        "range": "average over all contiguous ranges of the worst-case per-user variance of the range sum",
        "dyadic": "average over dyadic blocks of the worst-case per-user variance of the block sum",
        "total": "worst-case per-user variance of the sum of all coordinates",
        "frequency": "average over items of the per-user variance of a frequency estimate (= variance(1/k))",
    }[query]
    return MechanismChoice(
        name=name,
        label=label,
        params=params,
        mechanism=mech,
        query=query,
        variances={c: v[3] for c, v in candidates.items()},
        metric=metric,
    )


class AutoRecord(NumericMechanism):
    """``auto`` as a registry entry for numeric records: the winner of ``choose_mechanism(ε, d, query)``.

    Deterministic (analytic), so a device and the coordinator that build ``AutoRecord`` with the same parameters
    resolve to the same mechanism. Delegates ``privatize``/``debias``/``estimate``; :attr:`choice` holds the
    comparison. Only numeric queries (``mean``, ``range``, ``dyadic``, ``total``); frequency oracles are chosen
    per dimension with :func:`choose_mechanism` directly.
    """

    def __init__(self, epsilon: float, d: int, query: str = "mean") -> None:
        if query not in _SPLIT_OBJECTIVE:
            raise ValueError(f"AutoRecord query must be one of {', '.join(_SPLIT_OBJECTIVE)}, got {query!r}")
        self.choice = choose_mechanism(epsilon, d, query)
        self.mechanism = self.choice.mechanism
        self.epsilon = float(self.mechanism.epsilon)
        self.delta = 0.0
        self.d = int(d)
        self.query = query
        self._model = numeric_model(self.mechanism)

    def _params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "d": self.d, "query": self.query, "chosen": self.choice.label}

    def privatize(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        return self.mechanism.privatize(values, rng)

    def debias(self, reports: np.ndarray) -> np.ndarray:
        return self.mechanism.debias(reports)

    def estimate(self, reports: np.ndarray) -> np.ndarray:
        return self.mechanism.estimate(reports)

    def variance(self, t: Any = None) -> Any:
        """Per-coordinate per-user variance: worst case (d,) for ``t=None``, else exact at records (n, d)/(d,)."""
        w = _query_weights(self.mechanism, "mean")
        if t is None:
            return self._model.worst(w)
        x = np.asarray(t, dtype=float)
        out = self._model.variance(x.reshape(-1, self.d), w)
        return out[0] if x.ndim == 1 else out

    def worst_case_variance(self) -> float:
        return float(np.max(self.variance()))


def comparison_table(
    ds: tuple[int, ...] = (4, 8, 16, 15),
    epsilons: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0),
    queries: tuple[str, ...] = ("mean", "range", "dyadic", "total"),
) -> list[dict[str, Any]]:
    """Rows ``{d, epsilon, query, haar, haar_label, ksampling, duchi_md, haar_over_ksampling, winner}``.

    ``haar`` is the better of the two Haar variants; ``haar_over_ksampling`` the variance ratio (SPEC §2.4
    predicts ≈ 1 + log2 D for ``mean``, < 1 for dyadic ranges and the total).
    """
    rows = []
    for d in ds:
        for eps in epsilons:
            for query in queries:
                ch = choose_mechanism(eps, d, query)
                haar = {lab: v for lab, v in ch.variances.items() if lab.startswith("haar")}
                best = min(haar, key=haar.get)  # type: ignore[arg-type]
                rows.append(
                    {
                        "d": d,
                        "epsilon": eps,
                        "query": query,
                        "haar": haar[best],
                        "haar_label": best,
                        "ksampling": ch.variances["ksampling"],
                        "duchi_md": ch.variances["duchi_md"],
                        "haar_over_ksampling": haar[best] / ch.variances["ksampling"],
                        "log2D_plus_1": 1 + math.log2(max(2, 1 << (d - 1).bit_length())),
                        "winner": ch.label,
                    }
                )
    return rows
