"""Report rows → the arrays a stream's mechanism decodes, with the mechanism's own support check.

A :class:`StreamDecoder` is built once per round and stream (``StreamSpec.build()``) and answers three questions:

* :meth:`StreamDecoder.check_row` — can this one report row (the ``"report"`` of a body, already through
  :func:`protocols.contract.body_row`) come from the stream's mechanism? Its shape must be the mechanism's row
  shape (found by privatizing one dummy value), integer streams (frequency oracles, longitudinal protocols) must
  carry integers, and the mechanism's decoder must accept it: ``debias`` for numeric mechanisms (finite, inside
  the output bound ``[-B, B]`` — PM's C, HM's and Duchi's B, k-sampling's (d/k)·B, both parts of a Haar row),
  ``support_counts`` for oracles (``[0, k)``, 0/1 vectors of length k, hash seeds and values in range, …),
  ``estimate_round`` for longitudinal protocols. The ingest validator rejects anything else as ``bad_body``, so
  one out-of-support report can no longer make the whole stream's estimate fail.
* :meth:`StreamDecoder.from_bodies` — all stored bodies of a stream as one array, without a per-report Python
  loop: the canonical bodies ``{"report":ROW}`` are joined into one string, unwrapped by two C-level string
  replacements (rows of non-Haar streams are numbers or lists of numbers, so they contain no braces) or one
  regular-expression substitution (Haar rows ``{"detail":[z…],"mean":y}`` → the flat row ``[y,z…]``), parsed by one
  ``json.loads`` and stacked by one ``numpy.asarray``. Anything unexpected (a non-canonical body, a ragged row)
  falls back to decoding body by body, dropping and counting what does not decode.
* :meth:`StreamDecoder.valid_mask` — which rows of a stacked array the mechanism's decoder accepts, by bisection
  (the checks are elementwise, so a block passes iff all its rows do): ``O(b log n)`` vectorised checks for ``b``
  bad rows, one check when all are good. The estimator drops and counts the rest.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.contract import BODY_KEY, StreamSpec
from protocols.base import os_rng

__all__ = ["StreamDecoder", "DecodedReports"]

#: A canonical Haar body ``{"report":{"detail":[z…],"mean":y}}`` (sorted keys, no spaces) → ``[y,z…]``.
_HAAR_BODY = re.compile(r'\{"report":\{"detail":\[([^\[\]{}]*)\],"mean":([^\[\]{},]+)\}\}')
_BODY_PREFIX = '{"' + BODY_KEY + '":'
_DECODE_ERRORS = (ValueError, TypeError, IndexError, KeyError, OverflowError)


@dataclass(frozen=True)
class DecodedReports:
    """The stacked reports of a stream (rows of the mechanism's row shape) and how many bodies were dropped."""

    reports: np.ndarray
    dropped: int = 0


@dataclass
class StreamDecoder:
    """Decoding and support checks for one stream of one round (see the module docstring)."""

    spec: StreamSpec
    mechanism: Any
    row_shape: tuple[int, ...]
    integer: bool
    _haar: bool = field(default=False, repr=False)

    @classmethod
    def for_spec(cls, spec: StreamSpec) -> "StreamDecoder":
        """Build the stream's mechanism and find its report row shape; ValueError if it cannot be built."""
        try:
            mech = spec.build()
        except (ValueError, TypeError, ImportError, AttributeError) as exc:
            raise ValueError(f"the stream's mechanism cannot be built: {exc}") from None
        integer = spec.kind in ("frequency", "longitudinal")
        haar = spec.kind == "haar"
        try:
            shape = (int(mech.D),) if haar else _probe_row_shape(spec, mech)
        except _DECODE_ERRORS as exc:
            raise ValueError(f"cannot determine the report shape of {spec.wire_mechanism!r}: {exc}") from None
        return cls(spec=spec, mechanism=mech, row_shape=shape, integer=integer, _haar=haar)

    # ------------------------------------------------------------------ one row
    def row(self, row: Any) -> np.ndarray:
        """One JSON report row as an array of :attr:`row_shape` (ValueError if it cannot be one)."""
        if self._haar:
            if not isinstance(row, dict) or set(row) != {"mean", "detail"}:
                raise ValueError("a haar report is {'mean': y, 'detail': [z...]}")
            mean = np.asarray(row["mean"])
            detail = np.asarray(row["detail"])
            if mean.ndim != 0 or detail.ndim != 1:
                raise ValueError("a haar report has one mean and a list of details")
            arr = np.concatenate([mean.reshape(1), detail])
        else:
            arr = np.asarray(row)
        if arr.dtype.kind not in ("i", "u") + (() if self.integer else ("f",)):
            want = "integers" if self.integer else "numbers"
            raise ValueError(f"a {self.spec.kind} report holds {want}, got dtype {arr.dtype}")
        if arr.shape != self.row_shape:
            raise ValueError(f"a report row of {self.spec.wire_mechanism!r} has shape {self.row_shape}, got {arr.shape}")
        return arr.astype(np.int64 if self.integer else float)

    def check(self, reports: np.ndarray) -> None:
        """The mechanism's own decoder-side validation of stacked reports (ValueError if any row is outside)."""
        mech = self.mechanism
        if reports.shape[1:] != self.row_shape:
            raise ValueError(f"reports must have rows of shape {self.row_shape}, got {reports.shape}")
        kind = self.spec.kind
        if kind == "longitudinal":
            mech.estimate_round(reports)
        elif kind == "frequency":
            mech.support_counts(reports)
            if mech.n_reports(reports) != reports.shape[0]:
                raise ValueError("the oracle does not read one report per row")
        else:
            y = np.asarray(mech.debias(reports), dtype=float)
            if y.shape[0] != reports.shape[0] or not np.all(np.isfinite(y)):
                raise ValueError("reports do not decode to finite values")

    def check_row(self, row: Any) -> None:
        """Ingest: ValueError unless ``row`` is a report the stream's mechanism could have produced."""
        try:
            self.check(self.row(row)[None])
        except _DECODE_ERRORS as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None

    # ------------------------------------------------------------------ many rows
    def check_rows(self, rows: list[Any]) -> np.ndarray:
        """Batch form of :meth:`check_row` for ingest: the boolean mask of the rows it accepts. One stacking (by
        :meth:`_fast_stack`, which only succeeds when every row has the row shape and an allowed dtype) and then
        :meth:`valid_mask`; rows that do not stack together are checked one by one."""
        n = len(rows)
        arr = self._fast_stack(_flat_haar_rows(rows) if self._haar else rows) if n else None
        if arr is not None:
            return self.valid_mask(arr)
        mask = np.ones(n, dtype=bool)
        for i, row in enumerate(rows):  # fallback only: rows of mixed shapes or dtypes
            try:
                self.check_row(row)
            except ValueError:
                mask[i] = False
        return mask

    def valid_mask(self, reports: np.ndarray) -> np.ndarray:
        """Boolean mask of the rows :meth:`check` accepts (bisection; see the module docstring)."""
        n = reports.shape[0]
        mask = np.ones(n, dtype=bool)
        pending = [(0, n)] if n else []
        while pending:
            lo, hi = pending.pop()
            try:
                self.check(reports[lo:hi])
                continue
            except _DECODE_ERRORS:
                pass
            if hi - lo == 1:
                mask[lo] = False
            else:
                mid = (lo + hi) // 2
                pending += [(lo, mid), (mid, hi)]
        return mask

    def stack(self, rows: list[Any] | np.ndarray) -> DecodedReports:
        """JSON rows (or an already stacked array) → stacked rows; rows that are not the mechanism's are dropped."""
        if isinstance(rows, np.ndarray):
            arr = rows
        else:
            arr = self._fast_stack(_flat_haar_rows(rows) if self._haar else rows)
            if arr is None:
                return self._slow_stack(rows)
        if arr.shape[1:] != self.row_shape or arr.dtype.kind not in ("i", "u") + (() if self.integer else ("f",)):
            return self._slow_stack(list(arr))
        return DecodedReports(arr.astype(np.int64 if self.integer else float, copy=False))

    def from_bodies(self, bodies: list[str]) -> DecodedReports:
        """Stored body texts → stacked rows (one ``json.loads``, one ``numpy.asarray``; see the module docstring)."""
        if not bodies:
            return DecodedReports(np.empty((0, *self.row_shape), dtype=np.int64 if self.integer else float))
        text = ",".join(bodies)
        if self._haar:
            flat = self._haar_numbers(text, len(bodies))
            if flat is not None:
                return DecodedReports(flat)
            text = _HAAR_BODY.sub(r"[\2,\1]", text)
        else:
            text = text.replace(_BODY_PREFIX, "").replace("}", "")
        try:
            rows = json.loads("[" + text + "]")
        except (ValueError, RecursionError):
            rows = None
        if rows is not None and len(rows) == len(bodies):
            arr = self._fast_stack(rows)
            if arr is not None:
                return DecodedReports(arr)
        return self._slow_stack(_body_rows(bodies))

    def _haar_numbers(self, text: str, n: int) -> np.ndarray | None:
        """Joined canonical Haar bodies → (n, D) floats: one substitution by a pattern that admits exactly D − 1
        JSON numbers in ``detail`` (so every row has D values when all n bodies match) and one C-level number
        parser. None when any body is not canonical."""
        D = self.row_shape[0]
        pattern = _haar_pattern(D)
        flat, matched = pattern.subn(r"\2,\1", text)
        if matched != n:
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                values = np.fromstring(flat, dtype=float, sep=",")
        except (ValueError, DeprecationWarning):
            return None
        return values.reshape(n, D) if values.size == n * D else None

    def _fast_stack(self, rows: list[Any]) -> np.ndarray | None:
        try:
            arr = np.asarray(rows)
        except _DECODE_ERRORS:
            return None
        if arr.shape != (len(rows), *self.row_shape):
            return None
        if self.integer:
            return arr if arr.dtype.kind in ("i", "u") else None
        return arr.astype(float) if arr.dtype.kind in ("i", "u", "f") else None

    def _slow_stack(self, rows: list[Any]) -> DecodedReports:
        good: list[np.ndarray] = []
        dropped = 0
        for row in rows:  # fallback only: non-canonical or malformed bodies
            try:
                good.append(row if isinstance(row, np.ndarray) and row.shape == self.row_shape else self.row(row))
            except _DECODE_ERRORS:
                dropped += 1
        dtype = np.int64 if self.integer else float
        arr = np.stack(good).astype(dtype) if good else np.empty((0, *self.row_shape), dtype=dtype)
        return DecodedReports(arr, dropped)


#: A JSON number (RFC 8259 grammar).
_JSON_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"


@functools.lru_cache(maxsize=32)
def _haar_pattern(D: int) -> re.Pattern[str]:
    """A canonical Haar body with exactly D − 1 detail numbers; groups: (details, mean)."""
    details = _JSON_NUMBER + (f"(?:,{_JSON_NUMBER}){{{D - 2}}}" if D > 2 else "")
    return re.compile(r'\{"report":\{"detail":\[(' + details + r')\],"mean":(' + _JSON_NUMBER + r')\}\}')


#: A canonical Haar row ``{"detail":[z…],"mean":y}`` (sorted keys, no spaces) → ``[y,z…]``.
_HAAR_ROW = re.compile(r'\{"detail":\[([^\[\]{}]*)\],"mean":([^\[\]{},]+)\}')


def _flat_haar_rows(rows: list[Any]) -> list[Any]:
    """Haar rows ``{"mean", "detail"}`` → flat ``[y, z…]`` lists by one ``json.dumps``, one regular-expression
    substitution and one ``json.loads`` (C level, no per-row Python); ``[]`` when the rows are not canonical."""
    try:
        text = _HAAR_ROW.sub(r"[\2,\1]", json.dumps(rows, sort_keys=True, separators=(",", ":"), allow_nan=False))
        flat = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return []
    return flat if isinstance(flat, list) and len(flat) == len(rows) else []


def _body_rows(bodies: list[str]) -> list[Any]:
    """Body texts → their rows, one by one (fallback); undecodable bodies become None (dropped later)."""
    out: list[Any] = []
    for text in bodies:
        try:
            body = json.loads(text)
            out.append(body[BODY_KEY] if isinstance(body, dict) and set(body) == {BODY_KEY} else None)
        except (ValueError, RecursionError):
            out.append(None)
    return out


def _probe_row_shape(spec: StreamSpec, mech: Any) -> tuple[int, ...]:
    """The shape of one report row: privatize one dummy input the way a device does (OS randomness)."""
    if spec.kind == "longitudinal":
        client = mech.client(secret=os.urandom(32), stream="shape-probe", rng=os_rng())
        return tuple(np.shape(client.report(0).report))
    if spec.kind == "frequency":
        return tuple(np.shape(mech.privatize(np.zeros(1, dtype=np.int64), os_rng())[0]))
    x = np.zeros((1, int(mech.d))) if hasattr(mech, "d") else np.zeros(1)
    return tuple(np.shape(mech.privatize(x, os_rng())[0]))
