import json
import math

import numpy as np
import pytest

from protocols.rounding import (
    AlphaRounder,
    EpochSteps,
    VolatilityDetector,
    quantised_exponent,
    quantised_step,
    volatility_score,
)

# ---------------------------------------------------------------- volatility


def test_volatility_score_formula():
    # W + 1 = 5 values, W = 4 differences: |2|+|2|+|0|+|4| = 8 over W·(hi-lo) = 4·10
    assert volatility_score([0.0, 2.0, 0.0, 0.0, 4.0], 0.0, 10.0) == pytest.approx(8 / 40)
    assert volatility_score([3.0] * 17, 0.0, 10.0) == 0.0
    assert volatility_score([0.0, 10.0] * 8 + [0.0], 0.0, 10.0) == pytest.approx(1.0)


def test_volatility_score_batches_over_dimensions_and_clips():
    window = np.array([[0.0, 5.0, -50.0], [1.0, 5.0, 50.0], [0.0, 5.0, -50.0]])
    scores = volatility_score(window, [0.0, 0.0, -1.0], [1.0, 10.0, 1.0])
    np.testing.assert_allclose(scores, [1.0, 0.0, 1.0])  # clipped to the bounds: stays in [0, 1]


def test_volatility_score_short_window_and_validation():
    assert volatility_score([1.0], 0.0, 2.0) == 0.0
    with pytest.raises(ValueError, match="hi > lo"):
        volatility_score([1.0, 2.0], 1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        volatility_score([1.0, np.nan], 0.0, 2.0)


def test_detector_slides_and_flags():
    det = VolatilityDetector([0.0, 0.0], [100.0, 100.0], window=4, tau=0.01)
    assert not det.update([50.0, 50.0]).any()  # one value: score 0
    mask = det.update([60.0, 50.0])  # warm-up: mean over the one difference available
    np.testing.assert_allclose(det.scores, [0.1, 0.0])
    assert mask.tolist() == [True, False]
    for _ in range(3):
        det.update([60.0, 50.0])
    # window = [50, 60, 60, 60, 60]: one jump of 10 over W = 4 differences
    np.testing.assert_allclose(det.scores, [10 / 400, 0.0])
    det.update([60.0, 50.0])  # the jump leaves the window of W + 1 = 5 values
    np.testing.assert_allclose(det.scores, [0.0, 0.0])
    assert det.values().shape == (5, 2)
    assert not det.volatile.any()


def test_detector_window_is_the_last_values_in_order():
    """The window holds the last W + 1 records oldest first, at every step, and its scores are exactly
    volatility_score of them (the window shifts in place once full)."""
    rng = np.random.default_rng(7)
    det = VolatilityDetector([0.0, -5.0, 1.0], [10.0, 5.0, 2.0], window=6)
    seen = []
    for _ in range(40):
        x = rng.uniform([-1.0, -6.0, 0.5], [11.0, 6.0, 2.5])
        det.update(x)
        seen.append(x)
        want = np.array(seen[-7:])
        assert det.count == len(want)
        np.testing.assert_array_equal(det.values(), want)
        assert det.scores.tolist() == volatility_score(want, det.lo, det.hi).tolist()
    det.values()[0, 0] = 1e9  # a copy: the window is not changed through it
    assert det.values()[0, 0] != 1e9


def test_detector_threshold_is_strict():
    det = VolatilityDetector(0.0, 1.0, window=1, tau=0.25)
    det.update([0.0])
    assert not det.update([0.25]).any()  # score exactly τ: not volatile
    assert det.update([1.0]).all()  # window [0.25, 1.0]: score 0.75


def test_detector_validation():
    with pytest.raises(ValueError, match="window"):
        VolatilityDetector(0.0, 1.0, window=0)
    with pytest.raises(ValueError, match="tau"):
        VolatilityDetector(0.0, 1.0, tau=1.5)
    det = VolatilityDetector([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="2 values"):
        det.update([0.0, 0.0, 0.0])


# ---------------------------------------------------------------- steps


def test_quantised_step_values():
    scores = np.array([0.0, 0.001, 0.002, 0.0021, 0.005, 0.05, 1.0])
    steps = quantised_step(0.0, 10.0, scores)
    # base (hi-lo)/K = 0.1; raw = 10·max(0.01, score/0.1); rounded up to 0.1·2^m, m ≤ ⌊log2 100⌋ = 6
    np.testing.assert_allclose(steps, [0.1, 0.1, 0.2, 0.4, 0.8, 6.4, 6.4])
    assert quantised_exponent(scores).tolist() == [0, 0, 1, 2, 3, 6, 6]


def test_quantised_step_properties(rng):
    lo, hi = -3.0, 5.0
    scores = rng.uniform(0, 0.2, 1000)
    steps = quantised_step(lo, hi, scores)
    raw = (hi - lo) * np.maximum(1 / 100, scores / 0.1)
    base = (hi - lo) / 100
    m = np.log2(steps / base)
    np.testing.assert_allclose(m, np.round(m))  # a power-of-two multiple of the base step
    assert np.all(m >= 0) and np.all(steps <= hi - lo)
    assert np.all((steps >= raw * (1 - 1e-12)) | (steps == base * 64))  # rounded up unless capped
    order = np.argsort(scores)
    assert np.all(np.diff(steps[order]) >= 0)  # monotone in the score


def test_quantised_step_validation():
    with pytest.raises(ValueError, match="k_base"):
        quantised_step(0.0, 1.0, 0.1, k_base=0)
    with pytest.raises(ValueError, match="eta"):
        quantised_step(0.0, 1.0, 0.1, eta=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        quantised_step(0.0, 1.0, -0.1)


def test_grids_nest(rng):
    lo, hi, base = 2.0, 12.0, 0.1
    fine, coarse = base * 2, base * 8
    rounder = AlphaRounder.draw(lo, hi, rng)
    x = rng.uniform(lo, hi, (500, 1))
    coarse_points = lo + rounder.grid_index(x, coarse) * coarse
    # every coarse grid point is a fine grid point: index ratio 4
    idx_on_fine = (coarse_points - lo) / fine
    np.testing.assert_allclose(idx_on_fine, np.round(idx_on_fine), atol=1e-9)


# ---------------------------------------------------------------- α-point rounding


def test_rule_matches_the_spec_statement(rng):
    n = 1000
    lo, hi = np.zeros(n), np.full(n, 7.0)
    rounder = AlphaRounder.draw(lo, hi, rng)
    steps = rng.choice([0.07, 0.14, 0.28, 0.56], size=n)
    x = rng.uniform(0, 7.0, n)
    y = rounder.round(x, steps)
    L = lo + np.floor((x - lo) / steps) * steps
    R = L + steps
    expected = np.where(x + rounder.u * steps < R, L, R)
    np.testing.assert_allclose(y, expected)
    assert np.all((y == L) | np.isclose(y, R))


@pytest.mark.parametrize("x", [0.013, 0.5, 0.777, 0.95])
def test_unbiased_and_mse_over_u(rng, x):
    """Over u ~ U[0,1): E[y] = x and E[(y-x)²] = (R-x)(x-L). Each 'dimension' is an independent draw of u."""
    n, step = 400_000, 0.08
    rounder = AlphaRounder.draw(np.zeros(n), np.ones(n), rng)
    y = rounder.round(np.full(n, x), step)
    L = math.floor(x / step) * step
    R = L + step
    p_up = (x - L) / step
    var = (R - x) * (x - L)
    assert abs(y.mean() - x) < 5 * math.sqrt(var / n)
    sq = (y - x) ** 2
    assert abs(sq.mean() - var) < 5 * sq.std() / math.sqrt(n) + 1e-15
    assert abs(np.mean(np.isclose(y, R)) - p_up) < 5 * math.sqrt(p_up * (1 - p_up) / n) + 1e-12


def test_jitter_inside_a_cell_keeps_one_rounded_value(rng):
    """u is fixed for life: jitter that never crosses L + (1-u)·step gives a single rounded value (memo hits)."""
    lo, hi, step = 0.0, 100.0, 4.0
    rounder = AlphaRounder(lo, hi, [0.3])  # threshold at L + 0.7·step
    L = 40.0
    threshold = L + (1 - 0.3) * step  # 42.8
    jitter = rng.uniform(L, threshold - 1e-6, size=(120, 1))  # 120 rounds, all below the threshold
    rounded = rounder.round(jitter, step)
    indices = rounder.grid_index(jitter, step)
    assert np.unique(rounded).size == 1 and rounded[0, 0] == L
    assert np.unique(indices).size == 1
    above = rng.uniform(threshold + 1e-6, L + step - 1e-6, size=(120, 1))
    assert np.unique(rounder.round(above, step)).tolist() == [L + step]


def test_rounder_clips_and_validates(rng):
    rounder = AlphaRounder([0.0, 0.0], [1.0, 1.0], [0.0, 0.999])
    np.testing.assert_allclose(rounder.round([[-5.0, 5.0]], 0.25), [[0.0, 1.0]])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        AlphaRounder(0.0, 1.0, [1.0])
    with pytest.raises(ValueError, match="trailing dimension"):
        rounder.round([0.1, 0.2, 0.3], 0.1)
    with pytest.raises(ValueError, match="steps must be > 0"):
        rounder.round([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="finite"):
        rounder.round([np.nan, 0.2], 0.1)


def test_rounder_state_roundtrip(rng):
    rounder = AlphaRounder.draw([0.0, -1.0, 5.0], [1.0, 1.0, 9.0], rng)
    state = json.loads(json.dumps(rounder.to_state()))
    again = AlphaRounder.from_state(state)
    np.testing.assert_array_equal(again.u, rounder.u)
    x = rng.uniform([0.0, -1.0, 5.0], [1.0, 1.0, 9.0], (50, 3))
    np.testing.assert_array_equal(again.grid_index(x, [0.1, 0.2, 0.4]), rounder.grid_index(x, [0.1, 0.2, 0.4]))
    with pytest.raises(ValueError, match="missing"):
        AlphaRounder.from_state({"lo": [0.0]})


# ---------------------------------------------------------------- epochs


def test_steps_change_only_at_epoch_boundaries():
    epochs = EpochSteps([0.0, 0.0], [10.0, 10.0], epoch_length=10)
    first = epochs.plan(0, [0.0, 0.05])
    np.testing.assert_allclose(first.steps, [0.1, 6.4])
    assert first.volatile.tolist() == [False, True]
    for r in range(1, 10):
        plan = epochs.plan(r, [0.05, 0.0])  # scores changed mid-epoch: ignored
        assert plan is first
    second = epochs.plan(10, [0.05, 0.0])
    assert second.epoch == 1
    np.testing.assert_allclose(second.steps, [6.4, 0.1])
    assert second.volatile.tolist() == [True, False]
    third = epochs.plan(57, [0.002, 0.002])  # skipped epochs: recompute on the first round seen
    assert third.epoch == 5
    np.testing.assert_allclose(third.steps, [0.2, 0.2])
    with pytest.raises(ValueError, match="before the current epoch"):
        epochs.plan(3, [0.0, 0.0])


def test_epoch_state_roundtrip():
    epochs = EpochSteps([0.0], [4.0], epoch_length=5, k_base=64, eta=0.2, tau=0.02)
    epochs.plan(7, [0.01])
    state = json.loads(json.dumps(epochs.to_state()))
    again = EpochSteps.from_state(state)
    plan = again.plan(9, [0.9])  # same epoch after a restart: the persisted plan holds
    assert plan.epoch == 1
    np.testing.assert_allclose(plan.steps, epochs.current.steps)
    assert EpochSteps.from_state(EpochSteps([0.0], [1.0]).to_state()).current is None


def test_epoch_validation():
    with pytest.raises(ValueError, match="epoch_length"):
        EpochSteps(0.0, 1.0, epoch_length=0)
    epochs = EpochSteps([0.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="round_index"):
        epochs.plan(-1, [0.0, 0.0])
    with pytest.raises(ValueError, match="expected 2 scores"):
        epochs.plan(0, [0.0])


def test_round_reading_of_many_dimensions_is_each_dimension_alone(rng):
    """The fleet simulator calls round_reading on n·d dimensions at once, a device on one: the same numbers."""
    from protocols.rounding import round_reading

    lo, hi, u = np.array([0.0, -5.0, 10.0]), np.array([100.0, 5.0, 20.0]), rng.random(3)
    x = np.clip(np.cumsum(rng.normal(0, 2.0, (40, 3)), axis=0) + [50.0, 0.0, 15.0], lo, hi)

    def objects(j):
        sl = slice(None) if j is None else slice(j, j + 1)
        return (VolatilityDetector(lo[sl], hi[sl], window=4), EpochSteps(lo[sl], hi[sl], epoch_length=6),
                AlphaRounder(lo[sl], hi[sl], u[sl]))

    together = objects(None)
    alone = [objects(j) for j in range(3)]
    seen_rounded = False
    for i, row in enumerate(x):
        out = round_reading(*together, i, row)
        for j in range(3):
            one = round_reading(*alone[j], i, row[j:j + 1])
            for a, b in ((out.values, one.values), (out.rounded, one.rounded), (out.exponents, one.exponents),
                         (out.grid_index, one.grid_index)):
                assert a[j] == b[0]
        seen_rounded |= bool(out.rounded.any())
        assert np.all(out.values[~out.rounded] == row[~out.rounded])
    assert seen_rounded


def test_round_reading_scores_the_window_at_epoch_starts_only(rng, monkeypatch):
    """round_reading pushes each reading and asks for the volatility scores only when a new epoch's plan is made:
    the same plans (and rounded values) as scoring the window after every reading, with one scoring per epoch."""
    import protocols.rounding as rounding

    lo, hi, u = np.array([0.0, -5.0]), np.array([100.0, 5.0]), rng.random(2)
    x = np.clip(np.cumsum(rng.normal(0, 2.0, (60, 2)), axis=0) + [50.0, 0.0], lo, hi)
    lazy = (VolatilityDetector(lo, hi, window=4), EpochSteps(lo, hi, epoch_length=6), AlphaRounder(lo, hi, u))
    eager_det, eager_epochs = VolatilityDetector(lo, hi, window=4), EpochSteps(lo, hi, epoch_length=6)
    calls = []
    score = rounding._score
    monkeypatch.setattr(rounding, "_score", lambda *a: calls.append(1) or score(*a))
    made = 0
    for i, row in enumerate(x):
        before = len(calls)
        out = rounding.round_reading(*lazy, i, row)
        lazy_calls = len(calls) - before
        eager_det.update(row)  # scores the window now
        plan = None if eager_epochs.current is None and eager_det.count <= eager_det.window \
            else eager_epochs.plan(i, eager_det.scores)
        assert (out.plan is None) == (plan is None)
        if plan is not None:
            assert out.plan.epoch == plan.epoch and out.plan.volatile.tolist() == plan.volatile.tolist()
            assert out.plan.steps.tolist() == plan.steps.tolist()
        new_plan = i == 4 or (i > 4 and i % 6 == 0)  # the first full window, then each epoch's start
        assert lazy_calls == int(new_plan)
        made += new_plan
    assert made == 10
