"""HaarRecord: the memoized pipeline's record mechanism — a Haar transform perturbed by two ε-LDP mechanisms
(thesis 003 ch. 4, as corrected in SPEC §2.4; Privelet, Xiao–Wang–Gehrke ICDE 2010; Cormode–Kulkarni–Srivastava
PVLDB 2019 for the range-query view).

**Report.** The record ``x ∈ [-1, 1]^d`` is zero-padded to D = 2^L leaves and transformed
(:func:`protocols.haar.haar_forward`): mean ``m`` and D-1 breadth-first details ``c``, all in [-1, 1] (a node's
mean is an average of values in [-1, 1]; ``c = (mean(left) - mean(right))/2``). The device reports the row

    [ M_m(m; ε_m),  M_c(c; ε_c) ]          (length D)

with ``M_m`` a 1-D mechanism (PDP, PM, HM, or Duchi) and ``M_c`` HM k-sampling over the D-1 details or Duchi's
multi-dimensional mechanism (D-1 is odd, so it is exactly ε_c-LDP without a tie rule). Column 0 holds ``M_m``'s
released grid index, columns 1..D-1 ``M_c``'s released row (k-sampling: 0 for unsampled details, 1 + index
otherwise; Duchi: sign bits) — integers on public grids, never doubles (SPEC §3.0).

**Privacy.** ``M_m`` and ``M_c`` use independent randomness, so for any records x, x' and output (y, z)

    P[(y, z) | x] / P[(y, z) | x'] = (f_m(y | m(x)) / f_m(y | m(x'))) · (f_c(z | c(x)) / f_c(z | c(x'))) ≤ e^{ε_m}·e^{ε_c}

(basic sequential composition, SPEC §4): the record mechanism is ε = ε_m + ε_c -LDP for the *whole* record.
On the coefficient box [-1,1] × [-1,1]^{D-1} the bound is attained (each factor reaches its own e^{ε_·}); the Haar
image of the record cube is a strict subset of that box (m = ±1 forces c = 0), so on records the worst ratio can
be smaller — the ledger charges the composition bound ε, which is what :attr:`epsilon` states.

**Estimation.** ``m̂`` and ``ĉ`` are the means of the sub-mechanisms' debiased outputs (unbiased), and
``t̂ = haar_inverse(m̂, ĉ)`` (linear, hence unbiased): ``t̂_i = m̂ + Σ_{ancestors a of i} ±ĉ_a``, L+1 noisy terms.
A range sum is ``Σ_{i=a..b} t̂_i = w_m m̂ + Σ w_c ĉ`` with ``(w_m, w_c)`` from
:func:`protocols.haar.haar_range_weights`.

**Variance (exact).** With ``Var(Y_j) = a_j + g'_j θ_j²`` for every coefficient θ_j and the detail block's
covariance ``-C θ_j θ_l`` (k-sampling: ``C = 1 - P(k-1)/(k(P-1))``, P = D-1; Duchi multi-dim: C = 1), a query
with weights ω has per-user variance ``Σ ω_j²(a_j + g_j θ_j²) - C(Σ_{details} ω_j θ_j)²`` (g_j = g'_j + C on the
details; :mod:`protocols.pipeline._variance`). :meth:`HaarRecord.variance` evaluates it at given records;
``variance()`` without records gives the worst case over the record cube (maximised over the L + 1 block means
of the coordinate's path: all vertices, then exact coordinate ascent). The independent-noise formula :func:`protocols.haar.haar_inverse_variance`
omits the covariance term; for a coordinate it is ``Σ_anc Var(ĉ_a) + C[Σ_anc c_a² - (x_i - m)²]`` away from exact.

**Split ε = ε_m + ε_c** (``split="auto"``): the fraction f = ε_m/ε minimising a documented objective — the
*average over the objective's queries of the separable worst-case bound*
``Σ_j ω_j² max_{|θ_j| ≤ θ_j^max} (a_j + g_j θ_j²)`` (an upper bound of each query's worst-case variance; θ^max are
the coefficient ranges of zero-padded records, :func:`coefficient_bounds`). Queries: ``coordinate`` (each of the d
reconstructed coordinates; default), ``range`` (every contiguous range of coordinates), ``dyadic`` (every dyadic
block), ``total`` (the sum of all d coordinates). Minimised over f ∈ [0.02, 0.98] by a 33-point grid and a
bounded Brent refinement (:func:`optimal_split`). Any split is equally private; the choice only affects accuracy.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any

import numpy as np

from protocols import catalogue
from protocols.base import NumericMechanism, check_epsilon, check_int, check_unit_interval
from protocols.haar import (
    haar_analysis_matrix,
    haar_forward,
    haar_inverse,
    haar_range_weights,
    haar_synthesis_matrix,
    padded_size,
)
from protocols.numeric import KSampling
from protocols.numeric._common import check_rng

from ._variance import QuadraticModel, ksampling_cross, quadratic_coefficients

__all__ = [
    "HaarRecord",
    "MEAN_MECHANISMS",
    "DETAIL_MECHANISMS",
    "SPLIT_OBJECTIVES",
    "coefficient_bounds",
    "objective_weights",
    "optimal_split",
    "range_weight_vector",
]

#: 1-D mechanisms for the mean coefficient ("auto" picks the one with the lowest split objective).
MEAN_MECHANISMS = catalogue.names(catalogue.Role.HAAR_MEAN)
#: Vector mechanisms for the D-1 detail coefficients.
DETAIL_MECHANISMS = catalogue.names(catalogue.Role.HAAR_DETAIL)
#: Query families the automatic split can optimise for.
SPLIT_OBJECTIVES = ("coordinate", "range", "dyadic", "total")
#: Mean mechanisms considered by ``mean_mechanism="auto"`` (Duchi is dominated by HM and kept for exact tests).
AUTO_MEAN_CANDIDATES = catalogue.names(catalogue.Role.HAAR_MEAN_AUTO)
#: Bounds of the automatic split fraction f = ε_m/ε.
SPLIT_RANGE = (0.02, 0.98)


def coefficient_bounds(d: int) -> tuple[float, np.ndarray]:
    """``(m_max, c_max)``: the largest |m| and |c_a| over records in [-1,1]^d zero-padded to D leaves.

    ``m_max = d/D``; for a node whose two halves have w leaves each, r_L and r_R of them real (index < d),
    ``c_max = (r_L + r_R)/(2w)`` (attained by +1 on the real leaves of one half and -1 on the other's).
    """
    A = haar_analysis_matrix(d)
    bounds = np.abs(A).sum(axis=1)  # max over the cube of |row·x| is the row's ℓ1 norm
    return float(bounds[0]), bounds[1:]


def range_weight_vector(d: int, a: int, b: int) -> np.ndarray:
    """``(D,)`` weights ``[w_m, w_c...]`` with ``Σ_{i=a..b} t_i = ω·[m, c]`` (:func:`haar_range_weights`)."""
    w_m, w_c = haar_range_weights(d, a, b)
    return np.concatenate([[w_m], w_c])


def _dyadic_ranges(d: int) -> list[tuple[int, int]]:
    D = padded_size(d)
    out = []
    width = D
    while width >= 1:
        for start in range(0, d, width):
            out.append((start, min(start + width, d) - 1))
        width //= 2
    return sorted(set(out))


def objective_weights(d: int, objective: str) -> np.ndarray:
    """Query weights (Q, D) over ``[m, c]`` for a split objective (see the module docstring)."""
    d = check_int(d, "d", minimum=1)
    if objective == "coordinate":
        return haar_synthesis_matrix(d)
    if objective == "range":
        ranges = [(a, b) for a in range(d) for b in range(a, d)]
    elif objective == "dyadic":
        ranges = _dyadic_ranges(d)
    elif objective == "total":
        ranges = [(0, d - 1)]
    else:
        raise ValueError(f"split_objective must be one of {', '.join(SPLIT_OBJECTIVES)}, got {objective!r}")
    return np.array([range_weight_vector(d, a, b) for a, b in ranges])


def _make_mean(name: str, epsilon: float) -> NumericMechanism:
    return catalogue.entry(name).cls(epsilon)


def _make_detail(name: str, epsilon: float, P: int) -> Any:
    """The detail mechanism over the P = D - 1 detail coefficients (k-sampling with its default base, HM)."""
    return catalogue.build(name, epsilon=epsilon, d=P)


def _detail_cross(detail: Any) -> float:
    if isinstance(detail, KSampling):
        return ksampling_cross(detail.d, detail.k)
    return 1.0 if detail.d > 1 else 0.0


def _split_epsilons(epsilon: float, fraction: float) -> tuple[float, float]:
    """``(ε_m, ε_c)`` with ε_m = f·ε, ε_c = ε - ε_m, nudged down so that the exact real sum is ≤ ε."""
    eps_m = fraction * epsilon
    eps_c = epsilon - eps_m
    while Fraction(eps_m) + Fraction(eps_c) > Fraction(epsilon):
        eps_c = math.nextafter(eps_c, 0.0)
    if not (eps_m > 0 and eps_c > 0):
        raise ValueError(f"split {fraction} leaves no budget for one of the two mechanisms")
    return eps_m, eps_c


def _bound_objective(mean: NumericMechanism, detail: Any, d: int, weights_sq: np.ndarray) -> float:
    m_max, c_max = coefficient_bounds(d)
    a_m, g_m = quadratic_coefficients(mean.variance, "mean mechanism")
    a_c, g_c = quadratic_coefficients(detail.variance, "detail mechanism")
    g_c += _detail_cross(detail)
    u_m = a_m + max(g_m, 0.0) * m_max**2
    u_c = a_c + max(g_c, 0.0) * c_max**2
    return float(weights_sq[0] * u_m + weights_sq[1:] @ u_c)


@functools.lru_cache(maxsize=512)
def optimal_split(epsilon: float, d: int, mean: str, detail: str, objective: str = "coordinate") -> tuple[float, float]:
    """``(f, objective value)``: the fraction f = ε_m/ε minimising the separable worst-case bound (module docstring)."""
    epsilon = check_epsilon(epsilon)
    d = check_int(d, "d", minimum=1)
    if mean not in MEAN_MECHANISMS:
        raise ValueError(f"mean_mechanism must be one of {', '.join(MEAN_MECHANISMS)} or 'auto', got {mean!r}")
    if detail not in DETAIL_MECHANISMS:
        raise ValueError(f"detail_mechanism must be one of {', '.join(DETAIL_MECHANISMS)}, got {detail!r}")
    weights_sq = (objective_weights(d, objective) ** 2).mean(axis=0)
    P = padded_size(d) - 1

    def value(f: float) -> float:
        eps_m, eps_c = _split_epsilons(epsilon, f)
        return _bound_objective(_make_mean(mean, eps_m), _make_detail(detail, eps_c, P), d, weights_sq)

    grid = np.linspace(*SPLIT_RANGE, 33)
    values = np.array([value(float(f)) for f in grid])
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    from scipy import optimize  # lazy: a device with a resolved split never loads scipy (~65 MiB)

    res = optimize.minimize_scalar(value, bounds=(lo, hi), method="bounded", options={"xatol": 1e-6})
    if res.fun < values[i]:
        return float(res.x), float(res.fun)
    return float(grid[i]), float(values[i])


class HaarRecord(NumericMechanism):
    """ε-LDP mean and range estimation for records in [-1, 1]^d through the Haar transform (module docstring).

    Args:
        epsilon: total budget of one report, ε = ε_m + ε_c.
        d: record dimension (≥ 1); records are zero-padded to D = 2^⌈log2 d⌉ (≥ 2) leaves.
        mean_mechanism: ``"pdp" | "piecewise" | "hybrid" | "duchi" | "auto"`` for the mean coefficient
            (auto: the lowest split objective among PDP, PM, HM).
        detail_mechanism: ``"ksampling"`` (HM k-sampling over the D-1 details) or ``"duchi_md"``.
        split: ``"auto"`` or the fraction f = ε_m/ε in (0, 1).
        split_objective: the query family the automatic split minimises (``coordinate``, ``range``, ``dyadic``,
            ``total``); ignored for a numeric split.

    Reports have shape (n, D), integers: column 0 the mean mechanism's released grid index, columns 1.. the detail
    mechanism's released row (SPEC §3.0).
    """

    def __init__(
        self,
        epsilon: float,
        d: int,
        mean_mechanism: str = "auto",
        detail_mechanism: str = "ksampling",
        split: str | float = "auto",
        split_objective: str = "coordinate",
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0
        self.d = check_int(d, "d", minimum=1)
        self.D = padded_size(self.d)
        if detail_mechanism not in DETAIL_MECHANISMS:
            raise ValueError(f"detail_mechanism must be one of {', '.join(DETAIL_MECHANISMS)}, got {detail_mechanism!r}")
        if mean_mechanism != "auto" and mean_mechanism not in MEAN_MECHANISMS:
            raise ValueError(f"mean_mechanism must be one of {', '.join(MEAN_MECHANISMS)} or 'auto', got {mean_mechanism!r}")
        if split_objective not in SPLIT_OBJECTIVES:
            raise ValueError(f"split_objective must be one of {', '.join(SPLIT_OBJECTIVES)}, got {split_objective!r}")
        self.detail_mechanism = detail_mechanism
        self.split_objective = split_objective
        self.requested_mean = mean_mechanism
        self.requested_split = split
        means = AUTO_MEAN_CANDIDATES if mean_mechanism == "auto" else (mean_mechanism,)
        if isinstance(split, str):
            if split != "auto":
                raise ValueError(f"split must be 'auto' or a fraction in (0, 1), got {split!r}")
            options = [(optimal_split(self.epsilon, self.d, m, detail_mechanism, split_objective), m) for m in means]
            (fraction, _), name = min(options, key=lambda o: o[0][1])
        else:
            try:
                fraction = float(split)
            except (TypeError, ValueError):
                raise ValueError(f"split must be 'auto' or a fraction in (0, 1), got {split!r}") from None
            if not (math.isfinite(fraction) and 0 < fraction < 1):
                raise ValueError(f"split must be a fraction in (0, 1), got {split!r}")
            weights_sq = (objective_weights(self.d, split_objective) ** 2).mean(axis=0)
            eps_m, eps_c = _split_epsilons(self.epsilon, fraction)
            P = self.D - 1
            name = min(
                means,
                key=lambda m: _bound_objective(_make_mean(m, eps_m), _make_detail(detail_mechanism, eps_c, P), self.d, weights_sq),
            )
        self.split = fraction
        self.mean_mechanism = name
        self.epsilon_mean, self.epsilon_detail = _split_epsilons(self.epsilon, fraction)
        self.mean = _make_mean(name, self.epsilon_mean)
        self.detail = _make_detail(detail_mechanism, self.epsilon_detail, self.D - 1)
        self._model: QuadraticModel | None = None
        self._worst_coordinates: np.ndarray | None = None

    def _params(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "d": self.d,
            "mean_mechanism": self.mean_mechanism,
            "detail_mechanism": self.detail_mechanism,
            "split": self.split,
        }

    # ----------------------------------------------------------------- client
    def _check_records(self, records: Any) -> np.ndarray:
        arr = check_unit_interval(records, "records")
        if arr.ndim not in (1, 2) or arr.shape[-1] != self.d:
            raise ValueError(f"records must have shape (n, {self.d}) or ({self.d},), got {arr.shape}")
        return arr

    def privatize(self, records: Any, rng: np.random.Generator) -> np.ndarray:
        """Reports ``[M_m(m), M_c(c)]`` of shape (n, D) (or (D,) for one record)."""
        x = self._check_records(records)
        rng = check_rng(rng)
        single = x.ndim == 1
        m, c = haar_forward(x.reshape(-1, self.d))
        out = np.empty((m.shape[0], self.D), dtype=np.int64)
        out[:, 0] = self.mean.privatize(np.clip(m, -1.0, 1.0), rng)
        out[:, 1:] = self.detail.privatize(np.clip(c, -1.0, 1.0), rng)
        return out[0] if single else out

    # ----------------------------------------------------------------- server
    def _check_reports(self, reports: Any) -> np.ndarray:
        r = np.asarray(reports)
        if r.ndim == 1:
            r = r[None, :]
        if r.ndim != 2 or r.shape[1] != self.D:
            raise ValueError(f"HaarRecord reports must have shape (n, {self.D}), got {np.shape(reports)}")
        if r.shape[0] == 0:
            raise ValueError("cannot estimate from zero reports")
        return r

    def debias(self, reports: np.ndarray) -> np.ndarray:
        """Per-user unbiased coefficients ``[m̂_u, ĉ_u]`` (n, D)."""
        r = self._check_reports(reports)
        out = np.empty(r.shape, dtype=float)
        out[:, 0] = self.mean.debias(r[:, 0])
        out[:, 1:] = self.detail.debias(r[:, 1:])
        return out

    def coefficients(self, reports: Any) -> tuple[float, np.ndarray]:
        """Unbiased ``(m̂, ĉ)``: the means of the debiased coefficients."""
        mean = self.debias(reports).mean(axis=0)
        return float(mean[0]), mean[1:]

    def estimate(self, reports: Any) -> np.ndarray:
        """Unbiased (d,) per-coordinate means: ``haar_inverse(m̂, ĉ)``."""
        m, c = self.coefficients(reports)
        return haar_inverse(m, c, self.d)

    def contributions(self, reports: Any) -> np.ndarray:
        """Per-user unbiased reconstructions (n, d) (their mean is :meth:`estimate`)."""
        co = self.debias(reports)
        return haar_inverse(co[:, 0], co[:, 1:], self.d)

    def range_query(self, estimate: Any, a: int, b: int) -> float:
        """``Σ_{i=a..b} t̂_i`` from a (d,) estimate (equal to ``w_m m̂ + w_c·ĉ``)."""
        est = np.asarray(estimate, dtype=float)
        if est.shape != (self.d,):
            raise ValueError(f"expected a ({self.d},) estimate, got shape {est.shape}")
        range_weight_vector(self.d, a, b)  # validates the range
        return float(est[a : b + 1].sum())

    # ----------------------------------------------------------------- variance
    @property
    def model(self) -> QuadraticModel:
        """The exact variance model of the report's coefficients (:mod:`protocols.pipeline._variance`)."""
        if self._model is None:
            a_m, g_m = quadratic_coefficients(self.mean.variance, self.mean_mechanism)
            a_c, g_c = quadratic_coefficients(self.detail.variance, self.detail_mechanism)
            cross = _detail_cross(self.detail)
            P = self.D - 1
            self._model = QuadraticModel(
                analysis=haar_analysis_matrix(self.d),
                base=np.concatenate([[a_m], np.full(P, a_c)]),
                curvature=np.concatenate([[g_m], np.full(P, g_c + cross)]),
                correlated=np.concatenate([[False], np.ones(P, dtype=bool)]),
                cross=cross,
            )
        return self._model

    def variance(self, t: Any = None) -> Any:
        """Per-user variance of each reconstructed coordinate.

        ``t=None``: the worst case over records (d,); a record (d,) → (d,); records (n, d) → (n, d) (exact).
        """
        if t is None:
            return self.worst_case_variances()
        x = self._check_records(t)
        out = self.model.variance(x.reshape(-1, self.d), haar_synthesis_matrix(self.d))
        return out[0] if x.ndim == 1 else out

    def worst_case_variances(self) -> np.ndarray:
        """(d,) ``max_x Var(t̂_i | x)`` per coordinate (cached)."""
        if self._worst_coordinates is None:
            self._worst_coordinates = self.model.worst(haar_synthesis_matrix(self.d))
        return self._worst_coordinates.copy()

    def worst_case_variance(self) -> float:
        """The largest per-coordinate worst-case variance."""
        return float(self.worst_case_variances().max())

    def independent_variance_bound(self) -> np.ndarray:
        """(d,) the separable bound ``Var_m* + Σ_anc u_c*`` used by the split objective (≥ the worst case)."""
        m_max, c_max = coefficient_bounds(self.d)
        mdl = self.model
        theta_max = np.concatenate([[m_max], c_max])
        u = mdl.base + np.maximum(mdl.curvature, 0.0) * theta_max**2
        return (haar_synthesis_matrix(self.d) ** 2) @ u

    def range_variance(self, a: int, b: int, t: Any = None) -> Any:
        """Per-user variance of the range-sum estimate ``Σ_{i=a..b} t̂_i``.

        ``t=None``: worst case over records (float); a record (d,) → float; records (n, d) → (n,).
        """
        w = range_weight_vector(self.d, a, b)[None, :]
        if t is None:
            return float(self.model.worst(w)[0])
        x = self._check_records(t)
        out = self.model.variance(x.reshape(-1, self.d), w)[:, 0]
        return float(out[0]) if x.ndim == 1 else out

    # ----------------------------------------------------------------- exact distribution (discrete variant)
    def outputs(self) -> tuple[np.ndarray, np.ndarray]:
        """Discrete variant only (``mean="duchi"``, ``detail="duchi_md"``): the released alphabets — the mean's
        indices ``[0, 1]`` (−B_m, +B_m) and the detail's sign-bit rows (1 for +B), in the order of
        :meth:`report_distribution`'s last axes."""
        self._require_discrete()
        return np.array([0, 1]), (self.detail.outputs() > 0).astype(np.int64)

    def report_distribution(self, records: Any) -> np.ndarray:
        """Exact ``P[(y, z) | x]`` for the discrete variant: shape (n, 2, 2^{D-1}) (or (2, 2^{D-1})).

        Product of the independent parts: ``P[y | m(x)]·P[z | c(x)]`` (Duchi pmf × Duchi multi-dim pmf).
        """
        self._require_discrete()
        x = self._check_records(records)
        m, c = haar_forward(x.reshape(-1, self.d))
        pm = self.mean.output_probabilities(np.clip(m, -1, 1))  # (n, 2)
        pc = self.detail.output_probabilities(np.clip(c, -1, 1))  # (n, 2^{D-1})
        out = pm[:, :, None] * np.atleast_2d(pc)[:, None, :]
        return out[0] if x.ndim == 1 else out

    def _require_discrete(self) -> None:
        if self.mean_mechanism != "duchi" or self.detail_mechanism != "duchi_md":
            raise ValueError("exact output distributions exist only for mean_mechanism='duchi', detail_mechanism='duchi_md'")
