"""The fleet simulator (simulations/fleet_pipeline.py): memo hits and charges over rounds, warm-up, static
dimensions, step exponents in the key, clipping, validation (its equivalence with the device:
test_fleet_pipeline_equivalence.py)."""

import numpy as np
import pytest

from protocols.memo_key import canonical_codes, canonical_value
from protocols.numeric import KSampling
from protocols.pipeline import HaarRecord
from protocols.rounding import AlphaRounder, VolatilityDetector
from simulations.fleet_pipeline import MemoizedPipeline


def _square_wave(n: int, rounds: int, centre: float, amplitude: float, d: int = 1) -> np.ndarray:
    sign = np.where(np.arange(rounds) % 2 == 0, 1.0, -1.0)
    return np.broadcast_to((centre + amplitude * sign)[None, :, None], (n, rounds, d)).copy()


def test_jitter_inside_one_cell_is_charged_once_over_120_rounds(rng):
    """Score 2a/(hi-lo) = 0.024 > τ → volatile, step 2^5/100 = 0.32; x ∈ {0.488, 0.512} stays in one α-cell
    unless the cell boundary lo + (j + 1 - u)·step falls in between (u ∈ [0.4, 0.475))."""
    n, rounds = 400, 120
    x = _square_wave(n, rounds, 0.5, 0.012)
    history = _square_wave(n, 16, 0.5, 0.012)
    u = np.linspace(0.0, 0.999, n)[:, None]
    pipe = MemoizedPipeline(0.0, 1.0, 1.0, "haar", mechanism_params={"mean_mechanism": "hybrid", "split": 0.5})
    run = pipe.run(x, rng, history=history, u=u)
    crosses = ((0.488 / 0.32 + u[:, 0]) // 1) != ((0.512 / 0.32 + u[:, 0]) // 1)
    assert 0 < crosses.sum() < n
    keys = run.new_key.sum(axis=1)
    np.testing.assert_array_equal(keys[~crosses], 1)  # ε once, whatever the 120 rounds did
    np.testing.assert_array_equal(keys[crosses], 2)  # two grid points → at most 2ε (SPEC §4 bound)
    np.testing.assert_allclose(run.total_spend, keys * 1.0)
    np.testing.assert_allclose(run.cumulative[:, 0], 1.0)  # charged in the first round, before reporting
    assert np.all(run.rounded_fraction == 1.0)
    # the device keeps returning its stored report
    kept = pipe.run(x[:5], rng, history=history[:5], u=u[:5], keep_reports=True)
    np.testing.assert_array_equal(kept.reports(0), kept.reports(119))


def test_without_history_warm_up_values_are_raw_keys(rng):
    x = _square_wave(10, 120, 0.5, 0.012)
    run = MemoizedPipeline(0.0, 1.0, 1.0, "ksampling").run(x, rng, u=np.full((10, 1), 0.1))
    # rounds 0..15 (window not full): two distinct raw values; from round 16 one rounded key
    np.testing.assert_array_equal(run.new_key.sum(axis=1), 3)
    np.testing.assert_array_equal(np.flatnonzero(run.new_key[0]), [0, 1, 16])
    assert np.all(run.rounded_fraction[:16] == 0) and np.all(run.rounded_fraction[16:] == 1)


def test_without_memoization_every_round_is_charged(rng):
    x = _square_wave(6, 30, 0.5, 0.012)
    run = MemoizedPipeline(0.0, 1.0, 2.0, "ksampling", memoize=False).run(x, rng, keep_reports=True)
    np.testing.assert_allclose(run.charged, 2.0)
    np.testing.assert_allclose(run.cumulative[:, -1], 60.0)
    assert not np.array_equal(run.reports(20), run.reports(22))


def test_static_dimensions_are_not_rounded_and_static_drift_costs_every_round(rng):
    n, rounds = 20, 40
    const = np.full((n, rounds, 1), 30.0)
    drift = 50.0 + 0.001 * np.arange(rounds)[None, :, None] * np.ones((n, 1, 1))  # score 1e-5 ≤ τ: static
    x = np.concatenate([const, drift], axis=2)
    raw = MemoizedPipeline([0, 0], [100, 100], 1.0, "ksampling").run(x, rng)
    assert np.all(raw.rounded_fraction == 0)
    np.testing.assert_array_equal(raw.new_key.sum(axis=1), rounds)  # every drifted value is a new key
    base = MemoizedPipeline([0, 0], [100, 100], 1.0, "ksampling", static="base_grid").run(x, rng)
    assert np.all(base.rounded_fraction == 1)
    assert np.all(base.new_key.sum(axis=1) <= 2)  # 0.04 of drift crosses at most one 1.0-wide cell boundary


def test_step_exponent_is_part_of_the_key(rng):
    """A volatility change that moves the quantised step at an epoch boundary starts a new key."""
    n = 5
    calm = _square_wave(n, 24, 50.0, 1.2)  # score 0.024 → m = 5
    wild = _square_wave(n, 24, 50.0, 3.0)  # score 0.06 → m = 6
    x = np.concatenate([calm, wild, wild], axis=1)
    pipe = MemoizedPipeline(0.0, 100.0, 1.0, "ksampling", epoch_length=24)
    run = pipe.run(x, rng, history=calm[:, :16], u=np.full((n, 1), 0.05))
    assert np.all(run.new_key[:, 0])
    assert np.all(run.new_key[:, 24:48].sum(axis=1) >= 1)  # the epoch starting at reading 40 changed m
    assert np.all(run.cumulative[:, -1] == run.new_key.sum(axis=1))


def test_fleet_validation(rng):
    pipe = MemoizedPipeline([0, 0], [1, 1], 1.0, "ksampling")
    with pytest.raises(ValueError, match="shape"):
        pipe.run(np.zeros((3, 4)), rng)
    with pytest.raises(ValueError, match="u must have shape"):
        pipe.run(np.zeros((3, 4, 2)), rng, u=np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        pipe.run(np.zeros((3, 4, 2)), rng, u=np.ones((3, 2)))
    with pytest.raises(ValueError, match="history must have 3 devices"):
        pipe.run(np.zeros((3, 4, 2)), rng, history=np.zeros((2, 4, 2)))
    with pytest.raises(ValueError, match="finite"):
        pipe.run(np.full((3, 4, 2), np.nan), rng)
    with pytest.raises(ValueError, match="Generator"):
        pipe.run(np.zeros((3, 4, 2)), 7)
    with pytest.raises(ValueError, match="static"):
        MemoizedPipeline([0, 0], [1, 1], 1.0, static="never")
    with pytest.raises(ValueError, match="records of 2"):
        MemoizedPipeline([0, 0], [1, 1], 1.0, KSampling(1.0, 3))
    with pytest.raises(ValueError, match="hi > lo"):
        MemoizedPipeline([0, 0], [1, 0], 1.0)


def test_clipping_is_counted_and_applied(rng):
    x = np.full((4, 3, 1), 150.0)
    run = MemoizedPipeline(0.0, 100.0, 1.0, "ksampling").run(x, rng)
    assert run.clipped == 12
    np.testing.assert_allclose(run.truth, 100.0)


def test_auto_pipeline_uses_the_chosen_mechanism(rng):
    pipe = MemoizedPipeline([0, 0, 0], [1, 1, 1], 1.0, "auto")
    assert isinstance(pipe.mechanism, KSampling)
    pipe_total = MemoizedPipeline([0] * 4, [1] * 4, 4.0, "auto", query="total")
    assert isinstance(pipe_total.mechanism, HaarRecord)
    run = pipe_total.run(np.full((50, 3, 4), 0.3), rng)
    assert run.estimates.shape == (3, 4) and run.stderr.shape == (3, 4)


# ----------------------------------------------------------------------------------------------- the shared steps


def test_a_dimension_scores_the_same_alone_as_beside_others(rng):
    """The simulator holds n·d windows in one detector, a device one per dimension: the scores must be the same
    numbers (numpy's sum over axis 0 of a wide array once added in another order: 0.0884125 beside others,
    0.08841250000000002 alone for this window — volatile on the device and not in the simulator at τ = 0.0884125)."""
    window = [52.74, 45.4, 40.82, 40.33, 56.27, 58.26, 52.13, 54.59, 50.87, 58.7, 56.32, 40.05, 57.15, 40.67, 54.59,
              43.51, 57.26]
    x = np.column_stack([window, rng.uniform(-5, 105, (17, 5))])
    wide = VolatilityDetector(np.zeros(6), np.full(6, 100.0), window=16)
    for row in x:
        wide.update(row)
    for j in range(6):
        alone = VolatilityDetector(0.0, 100.0, window=16)
        for v in x[:, j]:
            alone.update([v])
        assert alone.scores[0] == wide.scores[j]
    assert wide.scores[0] == 0.08841250000000002


def test_round_in_bounds_is_grid_index_and_value_clipped_to_hi():
    rounder = AlphaRounder([0.0, 0.0], [1.0, 1.0], [0.9, 0.0])
    index, value = rounder.round_in_bounds([0.99, 0.5], [0.3, 0.3])
    assert index.tolist() == [4, 1] and value.tolist() == [1.0, 0.3]  # 4·0.3 = 1.2 clipped to hi


def test_canonical_codes_are_one_to_one_with_canonical_values():
    values = np.array([0.0, -0.0, 1.5, 1.5, 3.0, 3.0, 3.0, 2.0])
    rounded = np.array([False, False, False, True, True, True, True, True])
    exponents = np.array([0, 0, 0, 0, 1, 2, 1, 1])
    grid = np.array([0, 0, 0, 3, 3, 3, 4, 3])
    kind, code = canonical_codes(values, rounded, exponents, grid)
    canon = [canonical_value(exponent=int(m), grid_index=int(i)) if r else canonical_value(float(v))
             for v, r, m, i in zip(values, rounded, exponents, grid)]
    for a in range(values.size):
        for b in range(values.size):
            assert (canon[a] == canon[b]) == ((kind[a], code[a]) == (kind[b], code[b])), (a, b)


def test_memo_hits_are_the_first_uses_of_the_traced_canonical_values(rng):
    x = np.round(50 + np.cumsum(rng.normal(0, 0.8, (6, 50, 2)), axis=1), 1)
    x[:, ::5, 1] = 50.0
    pipe = MemoizedPipeline([0, 0], [100, 100], 1.0, "ksampling", window=4, epoch_length=8)
    u = rng.random((6, 2))
    trace, run = pipe.trace(x, u), pipe.run(x, rng, u=u)
    assert trace.rounded.any() and (~trace.rounded).any()
    for i in range(6):
        seen: set[str] = set()
        for r in range(50):
            key = repr(trace.canonical(i, r))
            assert run.new_key[i, r] == (key not in seen)
            seen.add(key)
    np.testing.assert_allclose(trace.values.mean(axis=0), run.target, rtol=1e-12)
