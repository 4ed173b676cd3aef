"""Benchmark section ``peers``: the peer libraries' own examples, run side by side with haarvest.

* **pure-ldp's ``example.py``** — frequency oracles on its synthetic data (counts 8000, 4000, 1000, 500, 1000, 1800,
  2000, 300 of items 1..8; ε = 3), error = mean squared error of the rounded count estimates, as the example
  prints it: OLH and OUE here; Hadamard response is :func:`simulations.bench.frequency.example_scenario` (reused).
  Its threshold histogram encoding (THE) has no haarvest counterpart and is left out.
* **pure-ldp's heavy-hitter example (PEM)** — four 6-bit strings 101101, 111111, 100000, 101100 held by 8000, 4000,
  1000, 500 users, ε = 3, ``start_length = 2, fragment_length = 2`` (two groups: prefixes of 4 and 6 bits); PEM with
  the example's ``threshold = 0.05`` and with top-3, against haarvest's prefix extension over the same prefix lengths
  (``start_bits = 4, step_bits = 2``) at its default (significance threshold, β = 10⁻³), ``top_k = 3`` and
  ``threshold = 0.05``: how often the true top 3 are all reported, and how often an item nobody holds is.
* **multi-freq-ldpy's single-frequency tutorials** (``1_``/``4_Single_Frequency_Estimation``) — GRR, OUE and OLH on
  Adult's ``age``, MSE of the normalised frequencies; the tutorial's ε range is 0.5..5, its aggregators clip and
  renormalise (``*_Aggregator_MI``), so haarvest's estimate is clip-and-normalised too. The repository ships Adult
  in its coarse form (45,222 users as in the tutorial, age in 16 bins instead of 74 ages).

Every comparison is ``runs`` independent runs (20; 3 with ``--quick``); ratios are haarvest / peer of the mean,
with a delta-method standard error; time is one run's privatize + decode. The prose is computed from the numbers.
"""

from __future__ import annotations

import importlib
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from protocols.frequency import GRR, OLH, OUE, clip_normalise
from protocols.heavy_hitters import PrefixExtensionHeavyHitters
from simulations.bench.frequency import (EXAMPLE_COUNTS, EXAMPLE_EPSILON, SEED, _identity, _pure_ldp, _version,
                                         example_scenario, xxhash_str_compat)

PEM_STRINGS = ("101101", "111111", "100000", "101100")
PEM_COUNTS = (8000, 4000, 1000, 500)
PEM_EPSILON = 3.0
PEM_THRESHOLD = 0.05  # the example's find_heavy_hitters(threshold=0.05)
TUTORIAL_EPSILONS = (1.0, 5.0)  # from the tutorials' range 0.5..5


def ratio(ours: Any, theirs: Any) -> tuple[float, float]:
    """mean(ours)/mean(theirs) and its delta-method standard error."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    r = a.mean() / b.mean()
    rel = np.sqrt((a.std(ddof=1) / np.sqrt(a.size) / a.mean()) ** 2 + (b.std(ddof=1) / np.sqrt(b.size) / b.mean()) ** 2)
    return float(r), float(r * rel)


def verdict(r: float, se: float) -> str:
    """How a haarvest/peer error ratio reads: lower, higher, or within 2 standard errors of 1."""
    if abs(r - 1.0) <= 2 * se:
        return "within noise of"
    return "below" if r < 1 else "above"


def _mean_se(x: Any) -> str:
    a = np.asarray(x, dtype=float)
    return f"{a.mean():,.4g} ± {a.std(ddof=1) / np.sqrt(a.size):,.2g}"


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _seed_peers(seed: int) -> None:
    np.random.seed(seed)  # the peers draw from numpy's and Python's global generators
    random.seed(seed)


# --- pure-ldp example.py: frequency oracles ---------------------------------------------------------------------


def example_oracles(runs: int) -> list[dict[str, Any]]:
    d = len(EXAMPLE_COUNTS)
    values = np.repeat(np.arange(d), EXAMPLE_COUNTS)
    truth = np.asarray(EXAMPLE_COUNTS, dtype=float)
    n = values.size
    rng = np.random.default_rng(SEED)
    ue = _pure_ldp("unary_encoding")
    lh = _pure_ldp("local_hashing")
    xxhash_str_compat(_pure_ldp("local_hashing.lh_client"), _pure_ldp("local_hashing.lh_server"))
    peers = {
        "OLH": (lambda: lh.LHClient(EXAMPLE_EPSILON, d, use_olh=True, index_mapper=_identity),
                lambda: lh.LHServer(EXAMPLE_EPSILON, d, use_olh=True, index_mapper=_identity)),
        "OUE": (lambda: ue.UEClient(EXAMPLE_EPSILON, d, use_oue=True, index_mapper=_identity),
                lambda: ue.UEServer(EXAMPLE_EPSILON, d, use_oue=True, index_mapper=_identity)),
    }
    ours = {"OLH": OLH(EXAMPLE_EPSILON, d), "OUE": OUE(EXAMPLE_EPSILON, d)}
    rows = []
    for name, (make_client, make_server) in peers.items():
        print(f"[bench] peers: example.py {name} ...", file=sys.stderr, flush=True)
        _seed_peers(SEED)
        mine, theirs, t_mine, t_theirs = [], [], [], []
        for _ in range(runs):
            t, est = _timed(lambda: ours[name].estimate(ours[name].privatize(values, rng)) * n)
            mine.append(float(np.mean((np.round(est) - truth) ** 2)))
            t_mine.append(t)

            def peer() -> np.ndarray:
                client, server = make_client(), make_server()
                for v in values.tolist():
                    server.aggregate(client.privatise(v))
                return np.asarray(server.estimate_all(range(d), suppress_warnings=True), dtype=float)

            t, est = _timed(peer)
            theirs.append(float(np.mean((np.round(est) - truth) ** 2)))
            t_theirs.append(t)
        rows.append({"what": f"{name}, ε = {EXAMPLE_EPSILON:g}", "peer": "pure-ldp", "metric": "squared count error",
                     "ours": mine, "theirs": theirs, "t_ours": t_mine, "t_theirs": t_theirs})
    print("[bench] peers: example.py HR (simulations.bench.frequency.example_scenario) ...", file=sys.stderr,
          flush=True)
    hr = example_scenario(runs)
    if hr["pure-ldp"] is not None:
        rows.append({"what": f"Hadamard response, ε = {EXAMPLE_EPSILON:g}", "peer": "pure-ldp",
                     "metric": "squared count error", "ours": hr["haarvest"], "theirs": hr["pure-ldp"],
                     "t_ours": None, "t_theirs": None})
    return rows


# --- pure-ldp example.py: heavy hitters (PEM) -------------------------------------------------------------------


def pem_example(runs: int) -> dict[str, dict[str, Any]]:
    """Per method: runs finding all of the true top 3, runs reporting an item nobody holds, time per run."""
    values = np.repeat(np.array([int(s, 2) for s in PEM_STRINGS]), PEM_COUNTS)
    top3, held = {int(s, 2) for s in PEM_STRINGS[:3]}, {int(s, 2) for s in PEM_STRINGS}
    out: dict[str, dict[str, Any]] = {}

    def record(label: str, found: list[set[int]], times: list[float]) -> None:
        out[label] = {"top3": sum(top3 <= f for f in found), "never_held": sum(bool(f - held) for f in found),
                      "mean_items": float(np.mean([len(f) for f in found])), "time": times, "runs": len(found)}

    protocol = PrefixExtensionHeavyHitters(PEM_EPSILON, 6, start_bits=4, step_bits=2)
    for label, kwargs in (("haarvest default (β = 10⁻³)", {}), ("haarvest top_k = 3", {"top_k": 3}),
                          (f"haarvest threshold = {PEM_THRESHOLD:g}", {"threshold": PEM_THRESHOLD})):
        rng = np.random.default_rng(SEED)
        found, times = [], []
        for _ in range(runs):
            t, res = _timed(lambda: protocol.run(values, rng, **kwargs))
            found.append(set(res.items.tolist()))
            times.append(t)
        record(label, found, times)
    try:
        pem = _pure_ldp("prefix_extending", "heavy_hitters")
    except ImportError:
        return out
    strings = np.repeat(np.array(PEM_STRINGS), PEM_COUNTS).tolist()
    for label, kwargs in ((f"pure-ldp PEM threshold = {PEM_THRESHOLD:g} (the example's)",
                           {"threshold": PEM_THRESHOLD}), ("pure-ldp PEM top-3", {"k": 3})):
        print(f"[bench] peers: {label} ...", file=sys.stderr, flush=True)
        _seed_peers(SEED)
        found, times = [], []
        for _ in range(runs):
            def peer() -> tuple:
                client = pem.PEMClient(epsilon=PEM_EPSILON, start_length=2, max_string_length=6, fragment_length=2)
                server = pem.PEMServer(epsilon=PEM_EPSILON, start_length=2, max_string_length=6, fragment_length=2)
                for s in strings:
                    server.aggregate(client.privatise(s))
                return server.find_heavy_hitters(**kwargs)

            t, (items, _) = _timed(peer)
            found.append({int(s, 2) for s in items})
            times.append(t)
        record(label, found, times)
    return out


# --- multi-freq-ldpy tutorials -----------------------------------------------------------------------------------


def tutorial(runs: int, quick: bool) -> list[dict[str, Any]]:
    from simulations.datasets import load_adult

    age = load_adult().data[:, 0].astype(np.int64)
    if quick:
        age = age[:2_000]
    k, n = int(age.max()) + 1, age.size
    truth = np.bincount(age, minlength=k) / n
    grr = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.GRR")
    ue = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.UE")
    lh = importlib.import_module("multi_freq_ldpy.pure_frequency_oracles.LH")
    xxhash_str_compat(lh)
    rows = []
    for eps in TUTORIAL_EPSILONS:
        peers: dict[str, Callable[[], np.ndarray]] = {
            "GRR": lambda: grr.GRR_Aggregator_MI([grr.GRR_Client(int(x), k, eps) for x in age], k, eps),
            "OUE": lambda: ue.UE_Aggregator_MI([ue.UE_Client(int(x), k, eps, True) for x in age], eps, True),
            "OLH": lambda: lh.LH_Aggregator_MI([lh.LH_Client(int(x), k, eps, True) for x in age], k, eps, True),
        }
        ours = {"GRR": GRR(eps, k), "OUE": OUE(eps, k), "OLH": OLH(eps, k)}
        for name, peer in peers.items():
            print(f"[bench] peers: multi-freq-ldpy tutorial {name} ε = {eps:g} ...", file=sys.stderr, flush=True)
            rng = np.random.default_rng(SEED)
            _seed_peers(SEED)
            mine, theirs, t_mine, t_theirs = [], [], [], []
            for _ in range(runs):
                t, est = _timed(lambda: clip_normalise(ours[name].estimate(ours[name].privatize(age, rng))))
                mine.append(float(np.mean((est - truth) ** 2)))
                t_mine.append(t)
                t, est = _timed(peer)
                theirs.append(float(np.mean((np.asarray(est, dtype=float) - truth) ** 2)))
                t_theirs.append(t)
            rows.append({"what": f"{name}, ε = {eps:g}", "peer": "multi-freq-ldpy", "metric": "MSE",
                         "ours": mine, "theirs": theirs, "t_ours": t_mine, "t_theirs": t_theirs})
    return rows


# --- report --------------------------------------------------------------------------------------------------------


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| comparison | peer | error, haarvest | error, peer | error ratio ± SE | time, haarvest | time, peer | "
             "speed-up |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        r, se = ratio(row["ours"], row["theirs"])
        row["ratio"], row["se"] = r, se
        if row["t_ours"] is None:
            times = "— | — | —"
        else:
            speed = np.mean(row["t_theirs"]) / np.mean(row["t_ours"])
            row["speed"] = float(speed)
            times = f"{np.mean(row['t_ours']) * 1e3:,.1f} ms | {np.mean(row['t_theirs']) * 1e3:,.0f} ms | {speed:,.0f}×"
        lines.append(f"| {row['what']} ({row['metric']}) | {row['peer']} | {_mean_se(row['ours'])} | "
                     f"{_mean_se(row['theirs'])} | {r:.3f} ± {se:.3f} | {times} |")
    return lines


def conclusions(rows: list[dict[str, Any]], pem: dict[str, dict[str, Any]]) -> list[str]:
    """Sentences computed from the measurements (``rows`` after :func:`_table` added ratios and speed-ups)."""
    out = []
    groups: dict[str, list[str]] = {"below": [], "within noise of": [], "above": []}
    for row in rows:
        groups[verdict(row["ratio"], row["se"])].append(f"{row['what']} vs {row['peer']} ({row['ratio']:.2f})")
    for key in ("below", "within noise of", "above"):
        if groups[key]:
            out.append(f"- haarvest's error is {key} the peer's (2 standard errors) on {len(groups[key])} of "
                       f"{len(rows)} comparisons: {'; '.join(groups[key])}.")
    speeds = [row["speed"] for row in rows if "speed" in row]
    if speeds:
        out.append(f"- haarvest was {min(speeds):,.0f}× to {max(speeds):,.0f}× faster per run (privatize + decode)."
                   if min(speeds) >= 1 else
                   f"- speed-ups per run range from {min(speeds):.2f}× to {max(speeds):,.0f}× (below 1: slower).")
    default = next((v for k, v in pem.items() if k.startswith("haarvest default")), None)
    peers = {k: v for k, v in pem.items() if k.startswith("pure-ldp")}
    if default is not None and peers:
        best = max(peers.items(), key=lambda kv: kv[1]["top3"])
        cmp = "matches" if default["top3"] == best[1]["top3"] else (
            "beats" if default["top3"] > best[1]["top3"] else "falls short of")
        out.append(f"- Heavy hitters: haarvest's default found the true top 3 in {default['top3']}/{default['runs']} "
                   f"runs, the best PEM setting ({best[0]}) in {best[1]['top3']}/{best[1]['runs']}: the default "
                   f"{cmp} it; it reported an item nobody holds in {default['never_held']} runs "
                   f"(at most β = 10⁻³ of runs expected).")
    elif default is not None:
        out.append(f"- Heavy hitters: haarvest's default found the true top 3 in {default['top3']}/{default['runs']} "
                   "runs (pure-ldp not installed: no PEM comparison).")
    return out


def run(quick: bool) -> str:
    runs = 3 if quick else 20
    lines = [
        "## Peers' own examples (haarvest vs pure-ldp and multi-freq-ldpy)",
        "",
        f"pure-ldp {_version('pure-ldp')}, multi-freq-ldpy {_version('multi-freq-ldpy')}; {runs} runs per "
        "comparison; error ratio = haarvest / peer of the mean error, ± its delta-method standard error; time = one "
        "run's privatize + decode, speed-up = peer / haarvest (`simulations/bench/peers.py` says what each example "
        "is). The Hadamard row reuses the frequency section's `example_scenario` (no timing there).",
        "",
    ]
    rows: list[dict[str, Any]] = []
    notes = []
    try:
        rows += example_oracles(runs)
    except ImportError as exc:
        notes.append(f"- pure-ldp example.py: not run ({exc}).")
    try:
        rows += tutorial(runs, quick)
    except ImportError as exc:
        notes.append(f"- multi-freq-ldpy tutorials: not run ({exc}).")
    lines += _table(rows)
    pem = pem_example(runs)
    lines += [
        "",
        f"pure-ldp's heavy-hitter example: {', '.join(f'{s} × {c}' for s, c in zip(PEM_STRINGS, PEM_COUNTS))} "
        f"(n = {sum(PEM_COUNTS):,}; the true top 3 hold "
        f"{', '.join(f'{c / sum(PEM_COUNTS):.3f}' for c in PEM_COUNTS[:3])}), ε = {PEM_EPSILON:g}, {runs} runs.",
        "",
        "| method | runs with the true top 3 | runs with an item nobody holds | items reported (mean) | time per run |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, v in pem.items():
        lines.append(f"| {label} | {v['top3']}/{v['runs']} | {v['never_held']}/{v['runs']} | {v['mean_items']:.2f} | "
                     f"{np.mean(v['time']) * 1e3:,.1f} ms |")
    lines += ["", "Conclusions (computed from the tables above):", "", *conclusions(rows, pem), *notes]
    return "\n".join(lines) + "\n"
