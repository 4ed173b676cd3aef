"""Mechanisms by name, and the JSON codec for their reports.

A stream's mechanism travels in round configurations and device configs as ``{"mechanism": NAME, "params":
{...}}``; :func:`build` turns that into an object with the common interface of :mod:`protocols.base`. Reports
are numpy arrays whose first axis is the user, so one device's report is one row: :func:`row_to_json` and
:func:`rows_from_json` are the whole codec (a row's ``tolist()`` and back).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

#: name → "module:Class". Modules are imported on first use.
MECHANISMS: dict[str, str] = {
    # numeric, inputs in [-1, 1] (SPEC §3.1–3.7)
    "laplace": "protocols.numeric:Laplace",
    "gaussian": "protocols.numeric:Gaussian",
    "duchi": "protocols.numeric:Duchi",
    "piecewise": "protocols.numeric:Piecewise",
    "hybrid": "protocols.numeric:Hybrid",
    "pdp": "protocols.numeric:PDP",
    "ksampling": "protocols.numeric:KSampling",
    "duchi_md": "protocols.numeric:DuchiMultiDim",
    # frequency oracles, inputs in [0, k) (SPEC §3.8)
    "grr": "protocols.frequency:GRR",
    "sue": "protocols.frequency:SUE",
    "oue": "protocols.frequency:OUE",
    "blh": "protocols.frequency:BLH",
    "olh": "protocols.frequency:OLH",
    "hr": "protocols.frequency:HadamardResponse",
    # records in [-1, 1]^d: the memoized pipeline's Haar record mechanism (SPEC §2.4)
    "haar": "protocols.pipeline:HaarRecord",
    "auto": "protocols.pipeline:AutoRecord",
}

__all__ = ["MECHANISMS", "register", "mechanism_class", "build", "row_to_json", "rows_from_json"]


def register(name: str, target: str) -> None:
    """Add a mechanism (``"module:Class"``) under ``name``; used by modules that define pipelines."""
    MECHANISMS[name] = target


def mechanism_class(name: str) -> type:
    try:
        target = MECHANISMS[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(sorted(MECHANISMS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def build(name: str, **params: Any) -> Any:
    """Instantiate mechanism ``name`` with ``params`` (validated by its constructor: ValueError on bad values)."""
    cls = mechanism_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for mechanism {name!r}: {exc}") from None


def row_to_json(row: Any) -> Any:
    """One user's report (a row of ``privatize``'s output) as plain JSON data."""
    return np.asarray(row).tolist()


def rows_from_json(items: list[Any], dtype: Any = None) -> np.ndarray:
    """Stack many users' JSON rows back into the array ``estimate`` expects."""
    if not items:
        raise ValueError("no reports")
    return np.asarray(items, dtype=dtype)
