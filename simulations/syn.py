"""The Syn evolving dataset (SPEC §6; thesis chapter 5, after Arcolezi et al. EDBT 2023).

n users, τ collections, values in [0, k). Each user's first value is uniform on [0, k); at every later time the
value is redrawn, with probability ``change_prob``, uniformly on [0, k) (so it may be redrawn to itself —
the effective change rate is change_prob·(1 - 1/k)); otherwise it is kept. Defaults: n = 10,000, τ = 120, k = 360,
change_prob = 0.25. The thesis appends Syn to Adult as a 16th, evolving column: row i gets Syn user i mod n
(:func:`syn_column_for_rows`).
"""

from __future__ import annotations

import numpy as np

from protocols.base import check_int

__all__ = ["generate_syn", "syn_column_for_rows", "true_frequencies"]


def generate_syn(
    rng: np.random.Generator, n: int = 10_000, tau: int = 120, k: int = 360, change_prob: float = 0.25
) -> np.ndarray:
    """Syn values, shape (n, τ), dtype int64. Pass an explicitly seeded generator for reproducibility."""
    n, tau, k = check_int(n, "n", 1), check_int(tau, "tau", 1), check_int(k, "k", 1)
    if not 0.0 <= float(change_prob) <= 1.0:
        raise ValueError(f"change_prob must lie in [0, 1], got {change_prob}")
    values = np.empty((n, tau), dtype=np.int64)
    values[:, 0] = rng.integers(0, k, size=n)
    for t in range(1, tau):  # loop over time, vectorised over users
        redraw = rng.random(n) < change_prob
        values[:, t] = np.where(redraw, rng.integers(0, k, size=n), values[:, t - 1])
    return values


def true_frequencies(values: np.ndarray, k: int) -> np.ndarray:
    """Per-round histograms (τ, k) of a (n, τ) value matrix, normalised to sum 1."""
    values = np.asarray(values)
    n, tau = values.shape
    offsets = (np.arange(tau) * k)[None, :]
    counts = np.bincount((values + offsets).ravel(), minlength=tau * k).reshape(tau, k)
    return counts / n


def syn_column_for_rows(syn: np.ndarray, rows: int, t: int) -> np.ndarray:
    """The evolving column appended to a table of ``rows`` records at collection t: row i gets Syn user i mod n."""
    syn = np.asarray(syn)
    return syn[np.arange(check_int(rows, "rows", 1)) % syn.shape[0], check_int(t, "t", 0, syn.shape[1] - 1)]
