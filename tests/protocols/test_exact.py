"""The exact samplers (protocols/exact.py, SPEC §3.0): uniform integers, weights, the CKS discrete laws."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from protocols.exact import (
    discrete_gaussian,
    discrete_gaussian_one,
    discrete_laplace,
    discrete_laplace_one,
    ratio_weights,
    ratio_within,
    rational_epsilon,
    uniform_below,
    uniform_below_array,
)


class _Words:
    """A stand-in generator whose bit generator hands out given 64-bit words."""

    def __init__(self, words):
        self.words = list(words)
        self.bit_generator = self

    def random_raw(self, size=None):
        if size is None:
            return self.words.pop(0)
        out = np.array(self.words[:size], dtype=np.uint64)
        del self.words[:size]
        return out


def test_uniform_below_rejects_the_partial_copy_and_reduces_the_rest():
    bound = 3  # 2^64 mod 3 = 1: the word 0 is the one rejected
    assert uniform_below(_Words([0, 1]), bound) == 1 % 3
    assert uniform_below(_Words([2**64 - 1]), bound) == (2**64 - 1) % 3
    assert list(uniform_below_array(_Words([0, 5, 7, 4]), bound, 3)) == [4 % 3, 5 % 3, 7 % 3]  # entry 0 drawn again after
    assert uniform_below(_Words([12345]), 1) == 0


@pytest.mark.parametrize("bound", [2, 3, 10, 2**40 + 7])
def test_uniform_below_is_uniform_and_scalar_equals_batch(bound):
    rng = np.random.default_rng(1)
    draws = uniform_below_array(rng, bound, 60_000)
    assert draws.min() >= 0 and draws.max() < bound
    if bound <= 10:
        assert stats.chisquare(np.bincount(draws, minlength=bound)).pvalue > 1e-4
    a = [uniform_below(np.random.default_rng(s), bound) for s in range(50)]
    b = [int(uniform_below_array(np.random.default_rng(s), bound, 1)[0]) for s in range(50)]
    assert a == b


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 4.0, 20.0, 50.0])
def test_ratio_weights_never_exceed_e_eps(eps):
    high, low = ratio_weights(eps)
    assert ratio_within(high, low, eps)
    assert not ratio_within(high, low - 1, eps)  # the tightest L: one less and the ratio passes e^ε
    assert rational_epsilon(eps) <= Fraction(eps)


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3), Fraction(40, 3)])
def test_discrete_laplace_law(scale):
    rng = np.random.default_rng(2)
    y = discrete_laplace(rng, scale, 100_000)
    rho = math.exp(-1 / float(scale))
    support = np.arange(y.min(), y.max() + 1)
    pmf = (1 - rho) / (1 + rho) * rho ** np.abs(support)
    counts = np.array([(y == v).sum() for v in support])
    keep = pmf * y.size >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(pmf[keep], 1 - pmf[keep].sum()) * y.size
    assert stats.chisquare(obs[exp > 0], exp[exp > 0] * obs.sum() / exp[exp > 0].sum()).pvalue > 1e-4


@pytest.mark.parametrize("sigma2", [1, 9, 400])
def test_discrete_gaussian_law(sigma2):
    rng = np.random.default_rng(3)
    y = discrete_gaussian(rng, sigma2, 100_000)
    z = np.arange(-60 * int(math.sqrt(sigma2)) - 10, 60 * int(math.sqrt(sigma2)) + 11)
    w = np.exp(-(z**2) / (2 * sigma2))
    pmf = w / w.sum()
    assert abs(y.mean()) < 5 * math.sqrt(sigma2 / y.size) + 1e-9
    assert y.var() == pytest.approx(float(pmf @ z**2), rel=0.03)


def test_one_value_samplers_draw_as_a_batch_of_one():
    for seed in range(200):
        assert discrete_laplace_one(np.random.default_rng(seed), Fraction(7, 3)) == \
            discrete_laplace(np.random.default_rng(seed), Fraction(7, 3), 1)[0]
        assert discrete_gaussian_one(np.random.default_rng(seed), 25) == \
            discrete_gaussian(np.random.default_rng(seed), 25, 1)[0]
