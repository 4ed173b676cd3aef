"""Unbiased aggregates with confidence intervals from the sufficient statistics of a round's reports.

Every estimate is computed from a stream's :class:`protocols.catalogue.Statistics` (:func:`estimate_statistics`):
the count n, the sum of each report's statistic vector and, for numeric streams, the sum of its squares. The
coordinator keeps them as reports arrive (:meth:`coordinator.store.Store.commit_batch`), so estimating a round
reads one small row per ingest worker whatever the number of reports. A stream whose aggregates are stale (reports
stored before aggregates existed, or committed without them) is estimated from its stored bodies instead
(:func:`estimate_stream`: stacked by :meth:`coordinator.decode.StreamDecoder.from_bodies`, the statistics computed
from the rows, then the same :func:`estimate_statistics`), until ``haarvest coordinator aggregates --rebuild``.
Rows the mechanism cannot have produced (wrong shape, outside its support — rejected at ingest, but a store may
hold older rows) are dropped and counted (``StreamEstimate.dropped``) rather than failing the stream:

* ``numeric`` / ``vector``: ``t̂ = mechanism.estimate(rows)`` (per-coordinate means in [-1, 1]), de-normalised
  ``x̂ = lo + (t̂ + 1)(hi - lo)/2``; standard error ``((hi - lo)/2)·sqrt(Var(t)/n)``.
* ``frequency``: ``f̂ = mechanism.estimate(rows)`` (unbiased fractions), standard error ``sqrt(Var(f)/n)``.
* ``haar`` (SPEC §2.4–2.5): decoded by :class:`protocols.pipeline.HaarRecord` — the same object the devices
  privatize with (``StreamSpec.build()``): ``t̂ = HaarRecord.estimate(rows)`` (``haar_inverse(m̂, ĉ)``), its
  exact per-coordinate variance model (``HaarRecord.variance(t)``, covariances of the detail mechanism included)
  at the estimate (``plugin``) or its worst case over records (``worst``); de-normalised like numeric streams.
* ``distribution`` (SPEC §3.14): the histogram over the stream's D buckets from the statistics
  (:meth:`protocols.catalogue.Entry.distribution`: a :class:`protocols.distribution.DistributionEstimate`):
  ``estimate`` the monotone-consistent histogram (``raw`` the unbiased one, Square Wave: EMS), ``ci_low``/``ci_high``
  its pointwise normal interval where the mechanism has an analytic variance (empty for Square Wave; flat OLH's
  CDF band from the empirical variance of its kept second moments, SPEC §3.14); ``edges`` the
  D + 1 bucket edges in the dimension's units, ``cdf`` the consistent CDF at the right edges with its monotone band
  ``cdf_low``/``cdf_high``, and ``quantiles`` (p50, p90, p95, p99 by default) with their intervals from the
  inverted band (``low``/``high`` null without a variance).
* ``longitudinal`` (L-GRR, LOLOHA): ``f̂ = protocol.estimate_round(reports)`` of the round's reports (each device's
  fresh IRR of its memoized PRR), per-user variance ``protocol.variance(f)``; otherwise like ``frequency``.

**Variance basis.** The per-user variances come from the mechanisms' ``variance`` formulas, which depend on the
unknown inputs. Every numeric mechanism here has a per-coefficient variance ``Var(Y_j | θ_j) = a + g·θ_j²``
(``a = variance(0)``, ``g = variance(1) − a``; PM, HM, PDP, Duchi, k-sampling, the Haar record's coefficients), so
the variance of the mean over n users is ``(a + g·E[θ²])/n`` with ``E[θ²]`` the *population mean of θ²* —
not the square of the mean (plugging in t̂² underestimates it whenever inputs differ: PM at ε = 4 with half the
users at −1 and half at +1 covers 0.77 instead of 0.95). ``variance="plugin"`` (default) estimates it by moments:
``E[Y²] = a + (g + 1)·θ²`` per user, so ``Ê[θ²] = (mean(Y²) − a)/(g + 1)`` clipped to ``[θ̂², θ_max²]`` (unbiased
before clipping; consistent); where g ≤ 0 the variance decreases in θ² and ``θ̂²`` is used instead (conservative
by Jensen: ``E[θ²] ≥ θ̄²``). The Haar record's coordinate ``i`` combines coefficients with synthesis weights ``W``:
``Σ_j W_ij²(a_j + g_j Ê[θ_j²]) − C(Σ_{details} W_ij θ̂_j)²`` (the covariance term of the detail mechanism with the
squared mean: again conservative by Jensen; :mod:`protocols.pipeline._variance`). A mechanism whose variance is
not of that form falls back to its variance at the clipped estimate. ``variance="worst"`` uses the worst case over
the whole range (conservative). Oracles' ``variance(f)`` is linear in f, so the clipped estimate is unbiased
(``plugin``); ``worst`` takes the worse of f = 0 and f = 1. Intervals are the normal approximation
``estimate ± z·se`` (:func:`protocols.base.confidence_interval`).

**Heavy-hitter rounds** (``StreamSpec.heavy_hitters``): ``heavy_hitters`` lists the (prefix, next bits) items the
round selects — :func:`select_heavy_hitters` with the round's ``threshold`` and ``top_k``
(:class:`protocols.contract.HeavyHitterSpec`), largest first, the catch-all item excluded; the planner
(:func:`coordinator.rounds.plan_heavy_hitters`) extends exactly these next round.

**Consistency post-processing** (optional, free: post-processing): numeric estimates and intervals are clipped
to ``[lo, hi]``; frequency estimates are projected onto the probability simplex (Euclidean projection; the
interval is reported around the unbiased estimate, clipped to [0, 1]). ``raw`` always holds the unbiased estimate.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from coordinator.decode import DecodedReports, StreamDecoder
from protocols.contract import HeavyHitterSpec, StreamSpec, denormalise, parse_round_params
from coordinator.store import Store
from protocols import wire
from protocols.base import confidence_interval
from protocols.catalogue import Family, Statistics
from protocols.frequency.postprocess import project_simplex
from protocols.heavy_hitters import select_prefixes

__all__ = ["StreamEstimate", "estimate_stream", "estimate_statistics", "estimate_round",
           "statistics_from_bodies"]

VarianceBasis = Literal["plugin", "worst"]

#: Quantile levels a distribution stream's estimate reports by default.
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass
class StreamEstimate:
    """The aggregate of one stream in one round (lists are JSON-ready)."""

    round_id: str
    stream: str
    kind: str
    mechanism: str
    n: int
    labels: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)  # numeric streams: each dimension's unit ('' when unnamed)
    estimate: list[float] = field(default_factory=list)
    ci_low: list[float] = field(default_factory=list)
    ci_high: list[float] = field(default_factory=list)
    stderr: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    level: float = 0.95
    variance_basis: str = "plugin"
    consistency: bool = True
    error: str | None = None
    dropped: int = 0  # stored reports the stream's mechanism cannot have produced (not used; see estimate_stream)
    #: the privacy unit the devices' ledgers charged this stream under (``device``: everything a device released
    #: in its budget window; ``value``: each distinct value, not when it changes) — from the round's StreamSpec
    unit: str = "device"
    #: heavy-hitter rounds: the selected items, largest first — ``{"prefix", "bits", "label", "frequency"}`` each
    #: (:func:`select_heavy_hitters` with the round's threshold / top_k); empty for other streams
    heavy_hitters: list[dict[str, Any]] = field(default_factory=list)
    #: distribution streams (empty otherwise): the D + 1 bucket edges (the dimension's units), the consistent CDF
    #: at the right edges and its band, and the quantiles ``{"q", "value", "low", "high"}`` (low/high None when the
    #: mechanism has no analytic variance)
    edges: list[float] = field(default_factory=list)
    cdf: list[float] = field(default_factory=list)
    cdf_low: list[float] = field(default_factory=list)
    cdf_high: list[float] = field(default_factory=list)
    quantiles: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _numeric_variance(mech: Any, t_hat: np.ndarray, basis: VarianceBasis) -> np.ndarray:
    """The variance model at the clipped estimate (``plugin`` fallback), or its worst case."""
    if basis == "worst":
        return np.full(t_hat.shape, float(mech.worst_case_variance()))
    return np.broadcast_to(np.asarray(mech.variance(np.clip(t_hat, -1.0, 1.0)), dtype=float), t_hat.shape).copy()


def _mean_square(y_sq_mean: np.ndarray, theta_hat: np.ndarray, a: np.ndarray, g_marginal: np.ndarray,
                 g: np.ndarray, bound_sq: np.ndarray) -> np.ndarray:
    """Estimated population mean of θ_j² per coefficient (see the module docstring, *Variance basis*).

    ``E[Y_j²] = a_j + (g'_j + 1)θ_j²`` with ``g'`` the marginal curvature; where the variance model's curvature
    ``g_j > 0`` the moment estimate ``(mean(Y_j²) − a_j)/(g'_j + 1)`` clipped to ``[θ̂_j², θ_max²]``, elsewhere
    ``θ̂_j²`` (conservative). ``g' + 1`` too close to 0 to divide by gives ``θ_max²`` (conservative).
    """
    plug = np.minimum(theta_hat**2, bound_sq)
    denom = g_marginal + 1.0
    usable = denom > 1e-6
    moment = (y_sq_mean - a) / np.where(usable, denom, 1.0)
    moment = np.where(usable, np.clip(moment, plug, bound_sq), bound_sq)
    return np.where(g > 0, moment, plug)


def _moment_variance(mech: Any, y_sq_mean: np.ndarray, t_hat: np.ndarray) -> np.ndarray:
    """Per-coordinate per-user variance ``a + g·Ê[t²]`` of a scalar or vector mean mechanism (module docstring),
    from the mean square ``y_sq_mean`` of the debiased reports."""
    from protocols.pipeline._variance import quadratic_coefficients

    try:
        a, g = quadratic_coefficients(mech.variance, type(mech).__name__)
    except (ValueError, TypeError):
        return _numeric_variance(mech, t_hat, "plugin")
    if y_sq_mean.size != t_hat.size:
        return _numeric_variance(mech, t_hat, "plugin")
    ones = np.ones(t_hat.shape)
    m2 = _mean_square(y_sq_mean, np.clip(t_hat, -1.0, 1.0), a * ones, g * ones, g * ones, ones)
    return np.maximum(a + g * m2, 0.0)


def _haar_moment_variance(mech: Any, coefficient_sq_mean: np.ndarray, theta_hat: np.ndarray) -> np.ndarray:
    """(d,) per-user variance of the Haar record's coordinates from the mean and mean square of the debiased
    coefficients."""
    from protocols.haar import haar_synthesis_matrix
    from protocols.pipeline.record import coefficient_bounds

    model = mech.model
    a, g, J, C = model.base, model.curvature, model.correlated, float(model.cross)
    m_max, c_max = coefficient_bounds(mech.d)
    bound = np.concatenate([[m_max], c_max])
    theta = np.clip(theta_hat, -bound, bound)
    m2 = _mean_square(coefficient_sq_mean, theta, a, g - C * J, g, bound**2)
    W = haar_synthesis_matrix(mech.d)
    var = (W**2) @ (a + g * m2)
    if C:
        var = var - C * (W[:, J] @ theta[J]) ** 2
    return np.maximum(var, 0.0)


def _frequency_variance(mech: Any, f_hat: np.ndarray, basis: VarianceBasis) -> np.ndarray:
    if basis == "worst":
        worst = max(float(np.max(mech.variance(0.0))), float(np.max(mech.variance(1.0))))
        return np.full(f_hat.shape, worst)
    return np.broadcast_to(np.asarray(mech.variance(np.clip(f_hat, 0.0, 1.0)), dtype=float), f_hat.shape).copy()


def estimate_stream(spec: StreamSpec, rows: list[Any] | np.ndarray | DecodedReports, round_id: str = "",
                    stream: str = "", level: float = 0.95, variance: VarianceBasis = "plugin",
                    consistency: bool = True, decoder: StreamDecoder | None = None,
                    quantiles: tuple[float, ...] = DEFAULT_QUANTILES) -> StreamEstimate:
    """Estimate one stream from its report rows (``body["report"]`` of each stored report, a stacked array, or
    :meth:`StreamDecoder.from_bodies` output). Rows the stream's mechanism cannot have produced (wrong shape, outside
    its support) are dropped and counted in ``dropped``; ``n`` counts the rows used."""
    if variance not in ("plugin", "worst"):
        raise ValueError("variance must be 'plugin' or 'worst'")
    if decoder is None:
        decoder = StreamDecoder.for_spec(spec)
    decoded = rows if isinstance(rows, DecodedReports) else decoder.stack(rows)
    keep = decoder.valid_mask(decoded.reports)
    stats = decoder.entry.statistics(decoder.mechanism, decoded.reports[keep])
    return estimate_statistics(spec, stats, round_id, stream, level, variance, consistency, decoder=decoder,
                               dropped=int(decoded.dropped + keep.size - stats.n), quantiles=quantiles)


def statistics_from_bodies(spec: StreamSpec, bodies: list[str], decoder: StreamDecoder | None = None) -> Statistics:
    """A stream's statistics recomputed from its stored report bodies (the rows its mechanism accepts): what the
    aggregates kept at ingest must equal (``haarvest coordinator aggregates``)."""
    decoder = decoder or StreamDecoder.for_spec(spec)
    decoded = decoder.from_bodies(bodies)
    return decoder.entry.statistics(decoder.mechanism, decoded.reports[decoder.valid_mask(decoded.reports)])


def estimate_statistics(spec: StreamSpec, stats: Statistics, round_id: str = "", stream: str = "",
                        level: float = 0.95, variance: VarianceBasis = "plugin", consistency: bool = True,
                        decoder: StreamDecoder | None = None, dropped: int = 0,
                        quantiles: tuple[float, ...] = DEFAULT_QUANTILES) -> StreamEstimate:
    """Estimate one stream from its sufficient statistics alone (:class:`protocols.catalogue.Statistics`, as kept
    at ingest): the same numbers :func:`estimate_stream` gives from the rows (it goes through here)."""
    if variance not in ("plugin", "worst"):
        raise ValueError("variance must be 'plugin' or 'worst'")
    out = StreamEstimate(round_id=round_id, stream=stream, kind=spec.kind, mechanism=spec.wire_mechanism,
                         n=int(stats.n), level=level, variance_basis=variance, consistency=consistency, unit=spec.unit,
                         dropped=dropped)
    if decoder is None:
        decoder = StreamDecoder.for_spec(spec)
    n = int(stats.n)
    if n == 0:
        out.error = "no valid reports" if out.dropped else "no reports"
        return out
    entry = decoder.entry
    if spec.kind == "distribution":
        _distribution(spec, decoder, stats, out, quantiles)
        return out
    if spec.kind in ("numeric", "vector", "haar"):
        t_hat, var = _normalised_means(spec, decoder, stats, variance)
        lo, hi = spec.lo_hi()
        ci_lo_t, ci_hi_t = confidence_interval(t_hat, var, n, level)
        scale = (hi - lo) / 2.0
        raw = denormalise(t_hat, lo, hi)
        est, c_lo, c_hi = raw, denormalise(ci_lo_t, lo, hi), denormalise(ci_hi_t, lo, hi)
        if consistency:
            est, c_lo, c_hi = (np.clip(a, lo, hi) for a in (est, c_lo, c_hi))
        out.labels = list(spec.dims)
        out.units = list(spec.units or [])
        out.stderr = (scale * np.sqrt(var / n)).tolist()
    else:
        mech = decoder.mechanism
        f_hat = entry.estimate(mech, stats)
        var = _frequency_variance(mech, f_hat, variance)
        c_lo, c_hi = confidence_interval(f_hat, var, n, level)
        raw = est = f_hat
        if consistency:
            est = project_simplex(f_hat)
            c_lo, c_hi = np.clip(c_lo, 0.0, 1.0), np.clip(c_hi, 0.0, 1.0)
        out.labels = _frequency_labels(spec, f_hat.size)
        out.stderr = np.sqrt(var / n).tolist()
    out.estimate, out.ci_low, out.ci_high = (np.asarray(a, dtype=float).tolist() for a in (est, c_lo, c_hi))
    out.raw = np.asarray(raw, dtype=float).tolist()
    out.heavy_hitters = _heavy_hitter_rows(spec, out)
    return out


def _distribution(spec: StreamSpec, decoder: StreamDecoder, stats: Statistics, out: StreamEstimate,
                  quantiles: tuple[float, ...]) -> None:
    """Fill a distribution stream's fields (module docstring). ``variance`` has no effect: the intervals are the
    mechanism's own (plug-in analytic; flat OLH's CDF: empirical from ``stats.squares``, SPEC §3.14)."""
    grid = spec.grid()
    dist = decoder.entry.distribution(decoder.mechanism, stats, out.level, grid.edges)
    D = dist.D
    edges = grid.edges
    out.labels = [f"[{edges[j]:.6g}, {edges[j + 1]:.6g}{']' if j == D - 1 else ')'}" for j in range(D)]
    out.units = list(spec.units or [])
    out.raw = np.asarray(dist.histogram, dtype=float).tolist()
    out.estimate = (dist.consistent_histogram if out.consistency else np.asarray(dist.histogram, dtype=float)).tolist()
    interval = dist.histogram_interval()
    if interval is not None:
        lo, hi = interval
        if out.consistency:
            lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
        out.ci_low, out.ci_high = lo.tolist(), hi.tolist()
        out.stderr = np.sqrt(np.maximum(np.asarray(dist.histogram_variance, dtype=float), 0.0) / dist.n).tolist()
    out.edges = np.asarray(edges, dtype=float).tolist()
    out.cdf = np.asarray(dist.consistent_cdf, dtype=float).tolist()
    band = dist.cdf_band()
    if band is not None:
        out.cdf_low, out.cdf_high = (np.asarray(b, dtype=float).tolist() for b in band)
    if quantiles:
        qs = np.asarray(quantiles, dtype=float)
        values = dist.quantile(qs)
        q_int = dist.quantile_interval(qs)
        out.quantiles = [{"q": float(q), "value": float(values[i]),
                          "low": None if q_int is None else float(q_int[0][i]),
                          "high": None if q_int is None else float(q_int[1][i])} for i, q in enumerate(qs)]


def _normalised_means(spec: StreamSpec, decoder: StreamDecoder, stats: Statistics,
                      basis: VarianceBasis) -> tuple[np.ndarray, np.ndarray]:
    """(t̂, per-user variance) per dimension, in the normalised domain [-1, 1], from the stream's statistics."""
    d = len(spec.dims)
    mech = decoder.mechanism
    t_hat = decoder.entry.estimate(mech, stats)
    if decoder.entry.family is Family.HAAR:
        if basis == "worst":
            return t_hat, np.asarray(mech.worst_case_variances(), dtype=float)
        return t_hat, _haar_moment_variance(mech, stats.squares / stats.n, stats.mean)
    if t_hat.size != d:
        raise ValueError(f"mechanism {spec.mechanism!r} estimated {t_hat.size} values for {d} dimensions")
    if basis == "worst":
        return t_hat, _numeric_variance(mech, t_hat, basis)
    return t_hat, _moment_variance(mech, stats.squares / stats.n, t_hat)


def select_heavy_hitters(spec: HeavyHitterSpec, estimate: Any, stderr: Any, z: float = 3.0,
                         max_candidates: int = 16, min_frequency: float = 0.0) -> np.ndarray:
    """Indices of a heavy-hitter round's selected items (catch-all excluded), largest estimate first.

    The floor is the round's ``threshold`` when set (estimates ≥ it), else strictly above ``max(z·stderr,
    min_frequency)`` per item (significantly above zero); then the one selection rule of the protocols,
    :func:`protocols.heavy_hitters.select_prefixes`: at most ``top_k`` items when set, and never more than
    ``max_candidates`` (a resource limit: the next round's domain grows with every item kept).
    """
    f = np.asarray(estimate, dtype=float).reshape(-1)
    se = np.asarray(stderr, dtype=float).reshape(-1)
    if f.shape != (spec.k,) or se.shape != f.shape:
        raise ValueError(f"estimate has shape {f.shape}, the heavy-hitter round has k = {spec.k}")
    if spec.threshold is not None:
        floor: Any = spec.threshold
    else:  # strictly above: the smallest float over the significance floor
        floor = np.nextafter(np.maximum(z * se[:-1], min_frequency), np.inf)
    return select_prefixes(f[:-1], floor, spec.top_k, max_candidates)


def _heavy_hitter_rows(spec: StreamSpec, out: StreamEstimate) -> list[dict[str, Any]]:
    hh = spec.heavy_hitters
    if hh is None or len(out.estimate) != hh.k:
        return []
    width = hh.prefix_bits + hh.step_bits
    return [{"prefix": int(hh.item_prefix(int(i))), "bits": width,  # type: ignore[arg-type]
             "label": out.labels[i], "frequency": out.estimate[i]}
            for i in select_heavy_hitters(hh, out.raw, out.stderr)]  # selected on the unbiased estimate


def _frequency_labels(spec: StreamSpec, k: int) -> list[str]:
    """Item names: the stream's labels; for a heavy-hitter round, each candidate prefix named by
    :meth:`~protocols.contract.HeavyHitterSpec.prefix_name` (with the stream's categories when it names them)."""
    hh = spec.heavy_hitters
    if hh is not None and hh.k == k:  # before the labels: a heavy-hitter round's items are prefixes, not categories
        width = hh.prefix_bits + hh.step_bits
        return [hh.prefix_name(p, width, spec.labels) for p in hh.prefixes] + ["other"]
    if spec.labels is not None and len(spec.labels) == k:
        return list(spec.labels)
    return [str(i) for i in range(k)]


def estimate_round(store: Store, round_id: str, level: float = 0.95, variance: VarianceBasis = "plugin",
                   consistency: bool = True, streams: list[str] | None = None,
                   quantiles: tuple[float, ...] = DEFAULT_QUANTILES) -> dict[str, StreamEstimate]:
    """Estimate every stream (or ``streams``) of a stored round; a stream that fails carries ``error``;
    ``quantiles`` are the levels distribution streams report."""
    row = store.round(round_id)
    if row is None:
        raise ValueError(f"unknown round {round_id!r}")
    config = wire.RoundConfig.model_validate(json.loads(row["config"]))
    params = parse_round_params(config.params)
    out: dict[str, StreamEstimate] = {}
    for name, spec in params.streams.items():
        if streams is not None and name not in streams:
            continue
        stats = store.aggregates(round_id, name)
        bodies: list[str] = []
        try:
            decoder = StreamDecoder.for_spec(spec)
            if stats is not None:  # kept at ingest: the cost does not grow with the reports
                out[name] = estimate_statistics(spec, stats, round_id, name, level, variance, consistency, decoder,
                                                quantiles=quantiles)
                continue
            bodies = store.report_bodies(round_id, name)  # stale or never aggregated: from the reports themselves
            out[name] = estimate_stream(spec, decoder.from_bodies(bodies), round_id, name, level, variance,
                                        consistency, decoder=decoder, quantiles=quantiles)
        except (ValueError, TypeError, KeyError, ImportError) as exc:
            out[name] = StreamEstimate(round_id=round_id, stream=name, kind=spec.kind, mechanism=spec.wire_mechanism,
                                       n=0, level=level, variance_basis=variance, consistency=consistency,
                                       dropped=len(bodies), error=f"{type(exc).__name__}: {exc}", unit=spec.unit)
    return out
