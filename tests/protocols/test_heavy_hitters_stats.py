"""Heavy hitters (SPEC §3.13): every item above the detection threshold is recovered on a Zipf dataset."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.frequency import GRR, OLH
from protocols.heavy_hitters import BitwiseHeavyHitters, PrefixExtensionHeavyHitters

pytestmark = pytest.mark.statistical

BITS = 16


@pytest.fixture(scope="module")
def zipf_items() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2024)
    n = 200_000
    ranks = rng.zipf(1.6, size=3 * n)
    ranks = ranks[ranks <= 5000][:n]
    items = rng.permutation(1 << BITS)[ranks - 1]
    return items, np.bincount(items, minlength=1 << BITS) / n


def _check_recovery(result, freq: np.ndarray) -> None:
    heavy = np.flatnonzero(freq >= result.detection_threshold)
    assert heavy.size >= 1
    assert set(heavy.tolist()) <= set(result.items.tolist()), (heavy, result.items)
    for item in heavy:
        est = result.as_dict()[int(item)]
        assert abs(est - freq[item]) < result.detection_threshold
    assert np.all(result.frequencies >= result.report_threshold)


@pytest.mark.parametrize("split_users", [True, False])
def test_bitwise_recovers_every_item_above_threshold(zipf_items, split_users):
    items, freq = zipf_items
    protocol = BitwiseHeavyHitters(4.0, BITS, buckets=256, hash_seed=987654321, split_users=split_users)
    assert protocol.epsilon_per_user == (4.0 if split_users else 4.0 * BITS)
    result = protocol.run(items, np.random.default_rng(1))
    _check_recovery(result, freq)
    assert result.epsilon_per_user == protocol.epsilon_per_user


def test_bitwise_with_another_oracle(zipf_items):
    items, freq = zipf_items
    protocol = BitwiseHeavyHitters(4.0, BITS, buckets=64, hash_seed=5, split_users=False, oracle_factory=GRR)
    _check_recovery(protocol.run(items, np.random.default_rng(2)), freq)


def test_prefix_extension_recovers_every_item_above_threshold(zipf_items):
    items, freq = zipf_items
    protocol = PrefixExtensionHeavyHitters(4.0, BITS, start_bits=4, step_bits=4, max_keep=32)
    assert protocol.prefix_lengths == [4, 8, 12, 16] and protocol.epsilon_per_user == 4.0
    result = protocol.run(items, np.random.default_rng(3))
    _check_recovery(result, freq)
    olh = PrefixExtensionHeavyHitters(2.0, BITS, start_bits=6, step_bits=5, max_keep=16, oracle_factory=OLH)
    assert olh.prefix_lengths == [6, 11, 16]
    _check_recovery(olh.run(items, np.random.default_rng(4)), freq)


def test_prefix_encoding_and_candidates():
    protocol = PrefixExtensionHeavyHitters(1.0, 8, start_bits=2, step_bits=3)
    assert protocol.prefix_lengths == [2, 5, 8]
    np.testing.assert_array_equal(protocol.candidates(0, None), [0, 1, 2, 3])
    cands = protocol.candidates(1, np.array([2]))
    np.testing.assert_array_equal(cands, np.arange(16, 24))
    values = np.array([0b10000111, 0b10111000, 0b01000000])
    np.testing.assert_array_equal(protocol.encode(values, 1, cands), [0, 7, 8])  # 10000, 10111, not a candidate
    with pytest.raises(ValueError, match="previous round"):
        protocol.candidates(1, None)


def test_parameter_and_input_validation():
    with pytest.raises(ValueError, match="hash_seed"):
        BitwiseHeavyHitters(1.0, 8, 16, hash_seed=-1)
    with pytest.raises(ValueError, match="bits"):
        BitwiseHeavyHitters(1.0, 0, 16, hash_seed=1)
    protocol = BitwiseHeavyHitters(1.0, 8, 16, hash_seed=1)
    with pytest.raises(ValueError, match=r"2\^8"):
        protocol.run(np.array([256]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="integers"):
        protocol.run(np.array([1.5]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="every bit position"):
        protocol.identify({0: np.array([1])}, 1)
    with pytest.raises(ValueError, match="beta"):
        protocol.detection_threshold(100, beta=0.0)
    with pytest.raises(ValueError, match="2\\^20"):
        PrefixExtensionHeavyHitters(1.0, 30, start_bits=22, step_bits=2)
