"""Heavy hitters' selection options: ``threshold=`` and ``top_k=``, the significance default."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from protocols.heavy_hitters import (BitwiseHeavyHitters, PrefixExtensionHeavyHitters, check_selection,
                                     select_prefixes)

pytestmark = pytest.mark.statistical

#: pure-ldp's heavy-hitter example (its example.py, PEM): four 6-bit strings, ε = 3, top 3 wanted
EXAMPLE = {0b101101: 8000, 0b111111: 4000, 0b100000: 1000, 0b101100: 500}
TOP3 = {0b101101, 0b111111, 0b100000}


def _example_values() -> np.ndarray:
    return np.repeat(np.array(list(EXAMPLE)), list(EXAMPLE.values()))


@pytest.mark.parametrize("kwargs, match", [
    ({"threshold": -0.1}, "threshold must be a frequency in"),
    ({"threshold": 1.5}, "threshold must be a frequency in"),
    ({"threshold": math.nan}, "threshold must be a frequency in"),
    ({"threshold": True}, "threshold must be a frequency in"),
    ({"threshold": "0.05"}, "threshold must be a frequency in"),
    ({"top_k": 0}, "top_k must be an integer >= 1"),
    ({"top_k": 2.0}, "top_k must be an integer >= 1"),
    ({"top_k": True}, "top_k must be an integer >= 1"),
])
def test_options_are_validated_with_one_line_errors(kwargs, match):
    values = _example_values()[:100]
    calls = [
        lambda: check_selection(kwargs.get("threshold"), kwargs.get("top_k")),
        lambda: PrefixExtensionHeavyHitters(3.0, 6, 4, 2).run(values, np.random.default_rng(0), **kwargs),
        lambda: BitwiseHeavyHitters(3.0, 6, 8, hash_seed=1).run(values, np.random.default_rng(0), **kwargs),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_options_are_keyword_only_and_top_k_is_capped_by_max_keep():
    protocol = PrefixExtensionHeavyHitters(3.0, 6, 4, 2, max_keep=4)
    with pytest.raises(TypeError):
        protocol.run(_example_values(), np.random.default_rng(0), 1e-3, 0.05)  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"top_k must not exceed max_keep \(4\)"):
        protocol.run(_example_values(), np.random.default_rng(0), top_k=5)


def test_select_prefixes_threshold_is_a_floor_and_top_k_keeps_the_best():
    est = np.array([0.05, 0.4, -0.1, 0.2, 0.2, 0.01])
    np.testing.assert_array_equal(select_prefixes(est, 0.02), [1, 3, 4, 0])
    np.testing.assert_array_equal(select_prefixes(est, 0.02, top_k=2), [1, 3])  # ties: the first index first
    np.testing.assert_array_equal(select_prefixes(est, 0.3, top_k=3), [1])  # the floor wins over k
    np.testing.assert_array_equal(select_prefixes(est, 0.0, top_k=10, cap=3), [1, 3, 4])
    assert select_prefixes(est, 0.5).size == 0


def test_top_k_keeps_k_prefixes_per_round_and_the_best_items():
    values = _example_values()
    protocol = PrefixExtensionHeavyHitters(3.0, 6, start_bits=2, step_bits=2)
    for seed in range(5):
        two = protocol.run(values, np.random.default_rng(seed), top_k=2)
        assert set(two.items.tolist()) == {0b101101, 0b111111}
        assert np.all(np.diff(two.frequencies) <= 0)
        # top-k with an explicit floor: only what passes it, however large k is
        floored = protocol.run(values, np.random.default_rng(seed), threshold=0.2, top_k=3)
        assert set(floored.items.tolist()) == {0b101101, 0b111111} and floored.report_threshold == 0.2
    # round by round: with top_k = 1 only one prefix is extended, so the last round has 4 candidates
    one = protocol.run(values, np.random.default_rng(9), top_k=1)
    assert one.items.tolist() == [0b101101]


def test_explicit_threshold_keeps_estimates_above_it():
    values = _example_values()
    protocol = PrefixExtensionHeavyHitters(3.0, 6, start_bits=4, step_bits=2)
    result = protocol.run(values, np.random.default_rng(3), threshold=0.05)
    assert set(result.items.tolist()) == TOP3  # 0b101100 holds 3.7 %
    assert np.all(result.frequencies >= 0.05) and result.report_threshold == 0.05
    bitwise = BitwiseHeavyHitters(3.0, 6, 16, hash_seed=7, split_users=False)
    assert set(bitwise.run(values, np.random.default_rng(4), threshold=0.2).items.tolist()) <= {0b101101, 0b111111}
    assert bitwise.run(values, np.random.default_rng(4), top_k=1).items.size == 1


def test_significance_threshold_formula():
    protocol = PrefixExtensionHeavyHitters(3.0, 6, start_bits=4, step_bits=2)
    oracle = protocol.oracle_factory(3.0, 17)
    tau, eta = protocol.significance_threshold(6750, oracle, 16, beta=1e-3)
    z = stats.norm.isf(1e-3 / (2 * 16))
    assert tau == pytest.approx(z * math.sqrt(float(np.max(oracle.variance(0.0))) / 6750))
    assert eta == pytest.approx(tau + z * math.sqrt(float(np.max(oracle.variance(1.0))) / 6750))


@pytest.mark.parametrize("start_bits", [2, 4])
def test_default_finds_the_examples_top_3_in_every_seeded_run(start_bits):
    """pure-ldp's PEM finds the top 3 of its example in 20/20 runs at ε = 3 (`make bench`, section peers); the
    default (significance threshold at β = 10⁻³) must too — and report nothing nobody holds."""
    values = _example_values()
    protocol = PrefixExtensionHeavyHitters(3.0, 6, start_bits=start_bits, step_bits=2)
    for seed in range(20):
        result = protocol.run(values, np.random.default_rng(seed))
        assert TOP3 <= set(result.items.tolist()), (seed, result.items)
        assert set(result.items.tolist()) <= set(EXAMPLE)
        assert result.report_threshold < min(EXAMPLE[i] for i in TOP3) / values.size


def test_default_false_positive_rate_is_bounded_by_beta():
    """Everyone holds one item: a run reporting anything else is a false positive, at most β of the runs."""
    beta, runs = 0.2, 200
    values = np.full(2_000, 0b1011)
    protocol = PrefixExtensionHeavyHitters(1.0, 8, start_bits=2, step_bits=3)
    bad = sum(set(protocol.run(values, np.random.default_rng(s), beta).items.tolist()) - {0b1011} != set()
              for s in range(runs))
    assert bad <= beta * runs + 3 * math.sqrt(beta * (1 - beta) * runs), bad
