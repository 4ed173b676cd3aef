"""Consistency post-processing of frequency estimates (free under DP: it only touches the released estimate).

The unbiased estimates of the oracles can be negative and need not sum to 1. Two standard repairs
(Wang, Lopuhaä-Zwakenberg, Li, Škorić, Li, "Locally differentially private frequency estimation with
consistency", NDSS 2020):

* :func:`clip_normalise` — ``max(f, 0)`` then divide by the sum ("Base-Pos" + normalisation);
* :func:`project_simplex` — Euclidean projection onto the probability simplex, which is "Norm-Sub": subtract the
  one δ for which ``Σ max(f_v - δ, 0) = 1`` (Duchi, Shalev-Shwartz, Singer, Chandra, ICML 2008, sort-based O(k log k)).

Both introduce bias (small frequencies are pushed to 0); keep the raw ``estimate`` for confidence intervals.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["project_simplex", "clip_normalise"]


def _as_estimates(f: Any) -> np.ndarray:
    arr = np.array(f, dtype=float)
    if arr.ndim not in (1, 2) or arr.shape[-1] == 0:
        raise ValueError(f"estimates must be a non-empty 1-D array (or 2-D, one row per histogram), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("estimates must be finite")
    return arr


def project_simplex(f: Any) -> np.ndarray:
    """Euclidean projection of ``f`` (1-D, or each row of a 2-D array) onto ``{x ≥ 0, Σx = 1}``.

    With u = f sorted decreasingly, ρ = max{j : u_j - (Σ_{i≤j} u_i - 1)/j > 0} and δ = (Σ_{i≤ρ} u_i - 1)/ρ,
    the projection is ``max(f - δ, 0)``.
    """
    arr = _as_estimates(f)
    rows = np.atleast_2d(arr)
    u = -np.sort(-rows, axis=1)
    css = np.cumsum(u, axis=1) - 1.0
    j = np.arange(1, rows.shape[1] + 1)
    rho = np.count_nonzero(u - css / j > 0, axis=1)  # the condition holds exactly for j ≤ ρ
    delta = css[np.arange(rows.shape[0]), rho - 1] / rho
    out = np.maximum(rows - delta[:, None], 0.0)
    return out.reshape(arr.shape)


def clip_normalise(f: Any) -> np.ndarray:
    """``max(f, 0) / Σ max(f, 0)`` (1-D or row-wise), the one clip-and-normalise of haarvest (frequency oracles and
    longitudinal protocols alike). A histogram with no positive entry becomes uniform: the result is always a
    distribution, and with no evidence for any item the uniform one is the maximum-entropy choice."""
    arr = _as_estimates(f)
    rows = np.maximum(np.atleast_2d(arr), 0.0)
    total = rows.sum(axis=1, keepdims=True)
    uniform = np.full_like(rows, 1.0 / rows.shape[1])
    out = np.divide(rows, total, out=uniform, where=total > 0)
    return out.reshape(arr.shape)
