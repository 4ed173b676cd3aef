"""Durable storage for the coordinator: devices, rounds, reports, aggregates and counters.

One small interface (:class:`Store`) with two SQL backends sharing the schema and queries:

* :class:`SQLiteStore` — the default; WAL journal with ``synchronous=FULL`` so a committed batch survives a
  crash or power loss;
* :class:`PostgresStore` — for several ingest workers sharing one database (``psycopg``, optional extra).

Ingest commits a *batch* of accepted reports together with their aggregates and the rejection counters in one
transaction (:meth:`Store.commit_batch`); ``UNIQUE(device_id, seq)`` and ``UNIQUE(round_id, stream, device_id)``
make a redelivered or raced report a no-op, never a second row. A device's replay high-water mark is the largest
``seq`` it has stored (:meth:`Store.high_water_marks`, read through the first index; reports are never deleted), so
a commit writes no second per-device row; the second index also serves every query by round and stream.

**What an insert costs.** Devices report in random order, so each report lands on a random leaf page of each
index keyed by device, and a commit writes every page it touched to the WAL: at 10⁶ stored reports, a commit of a few
hundred reports touches about one page per report and index, and the cost per report falls as batches grow (ingest
commits full batches under load: :mod:`coordinator.mqtt_receiver`'s group commit). Two such indexes, not four as
before (a separate high-water table with its own key index; a ``(round_id, stream)`` index), cut the CPU of
inserting 10⁶ reports in random device order, 2,000 per commit, by 43 % (37 → 21 s, measured once with this
schema and the one before). A database made by an older version keeps its tables and indexes and works
unchanged.

**Aggregates kept at ingest.** The same transaction adds the sufficient statistics of the reports it actually
inserted (:class:`protocols.catalogue.Statistics`, computed by the caller's ``aggregate`` function from exactly
those reports) to the ``aggregates`` table, so an estimate reads one small row per writer instead of every report
(:meth:`Store.aggregates`). Each store instance writes its own row per (round, stream) (``writer``, random per
instance): workers sharing a PostgreSQL database never update the same row, and a reader sums the rows. When some
reports of a batch were already stored (a redelivery, or another worker's copy), the transaction is redone report
by report so only the inserted ones count (PostgreSQL: one ``INSERT … RETURNING`` says which at once) — a
report is counted once whatever the redeliveries, and of two workers racing to insert the same report, the one
whose insert found it stored adds nothing to its aggregate. The stored reports
stay the source of truth: a (round, stream) whose reports were committed without an aggregate function, or stored
before aggregates existed, is marked *stale* and estimated from its reports until :meth:`Store.rebuild_aggregates`
recomputes it (``haarvest coordinator aggregates --rebuild``). Statistics kept in another shape (a mechanism's
statistic grew a part, e.g. flat OLH's second moments) never fail a batch: adding to such a row marks the stream
stale, and rows of different shapes are not summed (:meth:`Store.aggregates` gives None: estimated from the reports).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

from protocols.catalogue import Statistics

__all__ = ["StoredReport", "Store", "SQLiteStore", "PostgresStore", "open_store", "STORE_ERRORS", "DEVICE_STATUSES",
           "KEEP"]


def _store_errors() -> tuple[type[Exception], ...]:
    errors: list[type[Exception]] = [sqlite3.Error]
    try:
        import psycopg
    except ImportError:  # the PostgreSQL store is an optional extra
        pass
    else:
        errors.append(psycopg.Error)
    return tuple(errors)


#: Exceptions meaning "the database failed" (not "the input is bad"): ingest retries the batch that met one.
STORE_ERRORS = _store_errors()

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS devices (
        device_id TEXT PRIMARY KEY, public_key TEXT NOT NULL, status TEXT NOT NULL,
        enrolled_at DOUBLE PRECISION NOT NULL, contract TEXT)""",
    """CREATE TABLE IF NOT EXISTS rounds (
        round_id TEXT PRIMARY KEY, config TEXT NOT NULL, status TEXT NOT NULL,
        opened_at DOUBLE PRECISION NOT NULL, closed_at DOUBLE PRECISION)""",
    """CREATE TABLE IF NOT EXISTS reports (
        device_id TEXT NOT NULL, seq BIGINT NOT NULL, boot BIGINT NOT NULL, round_id TEXT NOT NULL,
        stream TEXT NOT NULL, mechanism TEXT NOT NULL, body TEXT NOT NULL, sig TEXT NOT NULL,
        received_at DOUBLE PRECISION NOT NULL, UNIQUE (device_id, seq), UNIQUE (round_id, stream, device_id))""",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS aggregates (
        round_id TEXT NOT NULL, stream TEXT NOT NULL, writer TEXT NOT NULL, n BIGINT NOT NULL, stats TEXT NOT NULL,
        PRIMARY KEY (round_id, stream, writer))""",
    """CREATE TABLE IF NOT EXISTS aggregates_stale (
        round_id TEXT NOT NULL, stream TEXT NOT NULL, PRIMARY KEY (round_id, stream))""",
]

#: PostgreSQL advisory lock key held while a store creates or migrates the schema (:meth:`_SQLStore._lock_schema`)
SCHEMA_LOCK = 0x68617276  # "harv"

#: ``aggregate(inserted reports) → {(round_id, stream): Statistics}`` (see the module docstring)
Aggregate = Callable[[list["StoredReport"]], dict[tuple[str, str], Statistics]]

ROUND_STATUSES = ("open", "closed")
#: ``quarantined``: cut off automatically for flooding (:mod:`coordinator.quarantine`); ``active`` again on release
DEVICE_STATUSES = ("active", "revoked", "quarantined")
#: ``upsert_device(contract=KEEP)`` leaves a device's contract as it is
KEEP: Any = object()


def contract_text(contract: dict[str, str] | None) -> str | None:
    """A device contract (stream name → mechanism the device is configured with, ``auto`` = any) as stored."""
    if contract is None:
        return None
    if not isinstance(contract, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in contract.items()):
        raise ValueError("a device contract maps stream names to mechanism names")
    return json.dumps(contract, sort_keys=True)


def _sum_statistics(parts: list[str | Statistics]) -> Statistics | None:
    """The sum of stored statistics (JSON text or :class:`Statistics`); None when there are none or they do not
    add — rows kept in different shapes, e.g. by versions before and after a mechanism's statistic grew a part
    (flat OLH's second moments): such a stream is estimated from its reports until rebuilt."""
    out: Statistics | None = None
    for part in parts:
        stats = part if isinstance(part, Statistics) else Statistics.from_json(json.loads(part))
        if out is not None and (out.total.shape != stats.total.shape or out.squares.shape != stats.squares.shape):
            return None
        out = stats if out is None else out + stats
    return out


class StoredReport(NamedTuple):
    """One accepted report as stored (``body`` is canonical JSON text of ``Report.body``): a named tuple, which
    ingest builds for each accepted report at half the cost of a frozen dataclass (1.7 against 3.7 µs)."""

    device_id: str
    seq: int
    boot: int
    round_id: str
    stream: str
    mechanism: str
    body: str
    sig: str
    received_at: float

    def as_tuple(self) -> tuple:
        return tuple(self)

    def as_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["body"] = json.loads(self.body)
        return out


_ROUND_COLUMNS = ("round_id", "config", "status", "opened_at", "closed_at")
_REPORT_COLUMNS = ("device_id", "seq", "boot", "round_id", "stream", "mechanism", "body", "sig", "received_at")


class Store(ABC):
    """What the coordinator needs from durable storage. Every method is thread-safe."""

    # devices
    @abstractmethod
    def upsert_device(self, device_id: str, public_key: str, status: str = "active",
                      contract: dict[str, str] | None = KEEP) -> None:
        """Enrol or update a device. ``contract``: the streams it may report (name → mechanism, ``auto`` = any
        the round names); None = any stream of a round; :data:`KEEP` (default) leaves the stored one."""

    @abstractmethod
    def add_devices(self, devices: Iterable[tuple[str, str]], status: str = "active",
                    contract: dict[str, str] | None = KEEP) -> int:
        """Enrol or update many devices at once, ``(device_id, public key)`` pairs: what :meth:`upsert_device` does
        to each, as one statement over all rows in one transaction (all or none). The number of pairs."""

    @abstractmethod
    def set_device_status(self, device_id: str, status: str) -> None:
        """Set an enrolled device's status (ValueError for an unknown device or status)."""

    @abstractmethod
    def devices(self) -> dict[str, tuple[str, str]]:
        """device_id → (public key b64, status)."""

    @abstractmethod
    def device_records(self) -> dict[str, dict[str, Any]]:
        """device_id → {public_key, status, enrolled_at, contract (dict or None)}."""

    @abstractmethod
    def device_statuses(self) -> dict[str, str]:
        """device_id → status of every device that is not ``active`` (revoked, quarantined): a small read however
        large the fleet, for what polls it (the broker quarantine sync, metrics)."""

    @abstractmethod
    def device_status_counts(self) -> dict[str, int]:
        """status → number of enrolled devices."""

    def device_counters(self) -> dict[str, dict[str, int]]:
        """Per-device counters (``<name>.<device_id>`` in :meth:`counters`): device_id → {name: count}."""
        out: dict[str, dict[str, int]] = {}
        for key, value in self.counters().items():
            name, sep, device = key.partition(".")
            if sep:
                out.setdefault(device, {})[name] = value
        return out

    @abstractmethod
    def reports_by_device(self) -> dict[str, int]:
        """device_id → number of stored reports."""

    # rounds
    @abstractmethod
    def put_round(self, round_id: str, config_json: str, status: str = "open") -> None: ...
    @abstractmethod
    def set_round_status(self, round_id: str, status: str) -> None: ...
    @abstractmethod
    def rounds(self) -> list[dict[str, Any]]:
        """All rounds in opening order: dicts with round_id, config (JSON text), status, opened_at, closed_at."""

    def round(self, round_id: str) -> dict[str, Any] | None:
        """One round as in :meth:`rounds`, or None. Backends override this with a primary-key lookup."""
        return next((r for r in self.rounds() if r["round_id"] == round_id), None)

    # reports
    @abstractmethod
    def commit_batch(self, reports: list[StoredReport], counters: dict[str, int],
                     aggregate: Aggregate | None = None) -> int:
        """Atomically insert ``reports`` (ignoring ones already stored), raise the high-water marks, add
        ``counters`` (plus ``accepted`` += rows inserted, ``duplicate`` += rows ignored as already stored) and the
        statistics ``aggregate`` gives for the inserted reports (without ``aggregate`` their (round, stream) pairs
        are marked stale). Returns the number of rows inserted."""

    @abstractmethod
    def aggregates(self, round_id: str, stream: str) -> Statistics | None:
        """The stream's statistics summed over writers; None when stale or nothing is aggregated."""

    @abstractmethod
    def rebuild_aggregates(self, round_id: str, stream: str,
                           compute: Callable[[list[str]], Statistics]) -> tuple[Statistics | None, Statistics]:
        """Recompute a stream's statistics from its stored bodies (``compute(bodies)``) with writes held off,
        replace the stored ones and clear the stale mark: (the statistics before, or None, and after)."""

    @abstractmethod
    def round_report_count(self, round_id: str) -> int:
        """Reports stored for a round: the aggregates' n (a few rows) and, for stale streams only, a count of their
        reports — what an estimate cache keys on, whatever the number of reports."""

    @abstractmethod
    def stale_aggregates(self) -> set[tuple[str, str]]:
        """(round_id, stream) pairs whose aggregates must be rebuilt before they are used."""

    @abstractmethod
    def stored_sig(self, device_id: str, seq: int) -> str | None:
        """The signature of the stored report (device_id, seq), or None."""

    @abstractmethod
    def high_water_marks(self) -> dict[str, int]:
        """device_id → the largest seq of its stored reports (its replay high-water mark)."""

    @abstractmethod
    def reported_keys(self, round_ids: Iterable[str]) -> set[tuple[str, str, str]]:
        """(device_id, round_id, stream) of every stored report in ``round_ids``."""

    @abstractmethod
    def report_bodies(self, round_id: str, stream: str) -> list[str]: ...
    @abstractmethod
    def report_counts(self, round_id: str | None = None) -> dict[tuple[str, str], int]:
        """(round_id, stream) → number of stored reports (of one round: an index range, not a table scan)."""

    @abstractmethod
    def iter_reports(self, round_id: str | None = None) -> Iterator[StoredReport]: ...
    @abstractmethod
    def counters(self) -> dict[str, int]: ...
    @abstractmethod
    def close(self) -> None: ...


class _SQLStore(Store):
    """Shared SQL; subclasses set the placeholder and connection."""

    ph = "?"
    #: rows per INSERT statement of a batch (1: one ``executemany``)
    _rows_per_insert = 1

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self._writer = secrets.token_hex(8)
        with self._lock:
            cur = self._conn.cursor()
            self._lock_schema(cur)
            fresh = not self._has_table(cur, "aggregates")
            for stmt in SCHEMA:
                cur.execute(stmt)
            self._migrate(cur)
            if fresh:  # reports stored before aggregates existed: estimated from their reports until rebuilt
                cur.execute("INSERT INTO aggregates_stale (round_id, stream) SELECT DISTINCT round_id, stream "
                            "FROM reports")
            self._conn.commit()

    def _lock_schema(self, cur: Any) -> None:
        """Hold off other processes creating or migrating the schema until this transaction ends: workers started
        at once on a fresh PostgreSQL database would otherwise race in ``CREATE TABLE IF NOT EXISTS`` (which is not
        atomic there: all but one fail on ``pg_type``'s unique index) and in the upgrade's first stale marks."""
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))

    def _has_table(self, cur: Any, name: str) -> bool:
        cur.execute("SELECT to_regclass(%s)", (name,))
        return cur.fetchone()[0] is not None

    def _migrate(self, cur: Any) -> None:
        """Bring a database created by an older version up to :data:`SCHEMA` (the devices' contract column)."""
        cur.execute("ALTER TABLE devices ADD COLUMN IF NOT EXISTS contract TEXT")

    def _q(self, sql: str) -> str:
        return sql.replace("?", self.ph)

    def _exec(self, sql: str, args: tuple = (), commit: bool = False) -> list[tuple]:
        with self._lock:
            self._check_connection()
            cur = self._conn.cursor()
            try:
                cur.execute(self._q(sql), args)
                rows = cur.fetchall() if cur.description else []
                if commit:
                    self._conn.commit()
                else:
                    self._end_read()
            except BaseException:
                self._rollback()  # PostgreSQL refuses every later statement of a failed transaction
                raise
            return rows

    def _check_connection(self) -> None:
        """Reopen a connection the server dropped (PostgreSQL); SQLite's never drops."""

    def _rollback(self) -> None:
        try:
            self._conn.rollback()
        except Exception:  # noqa: BLE001 - a broken connection: _check_connection reopens it next time
            pass

    def _end_read(self) -> None:
        """Finish the implicit read transaction (PostgreSQL would otherwise hold a snapshot)."""

    @staticmethod
    def _device_upsert(status: str, contract: dict[str, str] | None) -> tuple[str, str | None]:
        """The INSERT … ON CONFLICT of :meth:`upsert_device` / :meth:`add_devices`, and the contract column."""
        if status not in DEVICE_STATUSES:
            raise ValueError(f"device status must be one of {DEVICE_STATUSES}")
        keep = contract is KEEP
        sql = ("INSERT INTO devices (device_id, public_key, status, enrolled_at, contract) VALUES (?, ?, ?, ?, ?) "
               "ON CONFLICT (device_id) DO UPDATE SET public_key = excluded.public_key, status = excluded.status"
               + ("" if keep else ", contract = excluded.contract"))
        return sql, None if keep else contract_text(contract)

    def upsert_device(self, device_id: str, public_key: str, status: str = "active",
                      contract: dict[str, str] | None = KEEP) -> None:
        sql, text = self._device_upsert(status, contract)
        self._exec(sql, (device_id, public_key, status, time.time(), text), commit=True)

    def add_devices(self, devices: Iterable[tuple[str, str]], status: str = "active",
                    contract: dict[str, str] | None = KEEP) -> int:
        sql, text = self._device_upsert(status, contract)
        now = time.time()
        count = 0

        def rows() -> Iterator[tuple[Any, ...]]:
            nonlocal count
            for device_id, public_key in devices:
                count += 1
                yield device_id, public_key, status, now, text

        with self._lock:
            self._check_connection()
            cur = self._conn.cursor()
            try:
                cur.executemany(self._q(sql), rows())
                self._conn.commit()
            except BaseException:
                self._rollback()
                raise
        return count

    def set_device_status(self, device_id: str, status: str) -> None:
        if status not in DEVICE_STATUSES:
            raise ValueError(f"device status must be one of {DEVICE_STATUSES}")
        if not self._exec("SELECT 1 FROM devices WHERE device_id = ?", (device_id,)):
            raise ValueError(f"unknown device {device_id!r}")
        self._exec("UPDATE devices SET status = ? WHERE device_id = ?", (status, device_id), commit=True)

    def devices(self) -> dict[str, tuple[str, str]]:
        return {r[0]: (r[1], r[2]) for r in self._exec("SELECT device_id, public_key, status FROM devices")}

    def device_records(self) -> dict[str, dict[str, Any]]:
        rows = self._exec("SELECT device_id, public_key, status, enrolled_at, contract FROM devices")
        return {d: {"public_key": k, "status": s, "enrolled_at": t, "contract": None if c is None else json.loads(c)}
                for d, k, s, t, c in rows}

    def device_statuses(self) -> dict[str, str]:
        return dict(self._exec("SELECT device_id, status FROM devices WHERE status <> 'active'"))

    def device_status_counts(self) -> dict[str, int]:
        return {s: int(n) for s, n in self._exec("SELECT status, COUNT(*) FROM devices GROUP BY status")}

    def reports_by_device(self) -> dict[str, int]:
        return {d: int(n) for d, n in self._exec("SELECT device_id, COUNT(*) FROM reports GROUP BY device_id")}

    def put_round(self, round_id: str, config_json: str, status: str = "open") -> None:
        if status not in ROUND_STATUSES:
            raise ValueError(f"round status must be one of {ROUND_STATUSES}")
        if self._exec("SELECT 1 FROM rounds WHERE round_id = ?", (round_id,)):
            raise ValueError(f"round {round_id!r} already exists")
        self._exec(
            "INSERT INTO rounds (round_id, config, status, opened_at) VALUES (?, ?, ?, ?)",
            (round_id, config_json, status, time.time()),
            commit=True,
        )

    def set_round_status(self, round_id: str, status: str) -> None:
        if status not in ROUND_STATUSES:
            raise ValueError(f"round status must be one of {ROUND_STATUSES}")
        if not self._exec("SELECT 1 FROM rounds WHERE round_id = ?", (round_id,)):
            raise ValueError(f"unknown round {round_id!r}")
        closed = time.time() if status == "closed" else None
        self._exec("UPDATE rounds SET status = ?, closed_at = ? WHERE round_id = ?", (status, closed, round_id),
                   commit=True)

    def rounds(self) -> list[dict[str, Any]]:
        rows = self._exec("SELECT round_id, config, status, opened_at, closed_at FROM rounds ORDER BY opened_at, round_id")
        return [dict(zip(_ROUND_COLUMNS, r)) for r in rows]

    def round(self, round_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT round_id, config, status, opened_at, closed_at FROM rounds WHERE round_id = ?",
                          (round_id,))
        return dict(zip(_ROUND_COLUMNS, rows[0])) if rows else None

    def commit_batch(self, reports: list[StoredReport], counters: dict[str, int],
                     aggregate: Aggregate | None = None) -> int:
        # rows in key order: workers committing overlapping devices lock them in the same order (no deadlock)
        reports = sorted(reports, key=lambda r: (r.device_id, r.seq))
        with self._lock:
            self._check_connection()
            cur = self._conn.cursor()
            try:
                stored = self._insert_reports(cur, reports, exact=False)
                if stored is None:  # some were stored already: redo one by one to know which ones this inserts
                    self._conn.rollback()
                    cur = self._conn.cursor()
                    stored = self._insert_reports(cur, reports, exact=True)
                inserted = len(stored)  # type: ignore[arg-type]
                if stored:
                    self._add_aggregates(cur, stored, aggregate)
                adds = {k: v for k, v in counters.items() if v}
                if inserted:
                    adds["accepted"] = adds.get("accepted", 0) + inserted
                if len(reports) > inserted:  # stored meanwhile (another worker, or a redelivery): a duplicate
                    adds["duplicate"] = adds.get("duplicate", 0) + len(reports) - inserted
                if adds:
                    cur.executemany(
                        self._q("INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) "
                                "DO UPDATE SET value = counters.value + excluded.value"),
                        sorted(adds.items()),
                    )
                self._conn.commit()
            except BaseException:
                self._rollback()
                raise
            return inserted

    def _insert_reports(self, cur: Any, reports: list[StoredReport], exact: bool) -> list[StoredReport] | None:
        """Insert, ignoring reports already stored: the inserted ones, or None when ``exact`` is False and some
        were ignored (one ``executemany`` cannot say which)."""
        if not reports:
            return []
        template = f"INSERT INTO reports ({', '.join(_REPORT_COLUMNS)}) VALUES {{}} ON CONFLICT DO NOTHING"
        if not exact:
            inserted = self._insert_many(cur, template, [r.as_tuple() for r in reports])
            return reports if inserted == len(reports) else None
        sql = self._q(template.format(f"({', '.join('?' * len(_REPORT_COLUMNS))})"))
        stored = []
        for r in reports:  # only after a conflict: a redelivery or a race between workers
            cur.execute(sql, r.as_tuple())
            if cur.rowcount == 1:
                stored.append(r)
        return stored

    def _insert_many(self, cur: Any, template: str, rows: list[tuple]) -> int:
        """Run the INSERT ``template`` (``{}`` where its VALUES go) for every row; the rows it inserted. One
        ``executemany`` (``_rows_per_insert`` = 1), or statements of that many rows each."""
        per = self._rows_per_insert
        if per <= 1:
            cur.executemany(self._q(template.format(f"({', '.join('?' * len(rows[0]))})")), rows)
            return cur.rowcount
        row = f"({', '.join('?' * len(rows[0]))})"
        per = max(1, min(per, self._max_parameters // len(rows[0])))  # within this SQLite's bound-parameter limit
        inserted = 0
        for start in range(0, len(rows), per):
            part = rows[start:start + per]
            cur.execute(self._q(template.format(", ".join([row] * len(part)))), [v for r in part for v in r])
            inserted += cur.rowcount
        return inserted

    def _add_aggregates(self, cur: Any, stored: list[StoredReport], aggregate: Aggregate | None) -> None:
        if aggregate is None:
            pairs = sorted({(r.round_id, r.stream) for r in stored})
            cur.executemany(self._q("INSERT INTO aggregates_stale (round_id, stream) VALUES (?, ?) "
                                    "ON CONFLICT DO NOTHING"), pairs)
            return
        try:
            deltas = aggregate(stored)
        except (ValueError, TypeError, KeyError, IndexError):  # never lose a batch for its statistics: rebuild later
            return self._add_aggregates(cur, stored, None)
        for (round_id, stream), delta in sorted(deltas.items(), key=itemgetter(0)):
            cur.execute(self._q("SELECT stats FROM aggregates WHERE round_id = ? AND stream = ? AND writer = ?"),
                        (round_id, stream, self._writer))
            row = cur.fetchone()
            total = delta if row is None else _sum_statistics([row[0], delta])
            if total is None:  # kept in another shape (a version before the statistic changed): rebuild later
                cur.execute(self._q("INSERT INTO aggregates_stale (round_id, stream) VALUES (?, ?) "
                                    "ON CONFLICT DO NOTHING"), (round_id, stream))
                continue
            cur.execute(self._q("INSERT INTO aggregates (round_id, stream, writer, n, stats) VALUES (?, ?, ?, ?, ?) "
                                "ON CONFLICT (round_id, stream, writer) DO UPDATE SET n = excluded.n, "
                                "stats = excluded.stats"),
                        (round_id, stream, self._writer, total.n, json.dumps(total.to_json())))

    def aggregates(self, round_id: str, stream: str) -> Statistics | None:
        with self._lock:
            stale = self._exec("SELECT 1 FROM aggregates_stale WHERE round_id = ? AND stream = ?", (round_id, stream))
            rows = [] if stale else self._exec("SELECT stats FROM aggregates WHERE round_id = ? AND stream = ?",
                                               (round_id, stream))
        return _sum_statistics([text for (text,) in rows])

    def stale_aggregates(self) -> set[tuple[str, str]]:
        return {(a, b) for a, b in self._exec("SELECT round_id, stream FROM aggregates_stale")}

    def round_report_count(self, round_id: str) -> int:
        with self._lock:
            stale = [s for (s,) in self._exec("SELECT stream FROM aggregates_stale WHERE round_id = ?", (round_id,))]
            kept = self._exec("SELECT stream, SUM(n) FROM aggregates WHERE round_id = ? GROUP BY stream", (round_id,))
            total = sum(int(n) for stream, n in kept if stream not in stale)
            for stream in stale:
                total += int(self._exec("SELECT COUNT(*) FROM reports WHERE round_id = ? AND stream = ?",
                                        (round_id, stream))[0][0])
        return total

    def _lock_writes(self, cur: Any) -> None:
        """Hold off other writers of reports until this transaction ends."""
        cur.execute("LOCK TABLE reports IN SHARE ROW EXCLUSIVE MODE")

    def rebuild_aggregates(self, round_id: str, stream: str,
                           compute: Callable[[list[str]], Statistics]) -> tuple[Statistics | None, Statistics]:
        with self._lock:
            self._check_connection()
            cur = self._conn.cursor()
            try:
                self._lock_writes(cur)
                cur.execute(self._q("SELECT stats FROM aggregates WHERE round_id = ? AND stream = ?"), (round_id, stream))
                before = _sum_statistics([text for (text,) in cur.fetchall()])
                cur.execute(self._q("SELECT body FROM reports WHERE round_id = ? AND stream = ? ORDER BY device_id"),
                            (round_id, stream))
                after = compute([row[0] for row in cur.fetchall()])
                cur.execute(self._q("DELETE FROM aggregates WHERE round_id = ? AND stream = ?"), (round_id, stream))
                cur.execute(self._q("INSERT INTO aggregates (round_id, stream, writer, n, stats) VALUES (?, ?, ?, ?, ?)"),
                            (round_id, stream, self._writer, after.n, json.dumps(after.to_json())))
                cur.execute(self._q("DELETE FROM aggregates_stale WHERE round_id = ? AND stream = ?"), (round_id, stream))
                self._conn.commit()
            except BaseException:
                self._rollback()
                raise
            return before, after

    def stored_sig(self, device_id: str, seq: int) -> str | None:
        rows = self._exec("SELECT sig FROM reports WHERE device_id = ? AND seq = ?", (device_id, seq))
        return rows[0][0] if rows else None

    def high_water_marks(self) -> dict[str, int]:
        return {d: int(s) for d, s in self._exec("SELECT device_id, MAX(seq) FROM reports GROUP BY device_id")}

    def reported_keys(self, round_ids: Iterable[str]) -> set[tuple[str, str, str]]:
        out: set[tuple[str, str, str]] = set()
        for rid in round_ids:
            rows = self._exec("SELECT device_id, round_id, stream FROM reports WHERE round_id = ?", (rid,))
            out.update((a, b, c) for a, b, c in rows)
        return out

    def report_bodies(self, round_id: str, stream: str) -> list[str]:
        rows = self._exec("SELECT body FROM reports WHERE round_id = ? AND stream = ? ORDER BY device_id",
                          (round_id, stream))
        return list(map(itemgetter(0), rows))

    def report_counts(self, round_id: str | None = None) -> dict[tuple[str, str], int]:
        if round_id is None:
            rows = self._exec("SELECT round_id, stream, COUNT(*) FROM reports GROUP BY round_id, stream")
        else:
            rows = self._exec("SELECT round_id, stream, COUNT(*) FROM reports WHERE round_id = ? GROUP BY round_id, "
                              "stream", (round_id,))
        return {(a, b): int(c) for a, b, c in rows}

    def iter_reports(self, round_id: str | None = None) -> Iterator[StoredReport]:
        sql = f"SELECT {', '.join(_REPORT_COLUMNS)} FROM reports"
        args: tuple = ()
        if round_id is not None:
            sql += " WHERE round_id = ?"
            args = (round_id,)
        sql += " ORDER BY round_id, stream, device_id"
        for row in self._exec(sql, args):
            yield StoredReport(*row)

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._exec("SELECT name, value FROM counters")}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


#: SQLite's page cache per connection, KiB (SQLite's default is 2,000): the reports' unique indexes and the
#: high-water marks take device ids in random order, so a batch touches pages all over them — O(reports) index pages,
#: which at fleet scale no longer fit the default cache (each batch re-read them; the "Fleet scale" section of
#: ``make bench`` measures it). Allocated as used: a small database
#: costs what it holds.
SQLITE_CACHE_KIB = 131_072

#: WAL pages that trigger a checkpoint (SQLite's default is 1,000): at 10⁶ reports one batch of random index updates
#: writes more than that, so every commit also copied its pages back into the database file and synced it; 10,000
#: (≈ 40 MiB of WAL) lets a page updated by many batches be checkpointed once (the "Fleet scale" section of
#: ``make bench`` drains 10⁶ reports through this store).
SQLITE_WAL_AUTOCHECKPOINT = 10_000
#: Rows per INSERT statement at most (9 parameters a report: 4,500), fewer where the SQLite build's bound-parameter
#: limit is lower (999 before SQLite 3.32).
SQLITE_ROWS_PER_INSERT = 500


class SQLiteStore(_SQLStore):
    """SQLite in WAL mode with ``synchronous=FULL`` (a commit is on disk before it returns); a larger page cache and
    WAL checkpoint interval than SQLite's defaults (:data:`SQLITE_CACHE_KIB`, :data:`SQLITE_WAL_AUTOCHECKPOINT`).

    A batch's reports are inserted :data:`SQLITE_ROWS_PER_INSERT` rows per statement: Python's
    sqlite3 releases and re-takes the GIL around every step, and ``executemany`` steps once per row — with the
    ingest's validate thread busy, each re-take waited for the GIL (up to the 5 ms switch interval)."""

    _rows_per_insert = SQLITE_ROWS_PER_INSERT

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0, isolation_level="DEFERRED")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
        conn.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT}")
        #: this build's bound-parameter limit (999 before SQLite 3.32, 32,766 since)
        self._max_parameters = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        super().__init__(conn)

    def _has_table(self, cur: Any, name: str) -> bool:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return cur.fetchone() is not None

    def _lock_writes(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")  # the database's write lock, held to the commit

    def _lock_schema(self, cur: Any) -> None:
        """Nothing: SQLite runs each ``CREATE TABLE IF NOT EXISTS`` atomically, and taking the write lock here would
        make opening a store wait for (or, read-only, fail on) the database's write lock."""

    def _migrate(self, cur: Any) -> None:
        cur.execute("PRAGMA table_info(devices)")
        if "contract" not in {row[1] for row in cur.fetchall()}:
            cur.execute("ALTER TABLE devices ADD COLUMN contract TEXT")


class PostgresStore(_SQLStore):
    """PostgreSQL backend (``psycopg`` 3) for several ingest workers sharing one database."""

    ph = "%s"

    def __init__(self, dsn: str) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ValueError("the PostgreSQL store needs psycopg (pip install 'haarvest[postgres]')") from exc
        self.dsn = dsn
        super().__init__(psycopg.connect(dsn))

    def _end_read(self) -> None:
        self._conn.commit()

    def _insert_reports(self, cur: Any, reports: list[StoredReport], exact: bool) -> list[StoredReport] | None:
        """One pipelined ``executemany`` whose ``RETURNING`` says, row by row, which reports it inserted: exact at
        once, also when another worker stored some of them first (its transaction waits for theirs, then the
        conflict makes the insert a no-op that returns nothing)."""
        if not reports:
            return []
        cur.executemany(f"INSERT INTO reports ({', '.join(_REPORT_COLUMNS)}) VALUES "
                        f"({', '.join(['%s'] * len(_REPORT_COLUMNS))}) ON CONFLICT DO NOTHING RETURNING 1",
                        [r.as_tuple() for r in reports], returning=True)
        stored = []
        for r in reports:  # one result set per report, in order
            if cur.fetchall():
                stored.append(r)
            cur.nextset()
        return stored

    def _check_connection(self) -> None:
        if self._conn.closed or self._conn.broken:
            import psycopg

            self._conn = psycopg.connect(self.dsn)


def open_store(url: str | Path) -> Store:
    """``postgresql://...`` → :class:`PostgresStore`; ``sqlite:///path``, a path or ``:memory:`` → :class:`SQLiteStore`."""
    text = str(url)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///"):]
    return SQLiteStore(text)
