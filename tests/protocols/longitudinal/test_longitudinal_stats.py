"""Statistical tests of the longitudinal estimators: unbiasedness, variance against the analytic formulas,
memoized multi-round behaviour on Syn, and agreement with multi-freq-ldpy's LOLOHA (L-LH) implementation.

Tolerances are ≥ 5 standard errors with fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols.frequency import clip_normalise
from protocols.longitudinal import (
    DDRM,
    LGRR,
    LOLOHA,
    LOSUE,
    LSUE,
    RAPPOR,
    DBitFlipPM,
    OneBitMeanMemo,
)
from simulations.syn import generate_syn, true_frequencies

pytestmark = pytest.mark.statistical


def _population(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    weights = np.linspace(1.0, 3.0, k)
    values = rng.choice(k, size=n, p=weights / weights.sum())
    return values, np.bincount(values, minlength=k) / n


def _check_standardised(errors: np.ndarray, sd: np.ndarray) -> None:
    """errors (R, k) of independent repetitions; sd (k,) the analytic standard deviation of one estimate."""
    z = errors / sd
    reps, k = z.shape
    # unbiased: the per-value mean error over R repetitions is N(0, 1/R)
    assert np.abs(z.mean(axis=0)).max() < 5 / np.sqrt(reps)
    # variance: the mean of z² over R·k cells is ≈ 1 (z² has variance ≈ 2)
    assert abs((z**2).mean() - 1.0) < 5 * np.sqrt(2 / (reps * k))


@pytest.mark.parametrize(
    "protocol",
    [LGRR(2.0, 1.0, 8), LOSUE(2.0, 1.0, 8), LSUE(2.0, 1.0, 8), LOLOHA(2.0, 1.0, 8, g=2), LOLOHA(4.0, 2.0, 8, g="optimal")],
    ids=lambda p: f"{p.name}-{p.params().get('g', '')}",
)
def test_chain_estimators_unbiased_with_analytic_variance(protocol):
    rng = np.random.default_rng(11)
    n, reps = 4000, 150
    values, f = _population(rng, n, 8)
    errors = np.empty((reps, 8))
    for r in range(reps):
        fleet = protocol.new_fleet(n, rng)
        reports, _ = protocol.privatize_round(values, fleet, rng)
        errors[r] = protocol.estimate_round(reports) - f
    _check_standardised(errors, np.sqrt(protocol.variance(f) / n))


def test_memoized_rounds_stay_unbiased_on_syn_with_analytic_mse():
    """Syn (scaled down): τ rounds of a fleet with memoization; every round unbiased, mean MSE = analytic."""
    rng = np.random.default_rng(12)
    n, tau, k = 3000, 40, 12
    values = generate_syn(rng, n=n, tau=tau, k=k)
    truth = true_frequencies(values, k)
    for protocol in (LOLOHA.optimal(2.0, 1.0, k), LGRR(2.0, 1.0, k), LOSUE(2.0, 1.0, k)):
        reps = 6
        mse, predicted = [], []
        for _ in range(reps):
            result = protocol.simulate_rounds(values, rng)
            err = result.estimates - truth
            mse.append((err**2).mean())
            predicted.append((protocol.variance(truth) / n).mean())
            assert np.all(result.spent <= protocol.longitudinal_bound() + 1e-9)
        # each of reps·tau·k errors has sd ≈ sqrt(Var/n); rounds are correlated through the memo, so allow for
        # only reps·k effective samples
        rel_se = np.sqrt(2 / (reps * k))
        assert abs(np.mean(mse) / np.mean(predicted) - 1) < 5 * rel_se


def test_loloha_mse_agrees_with_multi_freq_ldpy():
    """One LOLOHA round = one L-OLH report of multi-freq-ldpy (same g, p1, p2); compare the MSE of the
    clipped-and-normalised estimates (multi-freq-ldpy's MI post-processing) over repeated rounds."""
    llh = pytest.importorskip("multi_freq_ldpy.long_freq_est.L_LH")
    rng = np.random.default_rng(13)
    n, k, eps_inf, eps_1, reps = 2000, 10, 2.0, 1.0, 30
    values, f = _population(rng, n, k)
    ours_protocol = LOLOHA.optimal(eps_inf, eps_1, k)
    ours, theirs = [], []
    for _ in range(reps):
        fleet = ours_protocol.new_fleet(n, rng)
        reports, _ = ours_protocol.privatize_round(values, fleet, rng)
        ours.append(((clip_normalise(ours_protocol.estimate_round(reports)) - f) ** 2).mean())
        their_reports = [llh.L_LH_Client(int(v), k, eps_inf, eps_1, optimal=True) for v in values]
        theirs.append(((llh.L_LH_Aggregator_MI(their_reports, k, eps_inf, eps_1, optimal=True) - f) ** 2).mean())
    ours_arr, theirs_arr = np.array(ours), np.array(theirs)
    se = np.sqrt(ours_arr.var(ddof=1) / reps + theirs_arr.var(ddof=1) / reps)
    assert abs(ours_arr.mean() - theirs_arr.mean()) < 5 * se


def test_rappor_default_decoder_is_unbiased_and_nnls_is_close():
    """Seeded Monte-Carlo z-test of the default (least-squares) decoder over fresh cohorts, PRR and IRR draws."""
    protocol = RAPPOR(num_bits=32, num_hashes=2, num_cohorts=8, f=0.5, p=0.5, q=0.75, domain_size=6)
    rng = np.random.default_rng(14)
    n, reps = 4000, 80
    values, f = _population(rng, n, 6)
    default, nnls = np.empty((reps, 6)), np.empty((reps, 6))
    for r in range(reps):
        fleet = protocol.new_fleet(n, rng)
        reports, _ = protocol.privatize_round(values, fleet, rng)
        default[r] = protocol.estimate_round(reports)
        nnls[r] = protocol.estimate_round(reports, method="nnls")
    se = default.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(default.mean(axis=0) - f) < 5 * se)
    assert np.all(nnls >= 0)
    # de-noised bit counts are unbiased, so with frequencies well above 0 NNLS rarely clips: tiny bias
    assert np.abs(nnls.mean(axis=0) - f).max() < 0.02


def test_rappor_many_rare_candidates_default_unbiased_nnls_total_inflated():
    """The issue-20 symptom at small scale: most candidates absent. The default's estimates (and their total) pass
    a z-test; NNLS clips the absent candidates' noise at 0, so its total is far above 1."""
    k = 60
    protocol = RAPPOR(num_bits=64, num_hashes=2, num_cohorts=8, f=0.5, p=0.5, q=0.75, domain_size=k)
    assert protocol.design_rank() == k
    rng = np.random.default_rng(21)
    n, reps = 3000, 60
    values = rng.choice(6, size=n, p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])  # 54 of 60 candidates never occur
    f = np.bincount(values, minlength=k) / n
    default, totals_nnls = np.empty((reps, k)), np.empty(reps)
    for r in range(reps):
        reports, _ = protocol.privatize_round(values, protocol.new_fleet(n, rng), rng)
        default[r] = protocol.estimate_round(reports)
        totals_nnls[r] = protocol.estimate_round(reports, method="nnls").sum()
    z = (default.mean(axis=0) - f) / (default.std(axis=0, ddof=1) / np.sqrt(reps))
    assert np.abs(z).max() < 4.5  # 60 z-scores: P(max |z| > 4.5) ≈ 60 · 7e-6
    totals = default.sum(axis=1)
    assert abs(totals.mean() - 1.0) < 5 * totals.std(ddof=1) / np.sqrt(reps)
    assert totals_nnls.mean() > 1.0 + 10 * totals_nnls.std(ddof=1) / np.sqrt(reps)


def test_rappor_denoised_bit_counts_unbiased():
    protocol = RAPPOR(num_bits=16, num_hashes=2, num_cohorts=2, domain_size=4)
    rng = np.random.default_rng(15)
    n, reps = 2000, 100
    values = rng.integers(0, 4, n)
    fleet = protocol.new_fleet(n, rng)
    cohorts = fleet.aux["cohorts"]
    table = protocol.bloom_table((0, 1, 2, 3))
    truth = np.zeros((2, 16))
    np.add.at(truth, cohorts, table[cohorts, values])
    est = np.empty((reps, 2, 16))
    for r in range(reps):
        reports, _ = protocol.privatize_round(values, protocol.new_fleet(n, rng, cohorts=cohorts), rng)
        est[r] = protocol.denoised_bit_counts(reports)[0]
    se = est.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(est.mean(axis=0) - truth) < 5 * se + 1e-9)


def test_dbitflip_unbiased_with_analytic_variance():
    protocol = DBitFlipPM(2.0, k=40, b=8, d=3)
    rng = np.random.default_rng(16)
    n, reps = 4000, 150
    values = rng.integers(0, 40, n)
    fb = np.bincount(protocol.bucket(values), minlength=8) / n
    errors = np.empty((reps, 8))
    for r in range(reps):
        reports, _ = protocol.privatize_round(values, protocol.new_fleet(n, rng), rng)
        errors[r] = protocol.estimate_round(reports) - fb
    _check_standardised(errors, np.sqrt(protocol.variance(fb) / n))


@pytest.mark.parametrize("gamma", [0.0, 0.2])
def test_one_bit_mean_memo_unbiased_with_analytic_variance(gamma):
    protocol = OneBitMeanMemo(1.0, m=10.0, s=5, gamma=gamma)
    rng = np.random.default_rng(17)
    n, reps = 3000, 300
    x = rng.random(n) * 10.0
    errors = np.empty(reps)
    for r in range(reps):
        reports, _ = protocol.privatize_round(x, protocol.new_fleet(n, rng), rng)
        errors[r] = protocol.estimate_round(reports) - x.mean()
    sd = np.sqrt(protocol.variance(x).mean() / n)
    z = errors / sd
    assert abs(z.mean()) < 5 / np.sqrt(reps)
    assert abs((z**2).mean() - 1) < 5 * np.sqrt(2 / reps)


def test_ddrm_unbiased_with_analytic_variance():
    protocol = DDRM.for_changes(1.0, horizon=16, changes=3)  # x_0 = 0, so a stream starting at 1 adds a change
    rng = np.random.default_rng(18)
    n, reps = 2000, 150
    start = (rng.random(n) < 0.3).astype(int)
    flips = rng.random((n, 16)) < 0.05
    streams = np.where(np.cumsum(flips, axis=1) % 2 == 1, 1 - start[:, None], start[:, None])
    first_changes = np.argsort(~flips, axis=1, kind="stable")[:, :2]
    keep = np.zeros_like(flips)
    keep[np.arange(n)[:, None], first_changes] = flips[np.arange(n)[:, None], first_changes]
    streams = np.where(np.cumsum(keep, axis=1) % 2 == 1, 1 - start[:, None], start[:, None])  # ≤ 2 changes
    v = protocol.node_values(streams)
    untruncated = DDRM(1.0, horizon=16, max_nonzero=10_000).node_values(streams)
    assert np.array_equal(v, untruncated)  # no device exceeds max_nonzero: no truncation bias
    truth = streams.mean(axis=0)
    errors = np.empty((reps, 16))
    for r in range(reps):
        reports, _ = protocol.privatize_stream(streams, rng)
        errors[r] = protocol.estimate(reports) - truth
    sq = (v**2).mean(axis=0)
    sd = np.sqrt([protocol.variance(t, sq) / n for t in range(1, 17)])
    _check_standardised(errors, sd)
