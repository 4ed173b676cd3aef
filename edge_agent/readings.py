"""Reading validation (SPEC §2, steps 1–2): what a reading must be before anything is computed from it.

1. **Validate.** Every configured dimension must be present; numeric values must be real numbers (not bool, not
   text) and finite; categorical values integers in [0, k) or one of the configured labels. Anything else raises
   :class:`protocols.errors.InvalidRecord` and the whole record is dropped: nothing is sent, nothing is charged.
2. **Clip** numeric values to [lo, hi] (:meth:`edge_agent.pipeline.Pipeline.observe`). Clipping is a documented
   bias, not an error; it is counted per dimension.

:class:`Record` is what a valid reading becomes after clipping, α-rounding and normalisation.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.errors import InvalidRecord

from .config import DimensionConfig

__all__ = ["Record", "check_value"]


@dataclass(frozen=True)
class Record:
    """One validated reading after clipping and rounding (original units), with memo-key canonical forms."""

    values: dict[str, float | int]
    normalised: dict[str, float]
    canonical: dict[str, list[Any]]
    clipped: tuple[str, ...] = ()
    rounded: tuple[str, ...] = ()
    exact: dict[str, float] = field(default_factory=dict, repr=False)  # clipped, unrounded (RAM only)




def _number(value: Any) -> float | None:
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def check_value(d: DimensionConfig, raw: Any) -> float | int:
    """One dimension's value of a reading, checked: a finite real number (numeric; unclipped), or a category index
    in [0, k) or one of the configured labels (categorical, returned as its index); else :class:`InvalidRecord`."""
    if d.kind == "numeric":
        x = _number(raw)
        if x is None:
            raise InvalidRecord("wrong_type", d.name, f"expected a number, got {type(raw).__name__}", raw)
        if not math.isfinite(x):
            raise InvalidRecord("not_finite", d.name, "not a finite number", raw)
        return x
    k = d.domain_size
    if isinstance(raw, str) and d.categories is not None:
        if raw not in d.categories:
            raise InvalidRecord("out_of_domain", d.name, "the label is not one of the categories", raw)
        return d.categories.index(raw)
    x = _number(raw)
    if x is None:
        raise InvalidRecord("wrong_type", d.name, f"expected a category index, got {type(raw).__name__}", raw)
    if not math.isfinite(x) or x != int(x):
        raise InvalidRecord("wrong_type" if math.isfinite(x) else "not_finite", d.name,
                            "not an integer category index", raw)
    if not 0 <= int(x) < k:
        raise InvalidRecord("out_of_domain", d.name, f"the category index is not in [0, {k})", raw, f"[0, {k})")
    return int(x)
