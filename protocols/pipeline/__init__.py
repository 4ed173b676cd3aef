"""The record mechanism of the memoized Haar-based pipeline (SPEC §2, thesis 003 ch. 4, corrected) and ``auto``.

* :class:`HaarRecord` — the record mechanism: Haar transform, mean coefficient through a 1-D ε_m-LDP mechanism,
  details through HM k-sampling or Duchi multi-dim with ε_c; ε = ε_m + ε_c for the whole record.
* :func:`choose_mechanism` / :class:`AutoRecord` — the lowest-variance mechanism for a query (Haar pipeline,
  direct HM k-sampling, Duchi multi-dim, per-dimension frequency oracles), with the variances compared.
* normalisation (:func:`protocols.contract.normalise`), volatility and α-rounding (:mod:`protocols.rounding`) and memo
  keys (:mod:`protocols.memo_key`) have their own homes; the fleet simulator that drives the whole device pipeline
  with them (``MemoizedPipeline``) is not a mechanism and lives in :mod:`simulations.fleet_pipeline`.
"""

from .auto import AUTO_QUERIES, AutoRecord, MechanismChoice, choose_mechanism, comparison_table
from .record import (
    DETAIL_MECHANISMS,
    MEAN_MECHANISMS,
    SPLIT_OBJECTIVES,
    HaarRecord,
    coefficient_bounds,
    objective_weights,
    optimal_split,
    range_weight_vector,
)

__all__ = [
    "HaarRecord",
    "MEAN_MECHANISMS",
    "DETAIL_MECHANISMS",
    "SPLIT_OBJECTIVES",
    "coefficient_bounds",
    "objective_weights",
    "optimal_split",
    "range_weight_vector",
    "choose_mechanism",
    "MechanismChoice",
    "AutoRecord",
    "AUTO_QUERIES",
    "comparison_table",
]
