"""Distributions of numeric dimensions under ε-LDP: histogram, CDF and quantiles on a public bucket grid.

A numeric value is scaled by its declared bounds onto a public grid of D buckets (:class:`BucketGrid`) and
reported with a range-query-friendly mechanism; the server returns a :class:`DistributionEstimate` (histogram,
CDF at the bucket edges, quantiles, normal intervals where an analytic variance exists, and a documented monotone
post-processing). Mechanisms (all exactly ε-LDP, all with ``privatize(values, rng)`` vectorised over users):

=====================  =======================================================  ==========  ========================
class                  method                                                   unbiased    analytic variance
=====================  =======================================================  ==========  ========================
FlatOracle             bucket + OUE / OLH over D items (Wang et al. 2017)        yes         yes (OLH CDF: empirical)
HierarchicalIntervals  B-ary tree, one sampled level per user (CKS, PVLDB 2019)  yes         yes (first order)
HaarDistribution       HaarHRR (CKS, PVLDB 2019), :mod:`protocols.haar`           yes         yes (exact)
SquareWave             Square Wave + EMS (Li et al., SIGMOD 2020)                no (EMS)    no
=====================  =======================================================  ==========  ========================

:func:`choose_distribution_mechanism` is ``auto``: the least analytic variance for the asked query (Square Wave
excluded). SPEC §3.14 states the math. Device-side code (grid, ``privatize``) needs numpy only; nothing here
imports scipy.
"""

from protocols.distribution.base import AnalyticDistribution, DistributionMechanism
from protocols.distribution.choose import (
    DistributionChoice,
    choose_distribution_mechanism,
    optimal_branching,
    query_variance,
)
from protocols.distribution.flat import FlatOracle
from protocols.distribution.grid import BucketGrid
from protocols.distribution.haar_range import HaarDistribution
from protocols.distribution.hierarchical import HierarchicalIntervals
from protocols.distribution.result import DistributionEstimate, isotonic_regression
from protocols.distribution.square_wave import SquareWave, square_wave_parameters

__all__ = [
    "BucketGrid",
    "DistributionMechanism",
    "AnalyticDistribution",
    "DistributionEstimate",
    "FlatOracle",
    "HierarchicalIntervals",
    "HaarDistribution",
    "SquareWave",
    "DistributionChoice",
    "choose_distribution_mechanism",
    "optimal_branching",
    "query_variance",
    "isotonic_regression",
    "square_wave_parameters",
]
