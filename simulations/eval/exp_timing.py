"""Experiment 5: wall time versus the number of users, client and server sides, against the peer libraries.

Client = privatize n users' values (what n devices do together); server = decode the n reports into the estimate.
haarvest is vectorised over users; the peers (multi-freq-ldpy, pure-ldp) privatize and aggregate one user at a time
in Python. A peer is run at a size only while its predicted time (linear in n from the previous size) stays below
:data:`PEER_LIMIT_S`; larger sizes are **extrapolated linearly** (their per-report loops are O(n)) and marked †.
The frequency-oracle implementations are those of the benchmark (:mod:`simulations.bench.frequency`: k = 360,
ε = 1); the longitudinal ones are one collection round of :mod:`simulations.eval.longitudinal` (ε∞ = 1, ε1 = 0.5);
neither peer has numeric mean mechanisms, so the numeric rows have no peer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.numeric import DuchiMultiDim, KSampling
from simulations.bench import frequency as bench_frequency
from simulations.eval.common import EvalConfig, Figure, Section, Stat, Table, Timer, fmt_float, progress, pyplot
from simulations.eval.common import summarise
from simulations.eval.longitudinal import frequency_protocols, peer_protocols

NAME = "timing"
TITLE = "5. Wall time versus the number of users"
SIZES = (1_000, 10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000)
PEER_LIMIT_S = 30.0
QUICK_PEER_LIMIT_S = 1.0
NUMERIC_D = 15
EPSILON = bench_frequency.EPSILON
K = bench_frequency.K
#: Longitudinal protocols timed for one collection round (ε∞ = 1, ε1 = 0.5), haarvest and multi-freq-ldpy.
LONGITUDINAL_FAMILIES = ("L-GRR", "L-OSUE", "BiLOLOHA", "dBitFlipPM (b=k, d=k)")


@dataclass
class Subject:
    """One implementation: ``inputs(n, rng)`` → values; ``client(values)`` → reports; ``server(reports, n)``."""

    family: str
    library: str
    inputs: Callable[[int, np.random.Generator], Any]
    client: Callable[[Any], Any]
    server: Callable[[Any, int], Any]
    peer: bool
    client_times: dict[int, Stat] = field(default_factory=dict)
    server_times: dict[int, Stat] = field(default_factory=dict)
    extrapolated: set[int] = field(default_factory=set)

    @property
    def label(self) -> str:
        return f"{self.family} — {self.library}"


def _categorical(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, K, size=n)


def _records(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=(n, NUMERIC_D))


def _numeric_subject(family: str, mech: Any, rng: np.random.Generator) -> Subject:
    return Subject(family, "haarvest", _records, lambda x: mech.privatize(x, rng), lambda r, n: mech.estimate(r), False)


def _longitudinal_subjects(rng: np.random.Generator, jit: bool) -> list[Subject]:
    """One collection round of haarvest's longitudinal fleet simulators and of multi-freq-ldpy's clients."""
    ours = frequency_protocols(EPSILON, K)
    out = []
    for family in LONGITUDINAL_FAMILIES:
        proto = ours[family]

        def inputs(n: int, gen: np.random.Generator, proto: Any = proto) -> tuple[np.ndarray, Any]:
            return _categorical(n, gen), proto.new_fleet(n, gen)  # device set-up (keys, seeds) is not timed

        out.append(Subject(family, "haarvest", inputs,
                           lambda vf, proto=proto: proto.privatize_round(vf[0], vf[1], rng)[0],
                           lambda r, n, proto=proto: proto.estimate_round(r), False))
    for peer in peer_protocols(EPSILON, K, jit=jit):
        if peer.label in LONGITUDINAL_FAMILIES:
            out.append(Subject(peer.label, "multi-freq-ldpy", _categorical, peer.report,
                               lambda r, n, peer=peer: peer.estimate(r), True))
    return out


def subjects(rng: np.random.Generator, jit: bool = True) -> list[Subject]:
    """haarvest's numeric, frequency and longitudinal mechanisms, and the peers' frequency and longitudinal ones."""
    out = [
        _numeric_subject(f"HM k-sampling (d={NUMERIC_D})", KSampling(EPSILON, NUMERIC_D, "hybrid"), rng),
        _numeric_subject(f"Duchi multi-dim (d={NUMERIC_D})", DuchiMultiDim(EPSILON, NUMERIC_D), rng),
    ]
    impls = bench_frequency.haarvest_impls(rng)[:4]  # GRR, OUE, OLH, HR
    for loader in (bench_frequency.multi_freq_impls, bench_frequency.pure_ldp_impls):
        try:
            impls += loader()
        except ImportError:  # peers are optional extras
            continue
    for impl in impls:
        library = impl.name.split(" ", 1)[0]
        out.append(Subject(impl.oracle, library, _categorical, impl.client, impl.decode, not impl.vectorised))
    return out + _longitudinal_subjects(rng, jit)


def _measure(subject: Subject, sizes: tuple[int, ...], limit: float, repeats: int, rng: np.random.Generator) -> None:
    warm = subject.client(subject.inputs(50, rng))  # imports, JIT compilation and caches stay out of the timings
    subject.server(warm, 50)
    last: tuple[int, float, float] | None = None
    for n in sizes:
        if subject.peer and last is not None and (last[1] + last[2]) * n / last[0] > limit:
            per_c, per_s = last[1] / last[0], last[2] / last[0]
            subject.client_times[n] = Stat(per_c * n, 0.0, 0)
            subject.server_times[n] = Stat(per_s * n, 0.0, 0)
            subject.extrapolated.add(n)
            continue
        values = subject.inputs(n, rng)
        c_times, s_times = [], []
        for _ in range(1 if subject.peer else repeats):
            with Timer() as tc:
                reports = subject.client(values)
            with Timer() as ts:
                subject.server(reports, n)
            c_times.append(tc.seconds)
            s_times.append(ts.seconds)
        subject.client_times[n] = summarise(c_times)
        subject.server_times[n] = summarise(s_times)
        last = (n, float(np.mean(c_times)), float(np.mean(s_times)))


_FAMILY_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                  "tab:gray", "tab:olive", "tab:cyan"]
_LIBRARY_STYLES = {"haarvest": "-", "multi-freq-ldpy": "--", "pure-ldp": "-."}


def _plot(path: Any, subs: list[Subject], sizes: tuple[int, ...]) -> None:
    """2 × 2 panels: (one-shot mechanisms, longitudinal rounds) × (client, server); colour = mechanism, line style =
    library; dotted hollow points are extrapolated."""
    plt = pyplot()
    groups = {
        "numeric and frequency oracles": [s for s in subs if s.family not in LONGITUDINAL_FAMILIES],
        "longitudinal protocols (one round)": [s for s in subs if s.family in LONGITUDINAL_FAMILIES],
    }
    fig, axes = plt.subplots(2, 2, figsize=(13.5, 10.0), dpi=110)
    for row, (group, members) in zip(axes, groups.items()):
        families = list(dict.fromkeys(s.family for s in members))
        for ax, side in zip(row, ("client", "server")):
            for s in members:
                times = s.client_times if side == "client" else s.server_times
                color = _FAMILY_COLORS[families.index(s.family) % len(_FAMILY_COLORS)]
                style = _LIBRARY_STYLES.get(s.library, ":")
                measured = [n for n in sizes if n in times and n not in s.extrapolated]
                means = np.array([times[n].mean for n in measured])
                stds = np.array([times[n].std for n in measured])
                ax.errorbar(measured, means, yerr=np.vstack([np.minimum(stds, 0.9 * means), stds]), color=color,
                            linestyle=style, marker="o", markersize=4, capsize=2, label=s.label)
                if s.extrapolated:
                    ext = [measured[-1], *sorted(s.extrapolated)] if measured else sorted(s.extrapolated)
                    ax.plot(ext, [times[n].mean for n in ext], color=color, linestyle=":", marker="o",
                            markerfacecolor="none", markersize=4)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("number of users n")
            ax.set_ylabel("wall time (s)")
            ax.set_title(f"{group}: {side} side (ε = {EPSILON:g}; dotted = extrapolated †)", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
        row[1].legend(fontsize=7.5, loc="upper left", framealpha=0.9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def run(config: EvalConfig) -> Section:
    sizes = QUICK_SIZES if config.quick else SIZES
    limit = QUICK_PEER_LIMIT_S if config.quick else PEER_LIMIT_S
    repeats = 2 if config.quick else 3
    rng = config.rng(NAME)
    seed = int(config.rng(NAME, "peers").integers(2**31))
    np.random.seed(seed)  # the peers draw from numpy's and Python's global generators
    random.seed(seed)
    subs = subjects(rng, jit=not config.quick)
    for s in progress(subs, config, "exp5 timing"):
        _measure(s, sizes, limit, repeats, rng)
    _plot(config.img_dir / "exp5_wall_time.png", subs, sizes)

    table = Table(
        f"Wall time in seconds (haarvest: mean ± std over {repeats} runs; peers: one run; † extrapolated linearly "
        f"from the largest size run)",
        ["mechanism", "library", "side", *(f"n = {n:,}" for n in sizes)],
    )
    for s in subs:
        for side, times in (("client", s.client_times), ("server", s.server_times)):
            cells = [
                (fmt_float(times[n].mean) + " †") if n in s.extrapolated else times[n].fmt()
                for n in sizes
            ]
            table.add(s.family, s.library, side, *cells)

    big = sizes[-1]
    findings = []
    for family in dict.fromkeys(s.family for s in subs if s.peer):
        ours = next(s for s in subs if s.family == family and not s.peer)
        for peer in (s for s in subs if s.family == family and s.peer):
            total_peer = peer.client_times[big].mean + peer.server_times[big].mean
            total_ours = ours.client_times[big].mean + ours.server_times[big].mean
            findings.append(
                f"{family} at n = {big:,}: {peer.library} {fmt_float(total_peer)} s"
                f"{' (extrapolated)' if big in peer.extrapolated else ''} vs haarvest {fmt_float(total_ours)} s "
                f"(client + server, ×{total_peer / total_ours:,.0f})."
            )
    setup = f"""
n ∈ {{{', '.join(f'{n:,}' for n in sizes)}}} users; frequency oracles and one round of the longitudinal protocols
over k = {K} values (uniform data), numeric mechanisms on d = {NUMERIC_D} records, all at **ε = {EPSILON:g}**
(longitudinal: ε∞ = {EPSILON:g}, ε1 = {EPSILON / 2:g}). Client = privatize all n values; server = decode all n reports.
Peers (multi-freq-ldpy, pure-ldp: per-user Python loops) run at a size only while the predicted
client + server time stays under {limit:g} s; beyond that the time is **extrapolated linearly** (†, dotted in the
plot). Shared 2-core machine: timings are indicative, not assertions.
"""
    speedups: dict[str, float] = {}
    for s in (s for s in subs if s.peer):
        ours = next(o for o in subs if o.family == s.family and not o.peer)
        speedups[f"{s.family} vs {s.library}"] = (
            (s.client_times[big].mean + s.server_times[big].mean)
            / (ours.client_times[big].mean + ours.server_times[big].mean)
        )
    fast = [v for v in speedups.values() if v >= 2]
    slow = {k: v for k, v in speedups.items() if v < 2}
    headline = [
        f"At n = {big:,} (client + server), haarvest's vectorised mechanisms are ×{min(fast):,.0f}–{max(fast):,.0f} "
        f"faster than the peers' per-user loops (peer times beyond {limit:g} s extrapolated)"
        + ("; not so for " + ", ".join(f"{k} (×{v:.1f})" for k, v in slow.items())
           + " — haarvest's simulators derive every permanent bit from a keyed PRF (n·k evaluations)" if slow else "")
        + "."
    ] if fast else []
    return Section(NAME, TITLE, setup, tables=[table], headline=headline,
                   figures=[Figure("exp5_wall_time.png", "Experiment 5: client and server wall time versus n.")],
                   findings=findings,
                   data={s.label: {"client": s.client_times, "server": s.server_times,
                                   "extrapolated": sorted(s.extrapolated)} for s in subs})
