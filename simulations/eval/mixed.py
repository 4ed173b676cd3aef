"""The mixed-record protocol shared by the experiments on Adult: numeric block + categorical attributes.

**Protocol (the same for every compared method).** A record has d attributes, d_C ordered ("C") and d_D
categorical ("D"). Each user is assigned, by a public draw independent of its data, to one *block*: the numeric
block (all d_C numeric attributes at once) with probability d_C/d, or one categorical attribute with probability
1/d each. The user spends the full ε on its block: the numeric block goes through the compared vector mechanism
(Haar record, HM/PM k-sampling, Duchi multi-dim, auto), a categorical attribute through a frequency oracle.
This is Wang et al.'s attribute sampling (ICDE 2019, Sec. IV, k = 1) with the numeric attributes kept together so
that the vector mechanisms see whole numeric records; it is ε-LDP per user (one ε-LDP report; the block choice
does not depend on the data).

Metrics: per-attribute squared error of the numeric means (normalised scale [-1, 1], against the *population*
means, so the sampling error of the block draw is included for every method alike), and the total-variation
distance ``½ Σ_v |f̂_v - f_v|`` of each categorical marginal after Euclidean projection onto the simplex
(:func:`protocols.frequency.project_simplex`), averaged over the categorical attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.frequency import project_simplex
from simulations.datasets import Dataset

__all__ = ["BlockAssignment", "assign_blocks", "categorical_tvd", "tvd"]


@dataclass(frozen=True)
class BlockAssignment:
    """Which users report the numeric block (boolean mask) and which categorical column each other user reports."""

    numeric: np.ndarray  # (n,) bool
    column: np.ndarray  # (n,) int: the attribute index drawn (a numeric index for numeric-block users)


def assign_blocks(dataset: Dataset, rng: np.random.Generator) -> BlockAssignment:
    """Draw each user's attribute uniformly from the d attributes; numeric draws mean "the numeric block"."""
    column = rng.integers(0, dataset.d, size=dataset.n)
    numeric = np.isin(column, dataset.domain.numeric_columns)
    return BlockAssignment(numeric, column)


def tvd(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Total-variation distance ``½ Σ |f̂ - f|``."""
    return 0.5 * float(np.abs(np.asarray(estimate) - np.asarray(truth)).sum())


def categorical_tvd(
    dataset: Dataset,
    blocks: BlockAssignment,
    oracle: Callable[[float, int], Any],
    epsilon: float,
    rng: np.random.Generator,
) -> float:
    """Average TVD over the categorical attributes, each estimated from the users assigned to it."""
    out = []
    for j in dataset.domain.categorical_columns:
        users = blocks.column == j
        fo = oracle(epsilon, int(dataset.domain.sizes[j]))
        estimate = project_simplex(fo.estimate(fo.privatize(dataset.data[users, j], rng)))
        out.append(tvd(estimate, dataset.marginal(j)))
    return float(np.mean(out))
