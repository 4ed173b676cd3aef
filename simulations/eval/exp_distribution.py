"""Experiment 9: fleet distributions and percentiles under ε-LDP — every distribution mechanism side by side.

One run compares, at the same audited ε ∈ {0.5, 1, 2, 4}, the mechanisms of :mod:`protocols.distribution` (flat OUE
and OLH, hierarchical intervals with OUE and OLH at their optimal branching, HaarHRR, Square Wave + EMS) and
``auto`` (:func:`~protocols.distribution.choose_distribution_mechanism`: the mechanism it picks for each query class
is run and measured like the others) on three populations:

* Adult's two numeric attributes with a spread (age, hours-per-week; the shipped coarse data: 16 equal-width bins
  over the attribute's range, so the grid is those bins, D = 16; within a bin values are taken as uniform, which
  is how the estimator interpolates too — the truth's quantiles are those of that piecewise-linear CDF);
* a skewed, heavy-tailed telemetry latency (seeded): 95 % lognormal body (median 25 ms, σ = 0.6) and 5 %
  Pareto tail (x_m = 80 ms, α = 1.2) on the declared range [0, 600] ms, D = 64 (values above 600 ms are clipped,
  as a device does; p50/p90/p99 lie far below it). Its truth is the raw values' empirical CDF, so its rank errors
  include the grid's own interpolation error (shown as the "exact histogram" reference).

Query classes: the Kolmogorov–Smirnov distance of the consistent (monotone) CDF at the bucket edges; the absolute
rank error ``|F(q̂) − q|`` of the p50/p90/p99 estimates (F the true CDF); the MSE of range fractions over every
range of each length ℓ (raw unbiased estimates: the difference of two raw prefix estimates, i.e. the sum of the
histogram, or of the consistent tree for the hierarchical methods). Interval coverage: the pointwise CDF intervals
(raw, and the monotone band around the consistent CDF that the quantile intervals invert) at every edge, and the
quantile intervals, against the truth, over the repetitions. Wall time: client (privatize n values) and server
(sufficient statistics → histogram, CDF, intervals, quantiles) at n = 10^5 and 10^6.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocols.distribution import (
    BucketGrid,
    DistributionEstimate,
    DistributionMechanism,
    FlatOracle,
    HaarDistribution,
    HierarchicalIntervals,
    SquareWave,
    choose_distribution_mechanism,
    optimal_branching,
)
from simulations.datasets import adult_codebook, load_adult
from simulations.eval.common import EvalConfig, Figure, Panel, Section, Stat, Table, Timer, fmt_float, panel_plot
from simulations.eval.common import progress, significantly_less, summarise

NAME = "distribution"
TITLE = "9. Distributions and percentiles: flat, hierarchical, HaarHRR, Square Wave and auto"
EPSILONS = (0.5, 1.0, 2.0, 4.0)
QUICK_EPSILONS = (1.0, 4.0)
QUANTILES = (0.5, 0.9, 0.99)
LEVEL = 0.95
#: Coverage needs many repetitions (the standard error of a 95 % coverage over R trials is sqrt(0.0475/R)).
REP_FACTOR = 5
TELEMETRY_N = 100_000
QUICK_N = 5_000
TIMING_SIZES = (100_000, 1_000_000)
QUICK_TIMING_SIZES = (5_000,)
TIMING_EPSILON = 1.0
ADULT_COLUMNS = ("age", "hours_per_week")
TELEMETRY = "telemetry latency (ms)"
TELEMETRY_D = 64
TELEMETRY_HI = 600.0
#: Coverage is "within target" when |coverage − nominal| ≤ this (the issue's 2 points).
COVERAGE_TOLERANCE = 0.02
#: The compared methods (columns), in table order; hierarchical ones at their optimal branching.
METHODS = ("flat OUE", "flat OLH", "hierarchical OUE", "hierarchical OLH", "HaarHRR", "Square Wave")
AUTO = "auto"
INTERPOLATED = " interpolated"
#: Interval kinds grouped for the conclusions (COVERAGE_KINDS: all of them, in table order): (family name, kinds).
COVERAGE_FAMILIES = (
    ("pointwise CDF intervals", ("CDF",)),
    ("the monotone CDF band", ("CDF band",)),
    ("quantile intervals (bucket resolution)", tuple(f"p{round(100 * q)}" for q in QUANTILES)),
    ("interpolated quantile intervals", tuple(f"p{round(100 * q)}{INTERPOLATED}" for q in QUANTILES)),
)
COVERAGE_KINDS = tuple(kind for _, kinds in COVERAGE_FAMILIES for kind in kinds)
EXACT = "exact histogram (no privacy)"
AUDIT = "tests/protocols/distribution/test_distribution_audit.py::test_audit_never_exceeds_epsilon"


@dataclass(frozen=True)
class Population:
    """A population of n values on a public grid and its truth."""

    name: str
    grid: BucketGrid
    unit: np.ndarray  # the devices' values scaled by the grid's bounds to [0, 1] (what every mechanism takes)
    cdf: np.ndarray  # (D,) true fraction at or below each right bucket edge
    rank: Callable[[np.ndarray], np.ndarray]  # raw x → true fraction ≤ x
    quantiles: np.ndarray  # the true QUANTILES (raw units)

    @property
    def n(self) -> int:
        return int(self.unit.size)

    @property
    def D(self) -> int:
        return self.grid.D


def _exact_estimate(pop: Population) -> DistributionEstimate:
    hist = np.diff(np.concatenate([[0.0], pop.cdf]))
    return DistributionEstimate(hist, pop.cdf.copy(), pop.n, EXACT, True, edges=pop.grid.edges)


def adult_population(column: str, limit: int | None = None) -> Population:
    """An Adult numeric column: its 16 coarse codes are the grid's buckets over the attribute's range; a device
    reports its bin's midpoint; the truth is the binned population spread uniformly within each bin."""
    book = adult_codebook()[column]
    codes = load_adult().data[:, book["column"]]
    if limit is not None:
        codes = codes[:limit]
    bins = np.asarray(book["bins"], dtype=float)
    D = bins.shape[0]
    grid = BucketGrid(bins[0, 0], bins[-1, 1], D)
    cdf = np.cumsum(np.bincount(codes, minlength=D)) / codes.size
    edges = grid.edges
    truth = DistributionEstimate(np.diff(np.concatenate([[0.0], cdf])), cdf, codes.size, EXACT, True, edges=edges)
    curve = np.concatenate([[0.0], cdf])
    return Population(f"Adult {column.replace('_', '-')} ({book.get('units', '')})", grid, (codes + 0.5) / D, cdf,
                      lambda x: np.interp(x, edges, curve), truth.quantile(QUANTILES))


def telemetry_values(n: int, rng: np.random.Generator) -> np.ndarray:
    """Latency in ms: 95 % lognormal(ln 25, 0.6), 5 % Pareto(x_m = 80, α = 1.2) (a heavy tail)."""
    body = rng.lognormal(math.log(25.0), 0.6, n)
    tail = 80.0 * (1.0 - rng.random(n)) ** (-1.0 / 1.2)
    return np.where(rng.random(n) < 0.05, tail, body)


def telemetry_population(n: int, rng: np.random.Generator) -> Population:
    raw = telemetry_values(n, rng)
    grid = BucketGrid(0.0, TELEMETRY_HI, TELEMETRY_D)
    ordered = np.sort(raw)
    cdf = np.searchsorted(ordered, grid.edges[1:], side="right") / n
    cdf[-1] = 1.0  # values above the range are clipped into the last bucket
    k = np.ceil(np.asarray(QUANTILES) * n).astype(np.int64) - 1
    return Population(TELEMETRY, grid, grid.unit(raw), cdf,
                      lambda x: np.searchsorted(ordered, x, side="right") / n, ordered[k])


def base_mechanisms(epsilon: float, D: int) -> dict[str, DistributionMechanism]:
    """The compared methods (hierarchical ones at CKS's optimal branching for ranges of every length)."""
    return {
        "flat OUE": FlatOracle(epsilon, D, "oue"),
        "flat OLH": FlatOracle(epsilon, D, "olh"),
        "hierarchical OUE": HierarchicalIntervals(epsilon, D, optimal_branching(epsilon, D, "oue"), "oue"),
        "hierarchical OLH": HierarchicalIntervals(epsilon, D, optimal_branching(epsilon, D, "olh"), "olh"),
        "HaarHRR": HaarDistribution(epsilon, D),
        "Square Wave": SquareWave(epsilon, D),
    }


def lengths_for(D: int) -> list[int]:
    """Range lengths 1, 2, 4, …, D/2."""
    return [1 << i for i in range(max(1, D.bit_length() - 1))]


def query_classes(D: int) -> list[tuple[str, str, int | None]]:
    """(label, auto's query, range length) of every query class measured."""
    out: list[tuple[str, str, int | None]] = [("KS", "cdf", None)]
    out += [(f"p{round(100 * q)} rank", "quantile", None) for q in QUANTILES]
    out += [(f"range ℓ={ell}", "range", ell) for ell in lengths_for(D)]
    return out


def auto_choices(epsilon: float, D: int) -> dict[str, DistributionMechanism]:
    """What ``auto`` picks for each query class."""
    return {label: choose_distribution_mechanism(epsilon, D, query, length).mechanism
            for label, query, length in query_classes(D)}


@dataclass
class Measured:
    """Per (population, ε, mechanism method): error samples per query class and interval hits."""

    errors: dict[str, list[float]]
    cdf_hits: list[float]  # per repetition: fraction of edges whose raw pointwise interval covers the truth
    band_hits: list[float]  # the same for the monotone band around the consistent CDF
    quantile_hits: dict[str, list[bool]]  # by interval kind (p50, …, p50 interpolated, …)


def measure(mech: DistributionMechanism, pop: Population, reports: np.ndarray, m: Measured) -> None:
    """Add one repetition's errors (and interval hits, when the mechanism has intervals) to ``m``."""
    est = mech.distribution(reports, LEVEL, edges=pop.grid.edges)
    _score(est, pop, m)


def _score(est: DistributionEstimate, pop: Population, m: Measured) -> None:
    m.errors.setdefault("KS", []).append(float(np.max(np.abs(est.consistent_cdf - pop.cdf))))
    q_hat = est.quantile(QUANTILES)
    for q, err in zip(QUANTILES, np.abs(pop.rank(q_hat) - np.asarray(QUANTILES))):
        m.errors.setdefault(f"p{round(100 * q)} rank", []).append(float(err))
    cum = np.concatenate([[0.0], np.asarray(est.cdf, dtype=float)])
    true = np.concatenate([[0.0], pop.cdf])
    for ell in lengths_for(pop.D):
        err = (cum[ell:] - cum[:-ell]) - (true[ell:] - true[:-ell])
        m.errors.setdefault(f"range ℓ={ell}", []).append(float(np.mean(err**2)))
    interval = est.cdf_interval()
    if interval is None:
        return
    lo, hi = interval
    inner = slice(0, pop.D - 1)  # F at the upper bound is 1 by definition
    m.cdf_hits.append(float(np.mean((lo[inner] <= pop.cdf[inner]) & (pop.cdf[inner] <= hi[inner]))))
    band = est.cdf_band()
    assert band is not None
    blo, bhi = band
    m.band_hits.append(float(np.mean((blo[inner] <= pop.cdf[inner]) & (pop.cdf[inner] <= bhi[inner]))))
    for interpolate in (False, True):
        qlo, qhi = est.quantile_interval(QUANTILES, interpolate=interpolate)
        for q, a, b, t in zip(QUANTILES, qlo, qhi, pop.quantiles):
            m.quantile_hits.setdefault(_quantile_kind(q, interpolate), []).append(bool(a <= t <= b))


def _quantile_kind(q: float, interpolate: bool) -> str:
    return f"p{round(100 * q)}" + (INTERPOLATED if interpolate else "")


def _empty() -> Measured:
    return Measured({}, [], [], {})


# ------------------------------------------------------------------------------------------------- conclusions


def winners(table: Mapping[str, Stat]) -> tuple[str, list[str]]:
    """(the lowest mean, the others statistically tied with it)."""
    best = min(table, key=lambda k: table[k].mean)
    return best, [k for k in table if k != best and not significantly_less(table[best], table[k])]


def auto_wins(table: Mapping[str, Stat], auto: Stat) -> bool:
    """auto's measured error is the lowest or statistically tied with the lowest of ``table``."""
    best, _ = winners(table)
    return not significantly_less(table[best], auto)


def conclusions(errors: Mapping[str, Mapping[float, Mapping[str, Mapping[str, Stat]]]],
                auto_pick: Mapping[str, Mapping[float, Mapping[str, str]]],
                coverage: Mapping[str, Mapping[float, Mapping[str, Stat]]],
                nominal: float = LEVEL) -> tuple[list[str], list[str]]:
    """(headline, findings) from the measured tables.

    ``errors[pop][ε][query class][method]`` (methods of :data:`METHODS` plus :data:`AUTO`); ``auto_pick[pop][ε][query
    class]`` the family auto picked; ``coverage[method][ε][interval kind]`` pooled over the populations.
    """
    findings: list[str] = []
    wins: dict[str, int] = {}
    cells = 0
    auto_ok = 0
    auto_missed: list[str] = []
    square_only: dict[tuple[str, str], list[float]] = {}  # (population, class) → ε where only Square Wave beat auto
    for pop, by_eps in errors.items():
        per_class: dict[str, list[str]] = {}
        for eps, by_class in by_eps.items():
            for cls, row in by_class.items():
                compared = {k: v for k, v in row.items() if k != AUTO}
                best, ties = winners(compared)
                cells += 1
                wins[best] = wins.get(best, 0) + 1
                per_class.setdefault(cls, []).append(f"{best}" + (f" (tie: {', '.join(ties)})" if ties else "")
                                                     + f" at ε = {eps:g}")
                if AUTO in row:
                    if auto_wins(compared, row[AUTO]):
                        auto_ok += 1
                    else:
                        analytic = {k: v for k, v in compared.items() if k != "Square Wave"}
                        if "Square Wave" in compared and auto_wins(analytic, row[AUTO]):
                            square_only.setdefault((pop, cls), []).append(eps)
                        else:
                            auto_missed.append(f"{pop} {cls} ε = {eps:g} (auto: {auto_pick[pop][eps][cls]}, "
                                               f"best it could pick: {winners(analytic)[0]})")
        groups: dict[str, list[str]] = {}
        for cls, text in per_class.items():
            groups.setdefault("; ".join(text), []).append(cls)
        findings.append(f"{pop}: lowest error — " + " | ".join(f"{', '.join(c)}: {t}" for t, c in groups.items())
                        + ".")
    order = sorted(wins, key=lambda k: -wins[k])
    headline = [f"Lowest error over {cells} (population, ε, query class) cells: "
                + ", ".join(f"{k} {wins[k]}" for k in order)
                + f". auto's pick is the lowest or statistically tied with it in {auto_ok} of {cells}"
                + (f"; in {sum(map(len, square_only.values()))} more only Square Wave (no analytic variance, so "
                   "never auto's pick) beats it" if square_only else "")
                + (f"; it misses in {len(auto_missed)}" if auto_missed else "") + "."]
    if auto_missed:
        findings.append("auto misses the measured winner among the analytic methods in: " + "; ".join(auto_missed)
                        + ".")
    if square_only:
        findings.append("Only Square Wave beats auto's pick in: " + "; ".join(
            f"{pop} {cls} at ε = {', '.join(f'{e:g}' for e in eps_list)}"
            for (pop, cls), eps_list in square_only.items()) + ".")

    tol = round(100 * COVERAGE_TOLERANCE)
    sentences = []
    for family, kinds in COVERAGE_FAMILIES:
        cells = [(method, eps, kind, row[kind].mean) for method, by_eps in coverage.items()
                 for eps, row in by_eps.items() for kind in kinds if kind in row]
        if not cells:
            continue
        values = [c[3] for c in cells]
        below = [f"{m} {k.split(' ')[0] + ' ' if len(kinds) > 1 else ''}at ε = {e:g} ({100 * v:.1f} %)"
                 for m, e, k, v in cells if v < nominal - COVERAGE_TOLERANCE]
        above = sum(v > nominal + COVERAGE_TOLERANCE for v in values)
        within = len(cells) - len(below) - above
        text = (f"{family} {100 * min(values):.1f}–{100 * max(values):.1f} %: {within} of {len(cells)} "
                f"(method, ε{', quantile' if len(kinds) > 1 else ''}) cells within ±{tol} points")
        if above:
            text += f", {above} above"
        text += f", {len(below)} below" + (f" ({'; '.join(below)})" if below else "")
        sentences.append(text)
    headline.append(f"Interval coverage (nominal {100 * nominal:g} %, pooled over the populations): "
                    + "; ".join(sentences) + ".")
    findings.append("Coverage in detail: " + "; ".join(
        f"{method}: " + ", ".join(f"{kind} {100 * min(v):.1f}–{100 * max(v):.1f} %" for kind, v in
                                  _by_kind(by_eps).items()) for method, by_eps in coverage.items()) + ".")
    return headline, findings


def _by_kind(by_eps: Mapping[float, Mapping[str, Stat]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in by_eps.values():
        for kind, stat in row.items():
            out.setdefault(kind, []).append(stat.mean)
    return out


# ------------------------------------------------------------------------------------------------------ the run


def _family(mech: DistributionMechanism) -> str:
    if isinstance(mech, FlatOracle):
        return f"flat {mech.oracle_name.upper()}"
    if isinstance(mech, HierarchicalIntervals):
        return f"hierarchical {mech.oracle_name.upper()} B={mech.B}"
    if isinstance(mech, HaarDistribution):
        return "HaarHRR"
    return "Square Wave"


def run_accuracy(config: EvalConfig, pops: Sequence[Population], epsilons: Sequence[float], reps: int
                 ) -> tuple[dict, dict, dict, dict, dict]:
    """errors[pop][ε][class][method] (Stat), auto_pick[pop][ε][class] (family), coverage[method][ε][kind] (Stat)
    pooled over the populations, reference[pop][class] (the exact histogram's error on the grid),
    coverage_by_population[pop][method][kind] (Stat) pooled over ε."""
    errors: dict = {}
    auto_pick: dict = {}
    hits: dict[str, dict[float, dict[str, list[float]]]] = {}
    pop_hits: dict[str, dict[str, dict[str, list[float]]]] = {}
    reference: dict = {}
    work = [(pop, eps) for pop in pops for eps in epsilons]
    for pop, eps in progress(work, config, "exp9 distributions"):
        base = base_mechanisms(eps, pop.D)
        picks = auto_choices(eps, pop.D)
        runs: dict[str, DistributionMechanism] = {m.method: m for m in base.values()}
        for mech in picks.values():
            runs.setdefault(mech.method, mech)
        measured = {method: _empty() for method in runs}
        for rep in range(reps):
            for method, mech in runs.items():
                rng = config.rng(NAME, pop.name, method, eps, rep)
                measure(mech, pop, mech.privatize_unit(pop.unit, rng), measured[method])
        table: dict[str, dict[str, Stat]] = {}
        for cls, _, _ in query_classes(pop.D):
            row = {label: summarise(measured[mech.method].errors[cls]) for label, mech in base.items()}
            row[AUTO] = summarise(measured[picks[cls].method].errors[cls])
            table[cls] = row
        errors.setdefault(pop.name, {})[eps] = table
        auto_pick.setdefault(pop.name, {})[eps] = {cls: _family(m) for cls, m in picks.items()}
        for label, mech in base.items():
            m = measured[mech.method]
            if not m.cdf_hits:
                continue
            for by_kind in (hits.setdefault(label, {}).setdefault(eps, {}),
                            pop_hits.setdefault(pop.name, {}).setdefault(label, {})):
                by_kind.setdefault("CDF", []).extend(m.cdf_hits)
                by_kind.setdefault("CDF band", []).extend(m.band_hits)
                for kind, h in m.quantile_hits.items():
                    by_kind.setdefault(kind, []).extend(float(x) for x in h)
        if pop.name not in reference:
            ref = _empty()
            _score(_exact_estimate(pop), pop, ref)
            reference[pop.name] = {cls: v[0] for cls, v in ref.errors.items()}
    coverage = {label: {eps: {kind: summarise(v) for kind, v in by_kind.items()} for eps, by_kind in by_eps.items()}
                for label, by_eps in hits.items()}
    by_population = {pop: {label: {kind: summarise(v) for kind, v in by_kind.items()} for label, by_kind in by.items()}
                     for pop, by in pop_hits.items()}
    return errors, auto_pick, coverage, reference, by_population


def run_timing(config: EvalConfig, sizes: Sequence[int]) -> dict[str, dict[int, tuple[float, float]]]:
    """Wall seconds (client, server) per method and n on the telemetry metric at ε = TIMING_EPSILON."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    grid = BucketGrid(0.0, TELEMETRY_HI, TELEMETRY_D)
    for n in sizes:
        unit = grid.unit(telemetry_values(n, config.rng(NAME, "timing values", n)))
        for label, mech in base_mechanisms(TIMING_EPSILON, grid.D).items():
            rng = config.rng(NAME, "timing", label, n)
            with Timer() as tc:
                reports = mech.privatize_unit(unit, rng)
            with Timer() as ts:
                total, squares = mech.statistics_moments(reports)
                est = mech.distribution_from_statistics(total, n, LEVEL, grid.edges, squares)
                est.quantile(QUANTILES)
                if est.cdf_variance is not None:
                    est.quantile_interval(QUANTILES)
            out.setdefault(label, {})[n] = (tc.seconds, ts.seconds)
            del reports
    return out


def _fmt_pct(stat: Stat) -> str:
    return f"{100 * stat.mean:.1f}"


def run(config: EvalConfig) -> Section:
    quick = config.quick
    epsilons = QUICK_EPSILONS if quick else EPSILONS
    reps = config.reps if quick else REP_FACTOR * config.reps
    limit = QUICK_N if quick else None
    pops = [adult_population(c, limit) for c in ADULT_COLUMNS]
    pops.append(telemetry_population(QUICK_N if quick else TELEMETRY_N, config.rng(NAME, "telemetry")))
    errors, auto_pick, coverage, reference, coverage_by_population = run_accuracy(config, pops, epsilons, reps)
    timing = run_timing(config, QUICK_TIMING_SIZES if quick else TIMING_SIZES)
    headline, findings = conclusions(errors, auto_pick, coverage)

    tables = []
    for pop in pops:
        t = Table(f"{pop.name} (n = {pop.n:,}, D = {pop.D}): error per query class (mean ± std over {reps} "
                  "repetitions; KS and rank errors in CDF units, range MSE in squared fractions); lowest in bold",
                  ["ε", "query", *METHODS, "auto (its pick)", EXACT])
        for eps in epsilons:
            for cls, row in errors[pop.name][eps].items():
                best, _ = winners({k: v for k, v in row.items() if k != AUTO})
                cells = [f"**{row[m].fmt()}**" if m == best else row[m].fmt() for m in METHODS]
                t.add(f"{eps:g}", cls, *cells, f"{row[AUTO].fmt()} ({auto_pick[pop.name][eps][cls]})",
                      fmt_float(reference[pop.name][cls]))
        tables.append(t)
    cov = Table(f"Interval coverage in % (nominal {100 * LEVEL:g} %), pooled over the three populations "
                f"({reps} repetitions each): the raw pointwise CDF interval and the monotone band around the "
                "consistent CDF (mean over the D − 1 inner edges), and the quantile intervals (inverted band) at bucket "
                "resolution and interpolated inside the buckets",
                ["method", "ε", *COVERAGE_KINDS])
    for label, by_eps in coverage.items():
        for eps, row in by_eps.items():
            cov.add(label, f"{eps:g}", *[_fmt_pct(row[k]) for k in COVERAGE_KINDS])
    tables.append(cov)
    cov_pop = Table(f"Interval coverage in % by population, pooled over ε ({len(epsilons)} × {reps} repetitions)",
                    ["population", "method", *COVERAGE_KINDS])
    for pop_name, by_method in coverage_by_population.items():
        for label, row in by_method.items():
            cov_pop.add(pop_name, label, *[_fmt_pct(row[k]) for k in COVERAGE_KINDS])
    tables.append(cov_pop)
    sizes = sorted({n for by_n in timing.values() for n in by_n})
    tim = Table(f"Wall time in seconds at ε = {TIMING_EPSILON:g} on the telemetry metric (D = {TELEMETRY_D}): "
                "client = privatize n values; server = sufficient statistics → histogram, CDF, intervals, quantiles",
                ["method", *[f"{side} n = {n:,}" for n in sizes for side in ("client", "server")]])
    for label, by_n in timing.items():
        tim.add(label, *[fmt_float(by_n[n][i]) for n in sizes for i in (0, 1)])
    tables.append(tim)

    figures = _plots(config, pops, epsilons, errors)
    branch = ", ".join(f"ε = {e:g}: OUE B = {optimal_branching(e, p.D, 'oue')}, OLH B = "
                       f"{optimal_branching(e, p.D, 'olh')}" for p in pops[-1:] for e in epsilons)
    setup = f"""
{__doc__.split(chr(10) + chr(10), 1)[1].strip()}

Each cell is one mechanism run end to end (privatize every user's value at ε, then the server's estimate), {reps}
independent repetitions per (population, ε, mechanism). Hierarchical branching (D = {TELEMETRY_D}; CKS's optimum
for ranges of every length): {branch}. The **auto** column is the mechanism
`choose_distribution_mechanism(ε, D, query)` picks for that query class (cdf for KS, quantile for the ranks,
range of length ℓ), run and measured like the others. The last column is the error of the exact histogram on the
same grid (no privacy): the floor the grid itself sets (0 for KS and ranges at the bucket edges). Every
mechanism's ε is audited (`{AUDIT}`, with negative controls).

Coverage: hierarchical intervals use the exact first-order variance of their *consistent* estimate (SPEC §3.14);
the quantile interval is the inverted band at bucket resolution (guaranteed whatever the values' shape inside a
bucket, hence conservative where the band is narrower than a bucket's mass); "interpolated" inverts the linearly
interpolated band (narrower; assumes values spread uniformly within each bucket, which holds for the Adult truth by
construction and not for the latency). Flat OLH's CDF intervals use the empirical variance of the users' prefix
supports, kept as additive statistics (its range formula for ℓ ≥ 2 buckets is idealised: the Carter–Wegman hash is
not 3-wise independent, and intervals from it under-cover); flat OUE's formula is exact. Square Wave has no
intervals.
"""
    data = {"errors": errors, "auto_pick": auto_pick, "coverage": coverage, "timing": timing,
            "reference": reference, "populations": [p.name for p in pops],
            "coverage_by_population": coverage_by_population}
    return Section(NAME, TITLE, setup, tables=tables, figures=figures, findings=findings, headline=headline,
                   data=data)


def _plots(config: EvalConfig, pops: Sequence[Population], epsilons: Sequence[float], errors: dict
           ) -> list[Figure]:
    eps = list(epsilons)
    panels = []
    for pop in pops:
        for cls in ("KS", "p50 rank", "p99 rank"):
            series = {m: ([errors[pop.name][e][cls][m].mean for e in eps], [errors[pop.name][e][cls][m].std
                                                                              for e in eps]) for m in METHODS}
            panels.append(Panel(eps, series, "ε", cls if cls == "KS" else f"{cls} error", f"{pop.name}: {cls}",
                                logx=True))
    panel_plot(config.img_dir / "exp9_distribution_errors.png", panels, ncols=3)
    range_panels = []
    for pop in pops:
        ells = lengths_for(pop.D)
        for e in (eps[0], eps[-1]):
            series = {m: ([errors[pop.name][e][f"range ℓ={ell}"][m].mean for ell in ells],
                          [errors[pop.name][e][f"range ℓ={ell}"][m].std for ell in ells]) for m in METHODS}
            range_panels.append(Panel(ells, series, "range length ℓ (buckets)", "MSE of the range fraction",
                                      f"{pop.name}, ε = {e:g}", logx=True))
    panel_plot(config.img_dir / "exp9_distribution_ranges.png", range_panels, ncols=2)
    return [Figure("exp9_distribution_errors.png", "Experiment 9: KS distance and p50/p99 rank error versus ε "
                   "(log–log; error bars ± std over repetitions)."),
            Figure("exp9_distribution_ranges.png", "Experiment 9: MSE of range fractions versus range length at the "
                   "smallest and largest ε.")]
