"""Experiment 6: the longitudinal privacy each device actually spends over τ rounds, per protocol.

Every protocol's fleet simulator charges ε∞ when a device creates a new memo entry and 0 for a memoized report
(``privatize_round`` returns the per-device charges — what each device's ledger records, SPEC §4). Over the τ = 120
rounds of Syn we report the distribution of the per-device totals (basic composition, the ledger's rule), the
protocol's own worst-case bound (``longitudinal_bound``), and what :class:`protocols.accounting.Accountant` gives
under advanced and Rényi composition at δ = 10⁻⁶ for the median and the most-charged device. The baseline is a fresh
ε-LDP report every round (no memoization: τ charges of ε).

What the charge covers (see :mod:`protocols.longitudinal.base`): memoization bounds what the transcript reveals about
the *values*; *when* a value changes is protected only by the fresh IRR (ε1 per report), and not at all without one
(dBitFlipPM, 1BitMean with γ = 0) — tests/protocols/longitudinal/test_longitudinal_audit.py demonstrates that leak.
"""

from __future__ import annotations

import numpy as np

from protocols.accounting import Accountant
from protocols.longitudinal import LongitudinalProtocol, OneBitMeanMemo
from simulations.datasets import SYN_K, adult_with_syn, load_adult
from simulations.eval.common import EvalConfig, Figure, Section, Table, fmt_float, progress, pyplot
from simulations.eval.longitudinal import frequency_protocols
from simulations.fleet_pipeline import MemoizedPipeline

NAME = "privacy"
TITLE = "6. Longitudinal privacy actually spent per device"
EPSILON = 1.0
DELTA = 1e-6
QUICK_USERS = 500
QUICK_ROUNDS = 20
BASELINE = "fresh ε-LDP report every round (no memo)"
#: The thesis's pipeline on Adult+Syn records (d = 16), with and without α-rounding of volatile attributes.
PIPELINES = {
    "thesis pipeline: α-rounding + memo + Haar record": True,
    "thesis pipeline: memo only (no rounding)": False,
}


def _protocols() -> dict[str, LongitudinalProtocol]:
    protos: dict[str, LongitudinalProtocol] = dict(frequency_protocols(EPSILON, SYN_K))
    protos["α-rounding + memoization (1BitMean, 16 cells)"] = OneBitMeanMemo(EPSILON, m=SYN_K - 1, s=16)
    return protos


def _composed(epsilon: float, charges: int) -> tuple[float, float, float]:
    """(basic, advanced, RDP) ε at δ for ``charges`` pure ε-LDP charges, from the accountant."""
    if charges == 0:
        return 0.0, 0.0, 0.0
    acc = Accountant()
    for _ in range(charges):
        acc.charge("evolving", "memo", epsilon)
    report = acc.report(DELTA)
    return report.basic[0], report.advanced[0], report.rdp[0]


#: "about" in the findings: a measured total within this factor of the one it is compared with
ABOUT = 1.2
#: value-memoized protocols: one charge per distinct value a device reports
VALUE_MEMOIZED = ("L-GRR", "L-OSUE", "RAPPOR")
#: hashed or bucketed protocols whose own bound caps the spend whatever the changes (those measured in this run)
CAPPED = ("BiLOLOHA", "OLOLOHA", "dBitFlipPM (b=k, d=1)")


def _held(row: dict[str, float]) -> bool:
    return not np.isfinite(row["bound"]) or row["max"] <= row["bound"] * (1 + 1e-9)


def conclusions(summary: dict[str, dict[str, float]], tau: int, changes: float, distinct: float,
                irr: dict[str, float], eps1: float, device_lgrr: tuple[float, float]) -> tuple[list[str], list[str]]:
    """(headline, findings) computed from the measurements: ``summary[label]`` = mean/median/p95/max per-device
    totals and the protocol's ``bound``; ``changes`` the fraction of rounds a value changes, ``distinct`` the mean
    distinct values per device, ``irr[label]`` the ε of one IRR for a changed input (inf without an IRR),
    ``eps1`` and ``device_lgrr`` = (L-GRR's device-unit bound over τ rounds, a fresh GRR at ε1 every round)."""
    fresh = EPSILON * tau
    memo = [k for k in VALUE_MEMOIZED if k in summary]
    ratios = {k: summary[k]["mean"] / (distinct * EPSILON) for k in memo}
    if ratios and all(1 / ABOUT <= r <= ABOUT for r in ratios.values()):
        per_value = f"so value-memoized protocols ({', '.join(memo)}) charge about that many ε∞"
    else:
        per_value = ("so value-memoized protocols charge ×" + ", ×".join(f"{r:.2f} ({k})" for k, r in ratios.items())
                     + " that many ε∞")
    ref = memo[0] if memo else min((k for k in summary if k != BASELINE), key=lambda k: summary[k]["mean"])
    cheaper = "below" if summary[ref]["mean"] < fresh else "not below"
    capped = [k for k in CAPPED if k in summary]
    held = [k for k in summary if np.isfinite(summary[k]["bound"]) and _held(summary[k])]
    broken = [k for k in summary if not _held(summary[k])]
    cheapest = min((k for k in summary if k != BASELINE), key=lambda k: summary[k]["mean"])
    caps = "; ".join(f"{k} max {fmt_float(summary[k]['max'])} against its bound {fmt_float(summary[k]['bound'])}"
                     for k in capped)
    bound_text = (f"Every protocol's most-charged device stayed within the protocol's own bound ({len(held)} with a "
                  "bound)." if not broken else
                  "The bound was EXCEEDED by " + ", ".join(
                      f"{k} (max {fmt_float(summary[k]['max'])} > {fmt_float(summary[k]['bound'])})" for k in broken)
                  + ".")
    no_irr = [k for k, e in irr.items() if not np.isfinite(e)]
    lgrr_irr = irr.get("L-GRR", float("nan"))
    relation = "more than" if lgrr_irr > eps1 * (1 + 1e-9) else ("equal to" if lgrr_irr >= eps1 * (1 - 1e-9)
                                                                    else "less than")
    findings = [
        f"Syn changes value in {changes:.0%} of rounds; a device sees {distinct:.1f} distinct values on "
        f"average over {tau} rounds, {per_value}: mean {fmt_float(summary[ref]['mean'])} ({ref}), {cheaper} the "
        f"{fmt_float(fresh)} of a fresh report every round.",
        f"Cheapest: {cheapest} (mean {fmt_float(summary[cheapest]['mean'])}, bound "
        f"{fmt_float(summary[cheapest]['bound'])}; its utility: experiment 4)" + (f"; {caps}" if caps else "")
        + ". " + bound_text,
        "These are value-unit totals: they bound what the transcript reveals about each value, not when a value "
        f"changes, which only the IRR protects — at ε = {fmt_float(lgrr_irr)} per report for L-GRR here "
        f"({relation} ε1 = {fmt_float(eps1)})"
        + (f"; {', '.join(no_irr)} have none" if no_irr else "")
        + f". Under the device unit (edge_agent's default) L-GRR over {tau} rounds costs "
        f"{fmt_float(device_lgrr[0])}, a fresh GRR at ε1 every round {fmt_float(device_lgrr[1])}.",
    ]
    pipe = next((k for k in PIPELINES if k in summary), None)
    parts = [f"{k} {fmt_float(summary[k]['mean'])}"
             + (f" (max {fmt_float(summary[k]['max'])} {'≤' if _held(summary[k]) else '>'} its bound "
                f"{fmt_float(summary[k]['bound'])})" if np.isfinite(summary[k]["bound"]) else "")
             for k in capped]
    if memo:
        parts.append(f"value-memoized {'/'.join(memo)} {fmt_float(summary[memo[0]]['mean'])}")
    if pipe:
        parts.append(f"the thesis pipeline {fmt_float(summary[pipe]['mean'])}")
    headline = [
        f"Mean ε charged per device over {tau} rounds at ε∞ = {EPSILON:g}: " + ", ".join(parts)
        + f", a fresh report every round {fmt_float(fresh)}."
        + (f" Change times leak without an IRR ({', '.join(no_irr)})." if no_irr else ""),
    ]
    return headline, findings


def run(config: EvalConfig) -> Section:
    syn = config.syn()
    if config.quick:
        syn = syn[:QUICK_USERS, :QUICK_ROUNDS]
    n, tau = syn.shape
    cumulative: dict[str, np.ndarray] = {}
    bounds: dict[str, float] = {}
    eps1: dict[str, float] = {}
    for label, proto in progress(list(_protocols().items()), config, "exp6 privacy spent"):
        rng = config.rng(NAME, label)
        fleet = proto.new_fleet(n, rng)
        charges = np.empty((n, tau))
        for t in range(tau):
            _, charges[:, t] = proto.privatize_round(syn[:, t], fleet, rng)
        cumulative[label] = np.cumsum(charges, axis=1)
        bounds[label] = proto.longitudinal_bound()
        eps1[label] = proto.epsilon_1
    combined = adult_with_syn(load_adult(), syn)  # the thesis's records: Adult row i + Syn user i (i < n)
    records = combined.records(0, tau, rows=n)
    lo, hi = np.zeros(combined.domain.d), (combined.domain.sizes - 1).astype(float)
    for label, rounding in PIPELINES.items():
        pipeline = MemoizedPipeline(lo, hi, EPSILON, "haar", rounding=rounding)
        run_ = pipeline.run(records, config.rng(NAME, label))
        cumulative[label] = run_.cumulative
        bounds[label] = float("nan")  # no closed-form cap: ε per distinct memo key the device ever creates
        eps1[label] = EPSILON
    cumulative[BASELINE] = np.broadcast_to(EPSILON * np.arange(1, tau + 1), (n, tau))
    bounds[BASELINE] = EPSILON * tau
    eps1[BASELINE] = EPSILON

    changes = float(np.mean(syn[:, 1:] != syn[:, :-1]))
    distinct = np.array([np.unique(row).size for row in syn[: min(n, 2000)]])  # a sample: distinct values per device
    table = Table(
        f"Per-device ε spent over τ = {tau} rounds of Syn (n = {n}; ε∞ = {EPSILON:g}, ε1 = ε/2 for chains; "
        f"composition of the charges by the accountant at δ = {DELTA:g})",
        ["protocol", "ε1 (one report)", "mean", "median", "p95", "max", "protocol bound", "median dev.: advanced",
         "median dev.: RDP", "max dev.: RDP"],
    )
    summary: dict[str, dict[str, float]] = {}
    for label, cum in cumulative.items():
        total = cum[:, -1]
        med, top = float(np.median(total)), float(total.max())
        _, adv_med, rdp_med = _composed(EPSILON, int(round(med / EPSILON)))
        _, _, rdp_max = _composed(EPSILON, int(round(top / EPSILON)))
        summary[label] = {"mean": float(total.mean()), "median": med, "p95": float(np.percentile(total, 95)),
                          "max": top, "bound": bounds[label], "rdp_median": rdp_med}
        table.add(label, fmt_float(eps1[label]), fmt_float(total.mean()), fmt_float(med),
                  fmt_float(np.percentile(total, 95)), fmt_float(top), fmt_float(bounds[label]),
                  fmt_float(adv_med), fmt_float(rdp_med), fmt_float(rdp_max))

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 5.4), dpi=110)
    rounds = np.arange(1, tau + 1)
    groups: list[tuple[list[str], np.ndarray]] = []  # protocols with identical charges share one line
    for label, cum in cumulative.items():
        same = next((g for g in groups if np.allclose(g[1], cum, rtol=1e-9, atol=1e-9)), None)
        if same is None:
            groups.append(([label], cum))
        else:
            same[0].append(label)
    colors = plt.get_cmap("tab10")
    for i, (labels, cum) in enumerate(groups):
        lo, hi = np.percentile(cum, [5, 95], axis=0)
        name = labels[0] if len(labels) == 1 else " = ".join(labels)
        color = colors(i % 10)
        ax.plot(rounds, cum.mean(axis=0), label=name, linewidth=1.6, color=color,
                linestyle="--" if BASELINE in labels else "-")
        ax.fill_between(rounds, lo, hi, color=color, alpha=0.08)
    ax.set_yscale("log")
    ax.set_xlabel("collection round")
    ax.set_ylabel("cumulative ε charged per device (mean; band p5–p95)")
    ax.set_title(f"Privacy spent on Syn, ε∞ = {EPSILON:g} (n = {n}, value changes in {changes:.0%} of rounds)",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
    fig.tight_layout()
    config.img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(config.img_dir / "exp6_privacy_spent.png")
    plt.close(fig)

    protos = _protocols()
    irr = {label: proto.irr_input_epsilon for label, proto in protos.items()}
    lgrr = protos["L-GRR"]
    device_lgrr = (lgrr.device_epsilon(tau), lgrr.epsilon_1 * tau)
    setup = f"""
Syn (n = {n} devices, τ = {tau} rounds, k = {SYN_K}); every protocol at **ε∞ = {EPSILON:g}** (chains: ε1 = ε/2; RAPPOR
calibrated to the same pair; dBitFlipPM with b = k and d ∈ {{1, k}}; α-rounding + memoization = memoized 1BitMean on 16
cells); the thesis's pipeline (`MemoizedPipeline`, Haar record at ε per new memo key) on the Adult+Syn records of the
same devices (16 attributes, Syn evolving), with and without α-rounding, from round 0 (the first 16 rounds fill the
volatility window and are reported unrounded). The per-device charges are the ones the simulators record (ε∞ per new
memo entry). "Protocol bound" is the protocol's own worst case (`longitudinal_bound()`; the pipeline has none);
advanced and RDP columns compose the median (or the
maximum) device's charges with `protocols.accounting.Accountant` at δ = {DELTA:g} (each an (ε, δ) guarantee; they
beat basic composition only when a device accumulates many charges).
"""
    headline, findings = conclusions(summary, tau, changes, float(np.mean(distinct)), irr, lgrr.epsilon_1,
                                     device_lgrr)
    return Section(NAME, TITLE, setup, tables=[table], headline=headline,
                   figures=[Figure("exp6_privacy_spent.png",
                                   "Experiment 6: cumulative ε charged per device over the rounds (log scale).")],
                   findings=findings, data={"summary": summary})
