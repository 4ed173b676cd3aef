"""The evaluation's conclusion sentences are computed from the measurements: two different (fake) measurement tables
give different sentences — which method wins, by what ratio, whether a bound held. Fast: no
experiment runs, only the functions that turn tables into text."""

from __future__ import annotations

import math

from simulations.eval import exp_evolving, exp_privacy
from simulations.eval.common import Stat

EPS = [1.0, 4.0]
PIPES = list(exp_evolving.PIPELINES)


def _stat(mean: float, std: float = 0.0, n: int = 4) -> Stat:
    return Stat(mean, std, n)


def _evolving_tables(dbit: float, chain: float, uniform_beaten: bool, bias: float, record: float, alone: float):
    raw = {label: {e: _stat(chain / e) for e in EPS} for label in exp_evolving.CHAINS}
    raw["L-OSUE"] = {e: _stat(chain / e / 2) for e in EPS}
    raw["dBitFlipPM (b=k, d=k)"] = {e: _stat(dbit / e) for e in EPS}
    post = {label: {e: _stat(by[e].mean / 10) for e in EPS} for label, by in raw.items()}
    uniform = min(s.mean for by in raw.values() for s in by.values()) * (2.0 if uniform_beaten else 0.5)
    mean = {exp_evolving.ONEBIT_LABEL: {e: _stat(0.01) for e in EPS},
            exp_evolving.HM_FRESH: {e: _stat(0.002) for e in EPS},
            PIPES[0]: {e: _stat(record) for e in EPS},
            PIPES[1]: {e: _stat(record * 1.1) for e in EPS},
            PIPES[2]: {e: _stat(alone) for e in EPS}}
    biases = {PIPES[0]: _stat(bias, 0.001, 10)}
    return raw, post, mean, uniform, biases


def test_evolving_conclusions_follow_the_measurements():
    a_head, a_find = exp_evolving.conclusions(*_evolving_tables(dbit=0.001, chain=1.0, uniform_beaten=False,
                                                                 bias=0.2, record=0.05, alone=0.01), EPS, [])
    b_head, b_find = exp_evolving.conclusions(*_evolving_tables(dbit=5.0, chain=1.0, uniform_beaten=True,
                                                                 bias=0.0, record=0.005, alone=0.01), EPS, [])
    a, b = " ".join(a_head + a_find), " ".join(b_head + b_find)
    # which method wins
    assert "lowest dBitFlipPM (b=k, d=k)" in a_head[0] and "has no IRR" in a_head[0]
    assert "lowest L-OSUE" in b_head[0] and "has no IRR" not in b_head[0]
    # the chains in measured order at the largest ε
    assert a_head[0].index("L-OSUE 0.125") < a_head[0].index("L-GRR 0.25")
    # whether α-rounding was biased and whether its square dominates the pipeline's error (0.2² = 0.04 of 0.05)
    assert "is biased on Syn" in a and "squared (0.04), it dominates the pipeline's per-round mean error (0.05) at every ε" in a
    assert "shows no significant bias" in b and "is biased" not in b
    # whether the uniform guess beats every private estimate
    assert "below every private raw estimate" in a and "flat histogram" in a
    assert "raw private estimates below it: " in b and "below every private raw estimate" not in b
    # whether the record (shared ε) is worse than Syn alone
    assert "worse on the record" in a_head[1] and "no worse on the record" in b_head[1]


def test_evolving_bias_share_below_half_says_the_noise_dominates():
    raw, post, mean, uniform, _ = _evolving_tables(0.001, 1.0, False, 0.0, 0.05, 0.01)
    _, findings = exp_evolving.conclusions(raw, post, mean, uniform, {PIPES[0]: _stat(0.1, 0.001, 10)}, EPS, [])
    assert any("squared (0.01), it is less than half of the pipeline's per-round mean error (0.05) at every ε: the "
               "noise dominates" in f for f in findings)


def _privacy_summary(lgrr_mean: float, bilo_max: float):
    def row(mean, top, bound):
        return {"mean": mean, "median": mean, "p95": top, "max": top, "bound": bound, "rdp_median": mean}

    return {
        "L-GRR": row(lgrr_mean, lgrr_mean * 2, 360.0), "L-OSUE": row(lgrr_mean, lgrr_mean * 2, 360.0),
        "RAPPOR": row(lgrr_mean, lgrr_mean * 2, 360.0), "BiLOLOHA": row(1.9, bilo_max, 2.0),
        "OLOLOHA": row(2.5, 3.0, 3.0), "dBitFlipPM (b=k, d=1)": row(1.8, 2.0, 2.0),
        next(iter(exp_privacy.PIPELINES)): row(30.0, 40.0, math.nan),
        exp_privacy.BASELINE: row(120.0, 120.0, 120.0),
    }


def test_privacy_conclusions_follow_the_measurements():
    irr = {"L-GRR": 1.5, "dBitFlipPM (b=k, d=1)": math.inf}
    a_head, a_find = exp_privacy.conclusions(_privacy_summary(20.0, 2.0), 120, 0.2, 20.0, irr, 0.5, (180.0, 60.0))
    b_head, b_find = exp_privacy.conclusions(_privacy_summary(60.0, 2.5), 120, 0.2, 20.0, {"L-GRR": 0.5}, 0.5,
                                             (60.0, 60.0))
    a, b = " ".join(a_head + a_find), " ".join(b_head + b_find)
    # value-memoized charges against the distinct values seen
    assert "charge about that many ε∞" in a and "×3.00 (L-GRR)" in b and "about that many" not in b
    # whether every device stayed within its protocol's bound
    assert "stayed within the protocol's own bound (7 with a bound)." in a and "EXCEEDED" not in a
    assert "EXCEEDED by BiLOLOHA (max 2.5 > 2)" in b and "BiLOLOHA 1.9 (max 2.5 > its bound 2)" in b_head[0]
    assert "BiLOLOHA 1.9 (max 2 ≤ its bound 2)" in a_head[0]
    # the IRR's ε compared with ε1, and which protocols have no IRR
    assert "(more than ε1 = 0.5)" in a and "dBitFlipPM (b=k, d=1) have none" in a
    assert "(equal to ε1 = 0.5)" in b and "have none" not in b and "Change times leak" not in b
    # the cheapest protocol is the measured one
    assert "Cheapest: dBitFlipPM (b=k, d=1)" in a_find[1]


def test_evolving_bias_dominating_at_some_epsilons_names_them():
    raw, post, mean, uniform, _ = _evolving_tables(0.001, 1.0, False, 0.0, 0.05, 0.01)
    mean[PIPES[0]] = {1.0: _stat(0.1), 4.0: _stat(0.05)}
    _, findings = exp_evolving.conclusions(raw, post, mean, uniform, {PIPES[0]: _stat(0.2, 0.001, 10)}, EPS, [])
    assert any("(0.05–0.1) at ε ∈ {4} (more than half of it), not at the other ε" in f for f in findings)


def _sections(haar_range: float, pipe_spent: float):
    from simulations.eval.common import Section

    pipe = PIPES[0]
    dimension = Section("dimension", "2", "", data={"ratio": {1.0: {
        "mean": {4: 3.0}, "total": {4: 1.5}, "range": {4: 2.0}, "dyadic": {4: 2.5}}}})
    rng = Section("range", "7", "", data={"analytic": {1.0: {"HaarHRR": {16: haar_range, 256: haar_range},
                                                              "OUE (sum of items)": {16: 1.0, 256: 10.0}}}})
    evolving = Section("evolving", "4", "", data={"mean": {pipe: {1.0: _stat(0.1)},
                                                           exp_evolving.HM_FRESH: {1.0: _stat(0.01)}},
                                                  "rounding_bias": {pipe: -0.05}})
    privacy = Section("privacy", "6", "", data={"summary": {
        next(iter(exp_privacy.PIPELINES)): {"mean": pipe_spent}, exp_privacy.BASELINE: {"mean": 120.0}}})
    return [dimension, rng, evolving, privacy]


def test_the_bottom_line_follows_the_measurements():
    from simulations.eval.report import haar_bottom_line

    a = haar_bottom_line(_sections(haar_range=5.0, pipe_spent=30.0))
    b = haar_bottom_line(_sections(haar_range=50.0, pipe_spent=150.0))
    assert "The Haar idea does pay where it belongs" in a and "from ℓ = 256 at ε = 1" in a
    assert "never beats flat OUE sums here (never at ε = 1)" in b and "does pay" not in b
    assert "×10 that of a fresh HM report" in a and "its memoization cuts the budget spent (mean 30 against 120" in a
    assert "its memoization does not cut the budget spent (mean 150 against 120" in b


def _distribution_tables(square_wins: bool, auto_right: bool, coverage: float):
    from simulations.eval import exp_distribution as X

    errors, picks = {}, {}
    for pop in ("Adult age", "telemetry"):
        for e in EPS:
            row = {m: _stat(1.0 / e, 0.01, 10) for m in X.METHODS}
            row["hierarchical OUE"] = _stat(0.5 / e, 0.01, 10)
            if square_wins:
                row["Square Wave"] = _stat(0.2 / e, 0.01, 10)
            row[X.AUTO] = row["hierarchical OUE"] if auto_right else row["flat OLH"]
            errors.setdefault(pop, {})[e] = {"KS": row, "p99 rank": dict(row)}
            picks.setdefault(pop, {})[e] = {"KS": "hierarchical OUE B=4" if auto_right else "flat OLH",
                                            "p99 rank": "hierarchical OUE B=4" if auto_right else "flat OLH"}
    cov = {m: {e: {"CDF": _stat(coverage), "p50": _stat(1.0), "p99": _stat(0.99),
                   "p50 interpolated": _stat(0.80 if e == 4.0 else 0.95)} for e in EPS} for m in ("flat OUE", "HaarHRR")}
    return errors, picks, cov


def test_distribution_conclusions_follow_the_measurements():
    from simulations.eval import exp_distribution as X

    a_head, a_find = X.conclusions(*_distribution_tables(square_wins=False, auto_right=True, coverage=0.951))
    b_head, b_find = X.conclusions(*_distribution_tables(square_wins=True, auto_right=False, coverage=0.90))
    a, b = " ".join(a_head + a_find), " ".join(b_head + b_find)
    # who wins where, counted over the cells
    assert "Lowest error over 8 (population, ε, query class) cells: hierarchical OUE 8." in a_head[0]
    assert "Square Wave 8" in b_head[0] and "hierarchical OUE" not in b_head[0].split(".")[0]
    # whether auto picks the winner
    assert "auto's pick is the lowest or statistically tied with it in 8 of 8" in a_head[0] and "misses" not in a
    assert "in 0 of 8" in b_head[0] and "it misses in 8" in b_head[0]
    assert "auto: flat OLH, best it could pick: hierarchical OUE" in b
    # whether coverage is within 2 points of nominal
    assert "pointwise CDF intervals 95.1–95.1 %: 4 of 4 (method, ε) cells within ±2 points, 0 below" in a_head[1]
    assert "pointwise CDF intervals 90.0–90.0 %: 0 of 4 (method, ε) cells within ±2 points, 4 below (flat OUE at " \
           "ε = 1 (90.0 %);" in b_head[1]
    # conservative bucket-resolution quantile intervals are "above", the interpolated ones below where measured so
    assert "quantile intervals (bucket resolution) 99.0–100.0 %: 0 of 8 (method, ε, quantile) cells within ±2 " \
           "points, 8 above, 0 below" in a_head[1]
    assert "interpolated quantile intervals 80.0–95.0 %: 2 of 4 (method, ε, quantile) cells within ±2 points, " \
           "2 below (flat OUE p50 at ε = 4 (80.0 %); HaarHRR p50 at ε = 4 (80.0 %))" in a_head[1]


def test_distribution_conclusions_separate_square_wave_from_auto_misses():
    from simulations.eval import exp_distribution as X

    errors, picks, cov = _distribution_tables(square_wins=True, auto_right=True, coverage=0.95)
    head, find = X.conclusions(errors, picks, cov)
    assert "in 8 more only Square Wave (no analytic variance, so never auto's pick) beats it" in head[0]
    assert "Only Square Wave beats auto's pick in: Adult age KS at ε = 1, 4; Adult age p99 rank at ε = 1, 4" in find[-2]
    assert "misses" not in head[0]


def _haar_sections(totals: dict[int, float]):
    from simulations.eval.common import Section

    ratio = {e: {"mean": {4: 3.0}, "range": {4: 2.0}, "dyadic": {4: 2.5}, "total": totals} for e in EPS}
    analytic = {e: {"HaarHRR": {2: 2.0, 8: 0.5}, "OUE (sum of items)": {2: 1.0, 8: 1.0}} for e in EPS}
    mean = {PIPES[0]: {e: _stat(0.05) for e in EPS}, exp_evolving.HM_FRESH: {e: _stat(0.01) for e in EPS}}
    return [Section("dimension", "", "", data={"ratio": ratio}), Section("range", "", "", data={"analytic": analytic}),
            Section("evolving", "", "", data={"mean": mean, "rounding_bias": {PIPES[0]: 0.01}})]


def test_haar_bottom_line_says_it_loses_only_where_it_loses():
    from simulations.eval.report import haar_bottom_line

    mixed = haar_bottom_line(_haar_sections({4: 0.5, 16: 1.0, 64: 2.0}))
    wins = haar_bottom_line(_haar_sections({4: 0.5, 16: 0.8}))
    ties = haar_bottom_line(_haar_sections({4: 1.0}))
    assert "wins d = 4, ε = 1 (×0.50)" in mixed and "ties at d = 16, ε = 1" in mixed and "elsewhere it loses" in mixed
    assert "wins d = 4, ε = 1 (×0.50), d = 16, ε = 1 (×0.80)" in wins and "loses." not in wins.split("For range")[0]
    assert "wins nowhere and ties at d = 4, ε = 1, d = 4, ε = 4. " in ties and "elsewhere it loses" not in ties
