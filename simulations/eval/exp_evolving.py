"""Experiment 4: the evolving dimension (Syn) — per-round frequency MSE and per-round mean MSE versus ε.

Frequency: the item-level longitudinal protocols of :mod:`simulations.eval.longitudinal` (ours, and multi-freq-ldpy's
as separate rows) estimate the per-round histogram over the k = 360 values; MSE = mean over items and rounds of
(f̂_v - f_v)², raw (unbiased) and post-processed (clip at 0 + renormalise, what multi-freq-ldpy's MI estimator does;
RAPPOR: least squares raw, NNLS post-processed).

Mean: α-point rounding + memoization (Ding et al.'s memoized 1BitMean, NeurIPS 2017 §3, and the thesis's pipeline,
:class:`simulations.fleet_pipeline.MemoizedPipeline`) estimates *means* — it has no frequency estimator (Ding et al.'s
histogram protocol is dBitFlipPM, which is in the frequency rows) — so it is measured on the per-round mean of the
evolving value, against the means implied by the frequency protocols' histograms (Σ_v v·f̂_v) and a fresh
Hybrid-mechanism report every round (no memoization: ε spent every round).
"""

from __future__ import annotations

import numpy as np

from protocols.contract import AUTO
from protocols.frequency import clip_normalise
from protocols.longitudinal import RAPPOR, OneBitMeanMemo
from protocols.numeric import Hybrid
from simulations.datasets import SYN_K, adult_with_syn, load_adult, normalise_codes
from simulations.eval.common import EvalConfig, Figure, Panel, Section, Stat, Table, best_of, fmt_float, panel_plot
from simulations.eval.common import progress, series_of, summarise
from simulations.eval.longitudinal import IRR_FRACTION, frequency_protocols, peer_protocols
from simulations.fleet_pipeline import MemoizedPipeline

NAME = "evolving"
TITLE = "4. The evolving dimension: per-round frequency and mean versus ε"
EPSILONS = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
QUICK_EPSILONS = (1.0, 4.0)
PEER_EPSILONS = (1.0, 4.0)
ROUNDS = 5  # evaluated collection rounds per repetition (the first ones of Syn)
QUICK_ROUNDS = 2
QUICK_USERS = 1_000
PEER_REPS = 2
QUICK_PEER_EPSILONS = (1.0,)
QUICK_PEER_USERS = 200
ONEBIT_CELLS = 16
HISTORY = 16  # rounds that fill the pipeline's volatility window (W = 16) before the evaluated rounds
#: Syn's domain size as :func:`simulations.datasets.normalise_codes` takes it (codes → [-1, 1])
SYN_SIZES = np.array([SYN_K])
#: The histogram-implied means shown in the plot (the others are in the table; they are far worse).
MEAN_PLOTTED = ("OLOLOHA (Σ v·f̂_v)", "dBitFlipPM (b=k, d=k) (Σ v·f̂_v)")
ONEBIT_LABEL = "α-rounding + memoization (1BitMean, Ding et al.)"
#: The thesis's pipeline (volatility, α-rounding, memoized record reports): label → (mechanism, whole record?).
#: On Adult+Syn records (d = 16) the Syn column shares ε with 15 other attributes; on Syn alone (d = 1) it has ε.
PIPELINES = {
    "thesis pipeline: α-rounding + memo + Haar record (Adult+Syn, d = 16)": ("haar", True),
    "thesis pipeline: α-rounding + memo + auto (Adult+Syn, d = 16)": (AUTO, True),
    "thesis pipeline: α-rounding + memo + auto (Syn alone, d = 1)": (AUTO, False),
}


#: the α-rounding bias "dominates" the pipeline's mean error where bias² is more than this share of its MSE
DOMINANT_SHARE = 0.5
#: the two-stage chains (ε1 = ε/2) compared at the largest ε
CHAINS = ("L-GRR", "L-OSUE", "BiLOLOHA", "OLOLOHA", "RAPPOR")
HM_FRESH = "HM, fresh every round (no memo)"


def _bias_finding(mean_mse: dict[str, dict[float, Stat]], bias: dict[str, Stat], eps_list: list[float]) -> str:
    """Whether α-rounding biased the pipeline's mean (|bias| > 2 standard errors) and whether bias² dominates the
    pipeline's per-round mean MSE, at which ε."""
    def significant(stat: Stat) -> bool:
        se = stat.std / np.sqrt(max(stat.n, 1))
        return abs(stat.mean) > 2 * se if se > 0 else stat.mean != 0

    biased = [label for label, stat in bias.items() if significant(stat)]
    text = ", ".join(f"{stat.mean:+.3f} ({label.split(': ', 1)[-1]}{'' if label in biased else ', not significant'})"
                     for label, stat in bias.items())
    if not biased:
        return (f"The thesis pipeline's α-rounding shows no significant bias on Syn: the mean of the rounded values "
                f"differs from the true mean by {text} on the [−1, 1] scale (within 2 standard errors).")
    shares = {(label, e): bias[label].mean ** 2 / mean_mse[label][e].mean
              for label in biased for e in eps_list if label in mean_mse and mean_mse[label][e].mean > 0}
    dominated = sorted({e for (_, e), share in shares.items() if share > DOMINANT_SHARE})
    out = (f"The thesis pipeline's α-rounding is biased on Syn: the mean of the rounded values differs from the true "
           f"mean by {text} on the [−1, 1] scale. When Syn is volatile the adaptive step (range·score/η, "
           "quantised, capped) is a large fraction of the range; the top cell then reaches past the bound and the "
           "clipped rounding is no longer unbiased (a bias protocols/rounding.py documents)")
    if not shares:
        return out + "."
    def span(values: list[float]) -> str:
        lo, hi = fmt_float(min(values)), fmt_float(max(values))
        return lo if lo == hi else f"{lo}–{hi}"

    squared = span([bias[label].mean ** 2 for label in biased])
    mse = span([mean_mse[label][e].mean for label, e in shares])
    if len(dominated) == len(eps_list):
        tail = (f" — squared ({squared}), it dominates the pipeline's per-round mean error ({mse}) at every ε "
                "(more than half of it).")
    elif dominated:
        tail = (f" — squared ({squared}), it dominates the pipeline's per-round mean error ({mse}) at "
                f"ε ∈ {{{', '.join(f'{e:g}' for e in dominated)}}} (more than half of it), not at the other ε.")
    else:
        tail = (f" — squared ({squared}), it is less than half of the pipeline's per-round mean error ({mse}) at "
                "every ε: the noise dominates.")
    return out + tail


def conclusions(raw: dict[str, dict[float, Stat]], post: dict[str, dict[float, Stat]],
                mean_mse: dict[str, dict[float, Stat]], uniform_mse: float, bias: dict[str, Stat],
                eps_list: list[float], peer_eps: list[float]) -> tuple[list[str], list[str]]:
    """(headline, findings) computed from the measured tables (``{label: {ε: Stat}}``; ``bias`` per pipeline label)."""
    findings = []
    for eps in eps_list:
        findings.append(
            f"ε = {eps:g}: frequency (raw) lowest {best_of({k: v[eps] for k, v in raw.items()})}; "
            f"mean lowest {best_of({k: v[eps] for k, v in mean_mse.items()})}."
        )
    if bias:
        findings.append(_bias_finding(mean_mse, bias, eps_list))
    beaten = sorted(((label, e) for label, by in raw.items() for e, st in by.items() if st.mean < uniform_mse),
                    key=lambda x: (x[1], x[0]))
    if not beaten:
        uniform = (f"the data-independent uniform guess has MSE {fmt_float(uniform_mse)}, below every private raw "
                   "estimate at these n and ε")
        helped = [(label, e) for label, by in post.items() if label in raw for e in by
                  if e in raw[label] and by[e].mean < raw[label][e].mean]
        if helped and 2 * len(helped) >= sum(len(by) for label, by in post.items() if label in raw):
            uniform += ("; clip+normalise looks good here mostly because it pulls estimates towards a flat "
                        "histogram. The raw column is the honest noise comparison")
    else:
        uniform = (f"the data-independent uniform guess has MSE {fmt_float(uniform_mse)}; raw private estimates "
                   "below it: " + ", ".join(f"{label} at ε = {e:g}" for label, e in beaten))
    findings.append(f"Syn is uniform over k = {SYN_K} values, so per-item frequencies are ≈ 1/k = {1 / SYN_K:.4f}: "
                    + uniform + ".")

    lo_e, hi_e = eps_list[0], eps_list[-1]
    best_raw = {e: min(raw, key=lambda k: raw[k][e].mean) for e in (lo_e, hi_e)}
    agree = []
    for label in post:
        if "multi-freq-ldpy" not in label:
            continue
        ours = label.split(" — ")[0]
        if ours in post and peer_eps:
            e = peer_eps[0]
            agree.append(post[label][e].mean / post[ours][e].mean)
    chains = sorted((c for c in CHAINS if c in raw), key=lambda c: raw[c][hi_e].mean)
    no_irr = " (dBitFlipPM with d = k has no IRR: ε1 = ε∞)" if any(
        best_raw[e].startswith("dBitFlipPM") for e in best_raw) else ""
    headline = [
        f"Per-round frequency on Syn (raw, unbiased): lowest {best_raw[lo_e]} at ε = {lo_e:g} and {best_raw[hi_e]} "
        f"at ε = {hi_e:g}{no_irr}; among the two-stage chains (ε1 = ε/2) at "
        f"ε = {hi_e:g}: " + ", ".join(f"{c} {fmt_float(raw[c][hi_e].mean)}" for c in chains)
        + (f"; multi-freq-ldpy's implementations give ×{min(agree):.2f}–{max(agree):.2f} our post-processed MSE"
           if agree else "") + ".",
    ]
    pipes = list(PIPELINES)
    e_mid = 1.0 if 1.0 in eps_list else lo_e
    if all(k in mean_mse for k in (ONEBIT_LABEL, HM_FRESH, *pipes)):
        record, alone = mean_mse[pipes[0]][e_mid].mean, mean_mse[pipes[2]][e_mid].mean
        share = ("worse on the record, which shares ε among 16 attributes" if record > alone else
                 "no worse on the record, although it shares ε among 16 attributes")
        headline.append(
            f"Per-round mean of the evolving value at ε = {e_mid:g}: memoized 1BitMean "
            f"{fmt_float(mean_mse[ONEBIT_LABEL][e_mid].mean)}, "
            f"fresh HM every round {fmt_float(mean_mse[HM_FRESH][e_mid].mean)}, "
            f"the thesis pipeline on Syn alone {fmt_float(alone)} and on the 16-attribute "
            f"Adult+Syn records {fmt_float(record)} (Haar) / "
            f"{fmt_float(mean_mse[pipes[1]][e_mid].mean)} (auto) — {share}."
        )
    return headline, findings


def run(config: EvalConfig) -> Section:
    syn = config.syn()
    if config.quick:
        syn = syn[:QUICK_USERS]
    n = syn.shape[0]
    rounds = QUICK_ROUNDS if config.quick else ROUNDS
    epsilons = QUICK_EPSILONS if config.quick else EPSILONS
    reps = max(2, config.reps // 2)
    evaluated = slice(HISTORY, HISTORY + rounds)
    values = syn[:, evaluated]
    combined = adult_with_syn(load_adult(), syn)  # the thesis's records: Adult row i + Syn user i (i < n)
    records = combined.records(0, HISTORY + rounds, rows=n)
    lo, hi = np.zeros(combined.domain.d), (combined.domain.sizes - 1).astype(float)
    truth_f = np.stack([np.bincount(values[:, t], minlength=SYN_K) / n for t in range(rounds)])
    grid_values = np.arange(SYN_K)
    truth_mean = normalise_codes(values, SYN_SIZES).mean(axis=0)

    raw: dict[str, dict[float, Stat]] = {}
    post: dict[str, dict[float, Stat]] = {}
    mean_mse: dict[str, dict[float, Stat]] = {}
    acc: dict[tuple[str, str, float], list[float]] = {}

    rounding_bias: dict[str, list[float]] = {}

    def add(kind: str, label: str, eps: float, value: float) -> None:
        acc.setdefault((kind, label, eps), []).append(value)

    grid = [(eps, rep) for eps in epsilons for rep in range(reps)]
    for eps, rep in progress(grid, config, "exp4 evolving"):
        for label, proto in frequency_protocols(eps, SYN_K).items():
            rng = config.rng(NAME, label, eps, rep)
            fleet = proto.new_fleet(n, rng)
            err_raw, err_post, err_mean = [], [], []
            for t in range(rounds):
                reports, _ = proto.privatize_round(values[:, t], fleet, rng)
                if isinstance(proto, RAPPOR):
                    counts = proto.denoised_bit_counts(reports)  # once, for both decoders
                    est = proto.decode_bit_counts(*counts, method="lstsq")
                    est_post = proto.decode_bit_counts(*counts, method="nnls")
                else:
                    est = proto.estimate_round(reports)
                    est_post = clip_normalise(est)
                err_raw.append(np.mean((est - truth_f[t]) ** 2))
                err_post.append(np.mean((est_post - truth_f[t]) ** 2))
                err_mean.append((normalise_codes(grid_values, SYN_SIZES) @ est - truth_mean[t]) ** 2)
            add("raw", label, eps, float(np.mean(err_raw)))
            add("post", label, eps, float(np.mean(err_post)))
            add("mean", f"{label} (Σ v·f̂_v)", eps, float(np.mean(err_mean)))
        # α-point rounding + memoization (memoized 1BitMean on [0, k-1]) and a fresh HM report every round
        onebit = OneBitMeanMemo(eps, m=SYN_K - 1, s=ONEBIT_CELLS)
        rng = config.rng(NAME, "1bit", eps, rep)
        result = onebit.simulate_rounds(values, rng)
        est = 2.0 * np.asarray(result.estimates, dtype=float) / (SYN_K - 1) - 1.0
        add("mean", ONEBIT_LABEL, eps, float(np.mean((est - truth_mean) ** 2)))
        for label, (mech, whole) in PIPELINES.items():
            cols = slice(None) if whole else slice(-1, None)
            pipeline = MemoizedPipeline(lo[cols], hi[cols], eps, mech)
            run_ = pipeline.run(records[:, HISTORY:, cols], config.rng(NAME, label, eps, rep),
                                history=records[:, :HISTORY, cols])
            est = run_.estimates_normalised[:, -1]
            add("mean", label, eps, float(np.mean((est - truth_mean) ** 2)))
            # α-rounding bias: the mean of the rounded values (what the estimate is unbiased for) minus the truth
            span = hi[cols][-1] - lo[cols][-1]
            bias = np.mean(2 * (run_.target[:, -1] - run_.truth[:, -1]) / span)
            rounding_bias.setdefault(label, []).append(float(bias))
        hm = Hybrid(eps)
        rng = config.rng(NAME, "hm", eps, rep)
        hm_est = np.array([hm.estimate(hm.privatize(normalise_codes(values[:, t], SYN_SIZES), rng)) for t in range(rounds)])
        add("mean", HM_FRESH, eps, float(np.mean((hm_est - truth_mean) ** 2)))

    peer_eps = [e for e in epsilons if e in (QUICK_PEER_EPSILONS if config.quick else PEER_EPSILONS)]
    peer_users = QUICK_PEER_USERS if config.quick else n  # quick: a smoke test of the peer path only
    peer_grid = [(eps, rep) for eps in peer_eps for rep in range(PEER_REPS)]
    for eps, rep in progress(peer_grid, config, "exp4 multi-freq-ldpy"):
        t = rep % rounds
        np.random.seed(int(config.rng(NAME, "peer", eps, rep).integers(2**31)))
        v = values[:peer_users, t]
        f = np.bincount(v, minlength=SYN_K) / v.size
        for peer in peer_protocols(eps, SYN_K, jit=not config.quick):
            est = peer.estimate(peer.report(v))
            add("post", f"{peer.label} — multi-freq-ldpy", eps, float(np.mean((est - f) ** 2)))

    for (kind, label, eps), vals in acc.items():
        {"raw": raw, "post": post, "mean": mean_mse}[kind].setdefault(label, {})[eps] = summarise(vals)

    eps_list = list(epsilons)
    ours_post = {k: v for k, v in post.items() if "multi-freq-ldpy" not in k}
    peers_post = {k: v for k, v in post.items() if "multi-freq-ldpy" in k}
    uniform_mse = float(np.mean((1.0 / SYN_K - truth_f) ** 2))
    panels = [
        Panel(eps_list, series_of(raw, eps_list), "ε = ε∞ (ε1 = ε/2 for two-stage chains)", "per-round MSE",
              "frequency, raw unbiased estimates",
              reference={"uniform guess 1/k (no data)": [uniform_mse] * len(eps_list)}),
        Panel(eps_list, series_of(ours_post, eps_list), "ε = ε∞", "per-round MSE",
              "frequency, post-processed (clip+normalise; RAPPOR NNLS)",
              reference={"uniform guess 1/k (no data)": [uniform_mse] * len(eps_list)}),
        Panel(eps_list, series_of({k: v for k, v in mean_mse.items() if k in MEAN_PLOTTED or "(Σ" not in k}, eps_list),
              "ε = ε∞", "per-round MSE of the mean (scale [-1,1])",
              "mean of the evolving value (all rows in the table)"),
    ]
    if peers_post:
        panels.append(Panel(peer_eps, series_of(peers_post, peer_eps), "ε = ε∞", "per-round MSE",
                            "multi-freq-ldpy (MI estimator: clip+normalise)", logx=False,
                            reference={"uniform guess 1/k (no data)": [uniform_mse] * len(peer_eps)}))
    panel_plot(config.img_dir / "exp4_evolving.png", panels, ncols=2)

    freq_table = Table(
        f"Per-round frequency MSE on Syn (n = {n}, k = {SYN_K}; mean ± std over {reps} repetitions of {rounds} "
        f"rounds; peers: {PEER_REPS} single rounds)",
        ["ε = ε∞", "protocol", "ε1", "raw MSE", "post-processed MSE"],
    )
    for eps in eps_list:
        for label in sorted(set(raw) | set(post), key=lambda s: (("multi-freq-ldpy" in s), s)):
            if eps not in post.get(label, {}):
                continue
            e1 = eps if label.startswith("dBitFlipPM") else IRR_FRACTION * eps
            freq_table.add(eps, label, fmt_float(e1), raw[label][eps].fmt() if label in raw else "—",
                           post[label][eps].fmt())
        freq_table.add(eps, "uniform guess 1/k (uses no data)", "0", fmt_float(uniform_mse), fmt_float(uniform_mse))
    mean_table = Table(
        "Per-round MSE of the evolving value's mean (normalised to [−1, 1])",
        ["protocol", *(f"ε = {e:g}" for e in eps_list)],
    )
    for label, by_eps in mean_mse.items():
        mean_table.add(label, *(by_eps[eps].fmt() for eps in eps_list))

    setup = f"""
Syn (n = {n} users, k = {SYN_K} values; collection rounds {HISTORY}–{HISTORY + rounds - 1} evaluated per repetition
(the first {HISTORY} fill the pipeline's volatility window); {reps} repetitions). Every protocol gets **ε∞ = ε** per
memo entry; two-stage chains (L-GRR, L-OSUE, LOLOHA, RAPPOR)
report with **ε1 = ε/2** (α = 0.5); dBitFlipPM (b = k buckets, d = 1 or d = k sampled bits) and α-rounding +
memoization have no IRR (ε1 = ε). RAPPOR: h = 1, 128 Bloom bits, 32 cohorts, f and the IRR calibrated to (ε∞, ε1).
multi-freq-ldpy's implementations (per-user Python loops) run on single rounds at
ε ∈ {{{', '.join(f'{e:g}' for e in peer_eps)}}} ({PEER_REPS} rounds each, {peer_users} users) and are shown as separate
rows; their estimator clips and renormalises. α-rounding +
memoization (memoized 1BitMean, {ONEBIT_CELLS} grid cells over [0, {SYN_K - 1}]) estimates means only and is
compared on the per-round mean, together with the thesis's whole pipeline (`MemoizedPipeline`: volatility detection,
α-rounding of volatile attributes, memoized Haar-record or `auto` reports with ε per new memo key) on the Adult+Syn
records (16 attributes: the Syn column shares ε with the 15 Adult attributes, as in the thesis) and on Syn alone.
"""
    bias_stats = {label: summarise(v) for label, v in rounding_bias.items()}
    bias = {label: stat.mean for label, stat in bias_stats.items()}
    headline, findings = conclusions(raw, post, mean_mse, uniform_mse, bias_stats, eps_list, peer_eps)
    return Section(NAME, TITLE, setup, tables=[freq_table, mean_table], headline=headline,
                   figures=[Figure("exp4_evolving.png",
                                   "Experiment 4: per-round frequency MSE (raw, post-processed, peers) and per-round "
                                   "mean MSE versus ε on Syn.")],
                   findings=findings,
                   data={"raw": raw, "post": post, "mean": mean_mse, "uniform": uniform_mse, "rounding_bias": bias})
