"""Report rows → the arrays a stream's mechanism decodes, with the mechanism's own support check.

A :class:`StreamDecoder` is built once per round and stream (``StreamSpec.build()``); the stream mechanism's
:mod:`protocols.catalogue` entry gives its report row shape and its row codec. It answers three questions:

* :meth:`StreamDecoder.check_row` — can this one report row (the ``"report"`` of a body, already through
  :func:`protocols.contract.body_row`) come from the stream's mechanism? Its shape must be the mechanism's row
  shape, integer families (frequency oracles, longitudinal protocols) must carry integers, and the mechanism's
  decoder must accept it: ``debias`` for numeric, vector and Haar mechanisms (finite, inside the output bound
  ``[-B, B]`` — PM's C, HM's and Duchi's B, k-sampling's (d/k)·B, both parts of a Haar row), ``support_counts``
  for oracles (``[0, k)``, 0/1 vectors of length k, hash seeds and values in range, …), ``estimate_round`` for
  longitudinal protocols. The ingest validator rejects anything else — as ``off_grid`` when the values are not
  indices of the mechanism's public grid (:meth:`StreamDecoder.rejection`), else as ``bad_body`` — so one
  out-of-support report can no longer make the whole stream's estimate fail.
* :meth:`StreamDecoder.from_bodies` — all stored bodies of a stream as one array: the body texts are joined and
  parsed by one ``json.loads``, and the rows stacked by the catalogue's codec (:meth:`protocols.catalogue.Entry.
  decode_rows`). Anything unexpected (a body that does not parse, a ragged row) falls back to decoding body by
  body, dropping and counting what does not decode.
* :meth:`StreamDecoder.valid_mask` — which rows of a stacked array the mechanism's decoder accepts, by bisection
  (the checks are elementwise, so a block passes iff all its rows do): ``O(b log n)`` vectorised checks for ``b``
  bad rows, one check when all are good. The estimator drops and counts the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocols.catalogue import Entry, Family
from protocols.contract import BODY_KEY, StreamSpec, body_row_of
from protocols.errors import OffGridError

__all__ = ["StreamDecoder", "DecodedReports"]

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
    entry: Entry
    row_shape: tuple[int, ...]

    @classmethod
    def for_spec(cls, spec: StreamSpec) -> "StreamDecoder":
        """Build the stream's mechanism and read its report row shape; ValueError if it cannot be built."""
        try:
            entry = spec.entry
            mech = spec.build()
            shape = entry.row_shape(mech)
        except (ValueError, TypeError, ImportError, AttributeError) as exc:
            raise ValueError(f"the stream's mechanism cannot be built: {exc}") from None
        return cls(spec=spec, mechanism=mech, entry=entry, row_shape=shape)

    @property
    def integer(self) -> bool:
        return self.entry.integer

    def _empty(self) -> np.ndarray:
        return np.empty((0, *self.row_shape), dtype=np.int64 if self.integer else float)

    # ------------------------------------------------------------------ one row
    def row(self, row: Any) -> np.ndarray:
        """One JSON report row as an array of :attr:`row_shape` (ValueError if it cannot be one; OffGridError if it
        holds real numbers)."""
        try:
            return self.entry.decode_rows(self.mechanism, [row])[0]
        except OffGridError:
            raise
        except _DECODE_ERRORS as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None

    def check(self, reports: np.ndarray) -> None:
        """The mechanism's own decoder-side validation of stacked reports (ValueError if any row is outside)."""
        mech = self.mechanism
        if reports.shape[1:] != self.row_shape:
            raise ValueError(f"reports must have rows of shape {self.row_shape}, got {reports.shape}")
        family = self.entry.family
        if family is Family.LONGITUDINAL:
            mech.estimate_round(reports)
        elif family is Family.DISTRIBUTION:
            if reports.shape[0]:
                total = np.asarray(mech.statistics_total(reports), dtype=float)
                if mech.n_reports(reports) != reports.shape[0] or not np.all(np.isfinite(total)):
                    raise ValueError("the distribution mechanism does not read one report per row")
        elif family is Family.FREQUENCY:
            mech.support_counts(reports)
            if mech.n_reports(reports) != reports.shape[0]:
                raise ValueError("the oracle does not read one report per row")
        else:
            y = np.asarray(mech.debias(reports), dtype=float)
            if y.shape[0] != reports.shape[0] or not np.all(np.isfinite(y)):
                raise ValueError("reports do not decode to finite values")

    def rejection(self, row: Any) -> tuple[str, str]:
        """Why ingest refuses ``row`` (one :meth:`check_rows` rejected): ``("off_grid", …)`` when its values are not
        indices of the mechanism's public grid — real numbers (the old raw-double release) or integers outside it —
        else ``("bad_body", …)``."""
        try:
            self.check(self.row(row)[None])
        except OffGridError as exc:
            return "off_grid", str(exc)
        except _DECODE_ERRORS as exc:
            return "bad_body", str(exc) or "outside the support of the stream's mechanism"
        return "bad_body", "outside the support of the stream's mechanism"

    def check_row(self, row: Any) -> None:
        """Ingest: ValueError unless ``row`` is a report the stream's mechanism could have produced."""
        try:
            self.check(self.row(row)[None])
        except _DECODE_ERRORS as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None

    # ------------------------------------------------------------------ many rows
    def check_rows(self, rows: list[Any]) -> np.ndarray:
        """Batch form of :meth:`check_row` for ingest: the boolean mask of the rows it accepts. One stacking by the
        codec (which only succeeds when every row has the row shape and an allowed dtype), then :meth:`valid_mask`;
        rows that do not stack together are checked one by one."""
        arr = self._fast_stack(rows) if rows else None
        if arr is not None:
            return self.valid_mask(arr)
        mask = np.ones(len(rows), dtype=bool)
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
            if rows.shape[1:] == self.row_shape and rows.dtype.kind in ("i", "u") + (() if self.integer else ("f",)):
                return DecodedReports(rows.astype(np.int64 if self.integer else float, copy=False))
            return self._slow_stack(list(rows))
        arr = self._fast_stack(rows) if rows else self._empty()
        return DecodedReports(arr) if arr is not None else self._slow_stack(rows)

    def from_bodies(self, bodies: list[str]) -> DecodedReports:
        """Stored body texts → stacked rows (one ``json.loads`` and the codec; see the module docstring)."""
        if not bodies:
            return DecodedReports(self._empty())
        try:
            parsed = json.loads("[" + ",".join(bodies) + "]")
            rows = [body[BODY_KEY] for body in parsed] if len(parsed) == len(bodies) else None
        except (ValueError, RecursionError, TypeError, KeyError):
            rows = None
        arr = self._fast_stack(rows) if rows is not None else None
        return DecodedReports(arr) if arr is not None else self._slow_stack(_body_rows(bodies))

    def _fast_stack(self, rows: list[Any]) -> np.ndarray | None:
        try:
            return self.entry.decode_rows(self.mechanism, rows)
        except _DECODE_ERRORS:
            return None

    def _slow_stack(self, rows: list[Any]) -> DecodedReports:
        good: list[np.ndarray] = []
        dropped = 0
        for row in rows:  # fallback only: non-canonical or malformed bodies
            try:
                good.append(row if isinstance(row, np.ndarray) and row.shape == self.row_shape else self.row(row))
            except _DECODE_ERRORS:
                dropped += 1
        dtype = np.int64 if self.integer else float
        arr = np.stack(good).astype(dtype) if good else self._empty()
        return DecodedReports(arr, dropped)


def _body_rows(bodies: list[str]) -> list[Any]:
    """Body texts → their rows, one by one (fallback); undecodable bodies become None (dropped later)."""
    out: list[Any] = []
    for text in bodies:
        try:  # the contract's body check (protocols.contract.body_row_of)
            out.append(body_row_of(json.loads(text)))
        except (ValueError, RecursionError):
            out.append(None)
    return out
