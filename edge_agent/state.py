"""Durable device state: ONE SQLite database (WAL journal, ``synchronous=FULL``).

Tables:

* ``ledger`` — append-only privacy charges ``(id, ts, stream, round_id, epsilon, memo_key, seq, mechanism,
  delta)``; triggers abort any UPDATE or DELETE. The ledger is the device's authority (SPEC §4). ``delta`` is the
  δ of an (ε, δ) charge (NULL for pure ε-LDP mechanisms); added in schema version 2 (a version-1 database is
  migrated in place by ``ALTER TABLE ... ADD COLUMN``, its old rows keep NULL).
* ``memo`` — memoized noisy report bodies keyed by ``HMAC-SHA256(device secret, stream ‖ spec ‖ rounded value)``
  (hex). Raw readings are never stored anywhere.
* ``outbox`` — signed report payloads by sequence number, status ``pending`` → ``sent`` (on PUBACK) or
  ``rejected`` (the broker refused it); ``epsilon`` is what that report charged (0 for a memo hit).
* ``meta`` — counters: ``boot``, ``next_seq``, status counters (``refused_total_cap``, ``clipped``, ...),
  ``compacted_count``/``compacted_epsilon`` for sent rows folded away by :meth:`State.compact`.
* ``rounding`` — per-dimension α-rounding state (the life-long u draw and the current quantised step).
* ``rounds`` — round ids already answered or refused (a round is answered at most once, across reboots).

Atomicity: :meth:`State.commit_reports` runs ``BEGIN IMMEDIATE`` … ``COMMIT`` around the cap checks, the ledger
debit, the memo entry, the outbox row and the sequence counter of every report of one round — and, in the same
transaction, whatever else the device round changes: the round's record (``rounds``: answered at most once), the
α-rounding state the reports were rounded with, the status counters, and the ``sent`` marks of reports an earlier
reply carried (:meth:`State.commit_reports` ``round_record``, ``rounding``, ``counters``, ``sent``). So after any crash
either all of a round exists or none of it does; nothing is published except from a committed outbox row. One commit
= one fsync per device round. A refused stream writes nothing (every refusal — caps, full outbox, oversized
payload — is decided before the report's first write), so it does not undo the others. Invariant (checked by
:meth:`State.check_invariants` and the crash test): ``Σ ledger.epsilon = Σ outbox.epsilon + compacted_epsilon``.

Caps: a new charge is refused when ``spent(stream) + ε > stream_cap`` or ``spent(all) + ε > total_cap`` (and, for an
(ε, δ) charge, when ``Σ δ + δ > delta_cap`` — basic composition adds the δs; no δ cap configured refuses every
δ > 0 charge), where
"spent" sums the whole ledger, or — with a renewal period P — the charges in the closed window ``[now − P, now]``
(a sliding window: no closed interval of length P holds more than the cap; a charge exactly P seconds old still
counts, so reports at t and t + P cannot both spend a full cap). Ledger timestamps never go
backwards (``ts = max(now, last ts)``), so a clock stepped back cannot re-open budget; a clock stepped *forward*
does renew early — devices without an RTC should sync time before reporting (documented in docs/agent.md).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from protocols.accounting import check_cap, check_delta_cap, memo_charge
from protocols.errors import BudgetExceededError, Refused

__all__ = ["State", "Refused", "Commit", "ReportRequest", "OutboxRow", "SCHEMA_VERSION"]

SCHEMA_VERSION = 4
#: page cache of a hosted database (:class:`State` ``hosted``): a device round touches a few pages of a small file
HOSTED_CACHE_PAGES = 16
#: WAL pages after which a hosted database checkpoints (and truncates its WAL to that size)
HOSTED_WAL_PAGES = 64
#: page size of a database created hosted: a device's database holds a few hundred small rows per table, so
#: SQLite's default 4 KiB pages leave most of every page empty (the file, the WAL frames and the page cache scale with it)
HOSTED_PAGE_SIZE = 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    stream TEXT NOT NULL,
    round_id TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon > 0),
    memo_key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    mechanism TEXT NOT NULL,
    delta REAL CHECK (delta IS NULL OR (delta > 0 AND delta < 1)),
    unit TEXT NOT NULL DEFAULT 'value' CHECK (unit IN ('device', 'value')),
    until REAL
);
CREATE TRIGGER IF NOT EXISTS ledger_append_only_u BEFORE UPDATE ON ledger
    BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS ledger_append_only_d BEFORE DELETE ON ledger
    BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END;
CREATE TABLE IF NOT EXISTS memo (
    key TEXT PRIMARY KEY,
    stream TEXT NOT NULL,
    spec TEXT NOT NULL,
    body TEXT NOT NULL,
    epsilon REAL NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB,
    status TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'rejected')),
    stream TEXT NOT NULL,
    round_id TEXT NOT NULL,
    epsilon REAL NOT NULL CHECK (epsilon >= 0),
    memo_key TEXT NOT NULL,
    created REAL NOT NULL,
    sent_at REAL
);
CREATE INDEX IF NOT EXISTS outbox_status_seq ON outbox (status, seq);
CREATE TABLE IF NOT EXISTS rounding (dim TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (round_id TEXT PRIMARY KEY, received REAL NOT NULL, status TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS resets (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, record TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS resets_append_only_u BEFORE UPDATE ON resets
    BEGIN SELECT RAISE(ABORT, 'the reset record is append-only'); END;
CREATE TRIGGER IF NOT EXISTS resets_append_only_d BEFORE DELETE ON resets
    BEGIN SELECT RAISE(ABORT, 'the reset record is append-only'); END;
"""


@dataclass(frozen=True)
class Commit:
    """A committed report: its sequence number, the ε it charged (0 on a memo hit) and its signed payload."""

    seq: int
    topic: str
    payload: bytes
    charged: float
    memo_hit: bool
    body: dict[str, Any]


@dataclass(frozen=True)
class ReportRequest:
    """One stream's report for :meth:`State.commit_reports`. ``make_body()`` privatizes (memo miss only);
    ``make_payload(seq, body)`` signs and returns ``(topic, payload)`` (it may raise :class:`Refused`)."""

    stream: str
    round_id: str
    memo_key: str
    spec: str
    mechanism: str
    epsilon: float
    stream_cap: float
    make_body: Callable[[], dict[str, Any]]
    make_payload: Callable[[int, dict[str, Any]], tuple[str, bytes]]
    round_cap: float | None = None
    memoize: bool = True
    refresh: bool = False  # longitudinal: a memo hit still calls make_body() (a fresh IRR), charging 0
    delta: float = 0.0  # δ of an (ε, δ) mechanism (Gaussian); recorded in the ledger and capped by delta_cap
    unit: str = "device"  # the privacy unit the charge is true for (edge_agent.config); recorded in the ledger
    until: float | None = None  # a charge that covers releases up to this time (ledger time); None: its own ts
    state: tuple[str, dict[str, Any]] | None = None  # (key, state) saved in the rounding table iff this commits


@dataclass(frozen=True)
class OutboxRow:
    seq: int
    topic: str
    payload: bytes


#: the outbox's pending rows and the next sequence number, as scalar subqueries of a batch's first read
_PENDING_SQL = "(SELECT COUNT(*) FROM outbox WHERE status = 'pending')"
_NEXT_SEQ_SQL = "(SELECT value FROM meta WHERE key = 'next_seq')"


class _Spent:
    """What the ledger has spent, for the cap checks of one :meth:`State.commit_reports` batch: summed in ONE pass
    over the ledger when the batch's first charge is checked, then kept up to date with the batch's own charges
    (their ledger rows are written when the batch ends).

    With a renewal period P only charges with ``ts > now - P`` count for the stream and total caps and for δ (a
    sliding window; the batch's own charges have ``ts ≥ now`` and always count); the round cap counts every charge
    of the round. ``last_ts`` is the timestamp of the batch's charges: ``max(now, last ledger ts)`` (ledger time
    never goes backwards); ``last_id`` the highest ledger row id before the batch."""

    __slots__ = ("streams", "rounds", "total", "delta", "last_ts", "last_id")

    def __init__(self, streams: dict[str, float], rounds: dict[str, float], total: float, delta: float,
                 last_ts: float, last_id: int = 0) -> None:
        self.streams, self.rounds, self.total, self.delta, self.last_ts = streams, rounds, total, delta, last_ts
        self.last_id = last_id

    @classmethod
    def load(cls, db: sqlite3.Connection, requests: Sequence["ReportRequest"], period: float | None,
             now: float) -> tuple["_Spent", int, int]:
        """(the spent sums, pending outbox rows, ``next_seq``): one statement, read in the batch's transaction."""
        streams = list(dict.fromkeys(r.stream for r in requests))
        rounds = list(dict.fromkeys(r.round_id for r in requests))
        if period is None:  # every charge counts: no window condition to compile (the statement is most of the cost)
            window, since, totals = "", [], ["SUM(epsilon)", "SUM(delta)"]
        else:
            window, since = " AND COALESCE(until, ts) >= ?", [now - period]  # the closed window [now − P, now]
            totals = [f"SUM(CASE WHEN COALESCE(until, ts) >= ? THEN {col} END)" for col in ("epsilon", "delta")]
        cols = [f"SUM(CASE WHEN stream = ?{window} THEN epsilon END)"] * len(streams)
        cols += ["SUM(CASE WHEN round_id = ? THEN epsilon END)"] * len(rounds)
        cols += [*totals, "MAX(ts)", "MAX(id)", _PENDING_SQL, _NEXT_SEQ_SQL]
        args: list[Any] = [a for s in streams for a in (s, *since)] + rounds + since * 2
        row = [0.0 if v is None else v for v in db.execute(f"SELECT {', '.join(cols)} FROM ledger", args).fetchone()]
        ns, nr = len(streams), len(rounds)
        spent = cls(dict(zip(streams, row[:ns])), dict(zip(rounds, row[ns:ns + nr])), row[ns + nr],
                    row[ns + nr + 1], max(now, row[ns + nr + 2]), int(row[ns + nr + 3]))
        return spent, int(row[-2]), int(row[-1])

    def check(self, stream: str, round_id: str, eps: float, stream_cap: float, total_cap: float,
              round_cap: float | None, delta: float, delta_cap: float | None) -> None:
        """Refuse a charge of ``eps`` (and ``delta``) that would exceed a cap (:class:`Refused`), by the one cap
        rule of :func:`protocols.accounting.check_cap` (basic composition within the window)."""
        try:
            check_cap("stream_cap", self.streams.get(stream, 0.0), eps, stream_cap, f"stream {stream!r}")
            check_cap("total_cap", self.total, eps, total_cap, "total", "total cap")
            check_cap("round_budget", self.rounds.get(round_id, 0.0), eps, round_cap, f"round {round_id!r}")
            check_delta_cap(self.delta, delta, delta_cap)  # Σ δ (window) + δ ≤ delta_cap; None refuses any δ > 0
        except BudgetExceededError as exc:
            raise Refused(exc.reason, exc.detail) from None

    def charge(self, stream: str, round_id: str, eps: float, delta: float) -> None:
        self.streams[stream] = self.streams.get(stream, 0.0) + eps
        self.rounds[round_id] = self.rounds.get(round_id, 0.0) + eps
        self.total += eps
        if delta > 0:
            self.delta += delta


class _Writes:
    """The rows one :meth:`State.commit_reports` batch writes, written together at its end (``executemany``)."""

    __slots__ = ("ledger", "memo", "memo_hits", "outbox", "states")

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}
        self.ledger: list[tuple[Any, ...]] = []
        self.memo: list[tuple[Any, ...]] = []
        self.memo_hits: list[str] = []
        self.outbox: list[tuple[Any, ...]] = []

    def flush(self, db: sqlite3.Connection, now: float) -> None:
        if self.ledger:
            db.executemany(
                "INSERT INTO ledger (ts, stream, round_id, epsilon, memo_key, seq, mechanism, delta, unit, until) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self.ledger)
        if self.memo:
            db.executemany(
                "INSERT INTO memo (key, stream, spec, body, epsilon, created, last_used) VALUES (?, ?, ?, ?, ?, ?, ?)",
                self.memo)
        if self.memo_hits:
            db.executemany("UPDATE memo SET hits = hits + 1, last_used = ? WHERE key = ?",
                           [(now, key) for key in self.memo_hits])
        if self.outbox:
            db.executemany(
                "INSERT INTO outbox (seq, topic, payload, status, stream, round_id, epsilon, memo_key, created) "
                "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)", self.outbox)
        if self.states:
            State._save_rounding(db, self.states)


class State:
    """The agent's SQLite database. Not thread-safe: use it from one thread (the agent's)."""

    def __init__(self, path: str | Path, timeout: float = 30.0, *, hosted: bool = False,
                 reattach: bool = False, transient: bool = False) -> None:
        """Open (creating or migrating) the database at ``path``.

        ``hosted``: one of many databases a single process keeps open (a gateway or simulation shard host,
        :class:`edge_agent.flower_app._OpenAgents`): ``locking_mode=EXCLUSIVE`` — this process is the database's
        only user while it is open, so the WAL index lives in process memory (no ``-shm`` file: 2 descriptors, no
        shared-memory mapping) — a page cache of :data:`HOSTED_CACHE_PAGES` pages, the WAL checkpointed into
        the database once it holds :data:`HOSTED_WAL_PAGES` pages and then truncated (memory on tmpfs), and a new
        database created with :data:`HOSTED_PAGE_SIZE`-byte pages (file, WAL and page cache a quarter of the
        default 4 KiB pages' for the same rows; an existing database keeps its page size). Durability
        is the same: WAL journal, ``synchronous=FULL``, one commit per device round. ``reattach``: the database
        was opened (created, its schema checked) by this process before and only its connection was closed (a
        suspended agent, :class:`edge_agent.flower_app._OpenAgents`): the directory and schema checks are skipped.
        ``transient`` (with ``hosted`` and ``reattach``): the connection serves one device round and is closed right
        after it, so only the settings that round's commit depends on are made — exclusive locking (before the WAL
        is opened) and ``synchronous=FULL``. The page-cache bound and the WAL's checkpoint and size limits matter only
        to a connection that stays open (a round writes a few pages; closing the connection checkpoints the WAL into
        the database and removes it), and the schema declares no foreign keys.
        """
        self.path = Path(path)
        #: pending outbox rows older than the last :meth:`commit_reports` batch (after its ``sent`` marks; None for
        #: a batch without requests): 0 means that batch's commits are all the outbox holds pending
        self.backlog: int | None = None
        #: the highest ledger row id after the last :meth:`commit_reports` batch when that batch read the ledger
        #: (it charged); None when it wrote no ledger row (the highest id is unchanged)
        self.ledger_max: int | None = None
        if not reattach:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False)
        transient = transient and hosted and reattach
        if hosted:
            if not reattach:  # takes effect on a new database only (before its first page is written)
                self._db.execute(f"PRAGMA page_size={HOSTED_PAGE_SIZE}")
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")  # before WAL mode: the WAL index in heap memory
            if not transient:
                self._db.execute(f"PRAGMA cache_size={HOSTED_CACHE_PAGES}")
                self._db.execute(f"PRAGMA wal_autocheckpoint={HOSTED_WAL_PAGES}")
                self._db.execute(f"PRAGMA journal_size_limit={HOSTED_WAL_PAGES * (HOSTED_PAGE_SIZE + 24)}")
        if not reattach:  # the journal mode is persistent: a database this process opened before is in WAL mode
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        if not transient:
            self._db.execute("PRAGMA foreign_keys=ON")
        if not reattach and self._schema_version() != SCHEMA_VERSION:  # a current database needs no write here
            self._create_schema()
            with self.transaction():
                cur = self._get("schema_version")
                if cur is None:
                    self._set("schema_version", SCHEMA_VERSION)
                elif int(cur) > SCHEMA_VERSION or int(cur) < 1:
                    raise RuntimeError(f"{self.path}: schema version {cur}, this agent understands {SCHEMA_VERSION}")
                elif int(cur) < SCHEMA_VERSION:
                    self._migrate(int(cur))

    def _schema_version(self) -> int | None:
        try:
            cur = self._get("schema_version")
        except sqlite3.OperationalError:  # no meta table yet: a new database
            return None
        try:
            return None if cur is None else int(cur)
        except (TypeError, ValueError):
            return None

    def _create_schema(self) -> None:
        """The tables, indexes and triggers (``IF NOT EXISTS``: idempotent) in ONE write transaction, with the
        schema version of a new database."""
        import secrets

        try:
            self._db.executescript(
                "BEGIN IMMEDIATE;\n" + _SCHEMA
                + f"\nINSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', {SCHEMA_VERSION});"
                + f"\nINSERT OR IGNORE INTO meta (key, value) VALUES ('ledger_id', '{secrets.token_hex(16)}');"
                + "\nCOMMIT;"
            )
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _migrate(self, version: int) -> None:
        """Upgrade a database of an older schema version in place (inside the caller's transaction).

        1 → 2: ``ledger.delta`` (nullable; existing charges are pure ε and keep NULL).
        2 → 3: ``ledger.unit`` (the privacy unit of the charge; every older charge was a per-value memo charge, so
        existing rows get ``value``) and ``ledger.until`` (the end of the time a charge covers; NULL = its ``ts``).
        3 → 4: the ledger's indexes on ``(stream, ts)`` and ``round_id`` are dropped. No statement of the agent
        used them (the caps are summed in one pass over the ledger, :class:`_Spent`), and every charge wrote two
        more B-tree entries (pages written to the WAL and checkpointed) and every connection parsed them.
        """
        cols = {row[1] for row in self._db.execute("PRAGMA table_info(ledger)").fetchall()}
        if version < 2 and "delta" not in cols:
            self._db.execute(
                "ALTER TABLE ledger ADD COLUMN delta REAL CHECK (delta IS NULL OR (delta > 0 AND delta < 1))"
            )
        if version < 3:
            if "unit" not in cols:
                self._db.execute("ALTER TABLE ledger ADD COLUMN unit TEXT NOT NULL DEFAULT 'value' "
                                 "CHECK (unit IN ('device', 'value'))")
            if "until" not in cols:
                self._db.execute("ALTER TABLE ledger ADD COLUMN until REAL")
        if version < 4:
            self._db.execute("DROP INDEX IF EXISTS ledger_stream_ts")
            self._db.execute("DROP INDEX IF EXISTS ledger_round")
        self._set("schema_version", SCHEMA_VERSION)

    # --- plumbing -----------------------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "State":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type: Any, *_: Any) -> None:
            if exc_type is None:
                self.db.execute("COMMIT")
            else:
                self.db.execute("ROLLBACK")

    def transaction(self) -> "State._Tx":
        """``with state.transaction():`` — one durable write transaction (BEGIN IMMEDIATE … COMMIT)."""
        return State._Tx(self._db)

    def _get(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def _set(self, key: str, value: Any) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def _add(self, key: str, delta: float) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value + excluded.value",
            (key, delta),
        )

    # --- counters -----------------------------------------------------------------------------------------

    def begin_boot(self, rounding: dict[str, dict[str, Any]] | None = None) -> int:
        """Increment and return the boot counter (call once at every start); ``rounding`` (the pipeline's state,
        when it drew new α offsets) is saved in the same transaction."""
        with self.transaction() as db:
            boot = int(self._get("boot", 0)) + 1
            self._set("boot", boot)
            if rounding:
                self._save_rounding(db, rounding)
        return boot

    @property
    def boot(self) -> int:
        return int(self._get("boot", 0))

    def mark(self) -> dict[str, Any]:
        """What the ledger has reached (:mod:`edge_agent.ledger_guard`): its id and the numbers that only grow."""
        row = self._db.execute(
            "SELECT (SELECT value FROM meta WHERE key = 'ledger_id'), (SELECT value FROM meta WHERE key = 'boot'), "
            "(SELECT value FROM meta WHERE key = 'next_seq'), (SELECT COALESCE(MAX(id), 0) FROM ledger), "
            "(SELECT COALESCE(SUM(epsilon), 0) FROM ledger), (SELECT COUNT(*) FROM resets)"
        ).fetchone()
        return {"ledger_id": row[0], "boot": int(row[1] or 0), "next_seq": int(row[2] or 0),
                "ledger_rows": int(row[3]), "spent_total": float(row[4]), "resets": int(row[5])}

    def ledger_rows_max(self) -> int:
        """The highest ledger row id (rows are append-only, ids never reused: AUTOINCREMENT)."""
        return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM ledger").fetchone()[0])

    def record_reset(self, record: dict[str, Any]) -> None:
        """A new ledger started on purpose (``haarvest agent reset-ledger``): continue ``next_seq`` and ``boot``
        from ``record`` and keep the record (append-only ``resets`` table), in one transaction."""
        with self.transaction() as db:
            self._set("next_seq", max(self.next_seq, int(record["next_seq"])))
            self._set("boot", max(self.boot, int(record["boot"])))
            db.execute("INSERT INTO resets (ts, record) VALUES (?, ?)",
                       (float(record["ts"]), json.dumps(record, sort_keys=True)))

    def resets(self) -> list[dict[str, Any]]:
        return [json.loads(r) for (r,) in self._db.execute("SELECT record FROM resets ORDER BY id").fetchall()]

    @property
    def next_seq(self) -> int:
        return int(self._get("next_seq", 0))

    def bump(self, counters: dict[str, int]) -> None:
        """Add to status counters in one transaction (refusals, invalid records, clipping)."""
        if not counters:
            return
        with self.transaction():
            for k, v in counters.items():
                self._add(f"count.{k}", int(v))

    def save_link(self, state: str, since: float, reason: str) -> None:
        """Record the broker link's state (``connected`` / ``disconnected`` / ``connecting`` / ``stopped``), since
        when, and why — for ``agent status``, which runs in another process."""
        with self.transaction():
            self._set("link.state", state)
            self._set("link.since", float(since))
            self._set("link.reason", reason)

    def link(self) -> dict[str, Any] | None:
        """The broker link as last recorded by :meth:`save_link` (None if never)."""
        state = self._get("link.state")
        if state is None:
            return None
        return {"state": state, "since": float(self._get("link.since", 0.0)), "reason": self._get("link.reason", "")}

    def counters(self) -> dict[str, int]:
        rows = self._db.execute("SELECT key, value FROM meta WHERE key LIKE 'count.%' ORDER BY key").fetchall()
        return {k[len("count.") :]: int(v) for k, v in rows}

    # --- the report transaction ---------------------------------------------------------------------------

    def commit_reports(
        self,
        requests: list["ReportRequest"],
        *,
        total_cap: float,
        renewal_period_s: float | None,
        max_pending: int,
        counters: dict[str, int] | None = None,
        now: float | None = None,
        delta_cap: float | None = None,
        round_record: tuple[str, str, str] | None = None,
        rounding: dict[str, dict[str, Any]] | None = None,
        sent: Sequence[int] = (),
    ) -> list["Commit | Refused"]:
        """Charge (or reuse), record and enqueue reports atomically — ONE transaction for the whole device round.

        Before the reports, in the same transaction: outbox rows ``sent`` are marked sent (reports an earlier reply
        carried; :meth:`mark_sent`), ``round_record = (round_id, status, detail)`` is written (:meth:`record_round`),
        ``rounding`` is saved (:meth:`save_rounding`) and ``counters`` are added.

        For each request: refuse if the outbox holds ``max_pending`` pending rows; look the memo key up (hit: reuse
        the stored body — or, with ``refresh``, a fresh ``make_body()`` such as a longitudinal protocol's new IRR of
        its memoized PRR — charge 0); on a miss check the caps (stream, total, round; and ``delta_cap`` for a
        request with δ > 0) and call ``make_body()`` (privatize); ``make_payload(seq, body)`` signs the report. Only
        then are the ledger charge (ε, and δ when positive), the memo entry, the outbox row and ``next_seq``
        written: a refused request (:class:`Refused` from a check or from ``make_payload``) has written nothing
        but its ``refused_<reason>`` counter, and the others go on. The batch commits once (one fsync); a crash at
        any point leaves all of it or none of it. Any other exception rolls the whole transaction back and
        propagates.
        """
        now = time.time() if now is None else now
        results: list[Commit | Refused] = []
        with self.transaction() as db:
            if sent:
                self._mark(db, sent, "sent", now)
            if round_record is not None:
                self._record_round(db, *round_record, now=now)
            if rounding:
                self._save_rounding(db, rounding)
            added: Counter[str] = Counter({f"count.{k}": int(v) for k, v in (counters or {}).items()})
            self.backlog = None
            self.ledger_max = None
            if requests:
                keys = [r.memo_key for r in requests if r.memoize]
                memo: dict[str, str] = {}
                if keys:
                    marks = ",".join("?" * len(keys))
                    memo = dict(db.execute(f"SELECT key, body FROM memo WHERE key IN ({marks})", keys).fetchall())
                budget: _Spent | None = None
                if any(not r.memoize or r.memo_key not in memo for r in requests):
                    # a request will charge: sum the ledger once for the batch (the outbox count and next_seq in
                    # the same statement)
                    budget, pending, seq = _Spent.load(db, requests, renewal_period_s, now)
                else:  # memo hits only: the ledger is not read
                    pending, seq = db.execute(f"SELECT {_PENDING_SQL}, {_NEXT_SEQ_SQL}").fetchone()
                    pending, seq = int(pending), int(seq or 0)
                self.backlog = pending
                writes = _Writes()
                for req in requests:
                    body_text = memo.get(req.memo_key) if req.memoize else None
                    try:
                        commit = self._commit_one(req, seq, pending, body_text, budget, total_cap, max_pending, now,
                                                  delta_cap, writes, memo)
                    except Refused as exc:
                        added[f"count.refused_{exc.reason}"] += 1
                        results.append(exc)
                        continue
                    results.append(commit)
                    seq += 1
                    pending += 1
                    added["count.memo_hits" if commit.memo_hit else "count.charged_reports"] += 1
                    added["next_seq"] += 1
                writes.flush(db, now)
                if budget is not None:  # ledger ids are append-only and never reused (AUTOINCREMENT, no deletes)
                    self.ledger_max = budget.last_id + len(writes.ledger)
            if added:
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = value + excluded.value",
                    list(added.items()),
                )
        return results

    def _commit_one(
        self,
        req: "ReportRequest",
        seq: int,
        pending: int,
        memo_body: str | None,
        budget: "_Spent | None",
        total_cap: float,
        max_pending: int,
        now: float,
        delta_cap: float | None,
        writes: "_Writes",
        memo: dict[str, str],
    ) -> Commit:
        """One report of :meth:`commit_reports`: every check (and ``make_body``/``make_payload``) first; then its
        rows are queued in ``writes`` and its charge in ``budget`` — a :class:`Refused` leaves nothing behind."""
        if pending >= max_pending:
            raise Refused("outbox_full", f"{pending} reports await acknowledgement (max {max_pending})")
        hit = memo_body is not None
        delta = float(req.delta)
        ts = now
        charged = memo_charge(req.epsilon, memo_hit=hit)
        if hit:
            body = req.make_body() if req.refresh else json.loads(memo_body)  # type: ignore[arg-type]
        else:
            assert budget is not None
            budget.check(req.stream, req.round_id, charged, req.stream_cap, total_cap, req.round_cap, delta,
                         delta_cap)
            ts = budget.last_ts
            body = req.make_body()
        topic, payload = req.make_payload(seq, body)  # may refuse (too_large): nothing is queued yet
        if hit:
            writes.memo_hits.append(req.memo_key)
        elif charged > 0 or delta > 0:  # a change-bounded tree past its budget charges 0: no ledger row
            budget.charge(req.stream, req.round_id, charged, delta)  # type: ignore[union-attr]
            writes.ledger.append((ts, req.stream, req.round_id, charged, req.memo_key, seq, req.mechanism,
                                  delta if delta > 0 else None, req.unit, req.until))
            if req.memoize:
                text = json.dumps(body, sort_keys=True)
                writes.memo.append((req.memo_key, req.stream, req.spec, text, charged, now, now))
                memo[req.memo_key] = text  # a later request of the batch with this key is a memo hit
        writes.outbox.append((seq, topic, payload, req.stream, req.round_id, charged, req.memo_key, now))
        if req.state is not None:
            writes.states[req.state[0]] = req.state[1]
        return Commit(seq=seq, topic=topic, payload=payload, charged=charged, memo_hit=hit, body=body)


    # --- outbox -------------------------------------------------------------------------------------------

    def pending(self, after_seq: int = -1, limit: int = 100) -> list[OutboxRow]:
        """Pending reports with ``seq > after_seq`` in sequence order."""
        rows = self._db.execute(
            "SELECT seq, topic, payload FROM outbox WHERE status = 'pending' AND seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()
        return [OutboxRow(int(s), t, bytes(p)) for s, t, p in rows]

    def pending_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outbox WHERE status = 'pending'").fetchone()[0])

    def mark_sent(self, seqs: list[int], status: str = "sent", now: float | None = None) -> int:
        """Mark outbox rows acknowledged (payload dropped: the broker has it). Returns rows changed."""
        if not seqs:
            return 0
        if status not in ("sent", "rejected"):
            raise ValueError(f"status must be sent or rejected, got {status!r}")
        now = time.time() if now is None else now
        with self.transaction() as db:
            return self._mark(db, seqs, status, now)

    @staticmethod
    def _mark(db: sqlite3.Connection, seqs: Sequence[int], status: str, now: float) -> int:
        n = 0
        ids = sorted({int(s) for s in seqs})
        for i in range(0, len(ids), 500):  # one statement per ≤ 500 rows (SQLite's bound-parameter limit)
            part = ids[i:i + 500]
            n += db.execute(
                # "+status": look the rows up by primary key, not through the (status, seq) index being updated
                f"UPDATE outbox SET status = ?, sent_at = ?, payload = NULL "
                f"WHERE seq IN ({','.join('?' * len(part))}) AND +status = 'pending'",
                (status, now, *part),
            ).rowcount
        return n

    def compact(self, keep_sent: int) -> int:
        """Fold all but the newest ``keep_sent`` sent/rejected outbox rows into ``compacted_*`` totals."""
        with self.transaction() as db:
            rows = db.execute(
                "SELECT seq, epsilon FROM outbox WHERE status != 'pending' ORDER BY seq DESC LIMIT -1 OFFSET ?",
                (keep_sent,),
            ).fetchall()
            if not rows:
                return 0
            self._add("compacted_count", len(rows))
            self._add("compacted_epsilon", float(sum(e for _, e in rows)))
            db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s, _ in rows])
        return len(rows)

    # --- rounding state and rounds ------------------------------------------------------------------------

    def load_rounding(self) -> dict[str, dict[str, Any]]:
        return {d: json.loads(s) for d, s in self._db.execute("SELECT dim, state FROM rounding").fetchall()}

    def save_rounding(self, states: dict[str, dict[str, Any]]) -> None:
        with self.transaction() as db:
            self._save_rounding(db, states)

    @staticmethod
    def _save_rounding(db: sqlite3.Connection, states: dict[str, dict[str, Any]]) -> None:
        db.executemany(
            "INSERT INTO rounding (dim, state) VALUES (?, ?) ON CONFLICT(dim) DO UPDATE SET state = excluded.state",
            [(d, json.dumps(s, sort_keys=True)) for d, s in states.items()],
        )

    def round_seen(self, round_id: str) -> str | None:
        row = self._db.execute("SELECT status FROM rounds WHERE round_id = ?", (round_id,)).fetchone()
        return None if row is None else row[0]

    def record_round(self, round_id: str, status: str, detail: str = "", now: float | None = None) -> None:
        with self.transaction() as db:
            self._record_round(db, round_id, status, detail, now=now)

    @staticmethod
    def _record_round(db: sqlite3.Connection, round_id: str, status: str, detail: str = "",
                      now: float | None = None) -> None:
        db.execute(
            "INSERT INTO rounds (round_id, received, status, detail) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(round_id) DO UPDATE SET status = excluded.status, detail = excluded.detail",
            (round_id, time.time() if now is None else now, status, detail),
        )

    # --- inspection ---------------------------------------------------------------------------------------

    def ledger_rows(self, stream: str | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
        sql = "SELECT id, ts, stream, round_id, epsilon, memo_key, seq, mechanism, delta, unit, until FROM ledger"
        args: list[Any] = []
        if stream:
            sql += " WHERE stream = ?"
            args.append(stream)
        sql += " ORDER BY id DESC"
        if limit:
            sql += " LIMIT ?"
            args.append(int(limit))
        cols = ("id", "ts", "stream", "round_id", "epsilon", "memo_key", "seq", "mechanism", "delta", "unit", "until")
        rows = self._db.execute(sql, args).fetchall()
        for row in reversed(rows):
            yield dict(zip(cols, row))

    def spent(self, stream: str | None = None, since: float | None = None) -> float:
        """Σ ε of the ledger's charges (of ``stream``) at or after ``since`` (None: all)."""
        sql = "SELECT COALESCE(SUM(epsilon), 0) FROM ledger WHERE COALESCE(until, ts) >= ?"
        args: list[Any] = [since if since is not None else -1e300]
        if stream is not None:
            sql += " AND stream = ?"
            args.append(stream)
        return float(self._db.execute(sql, args).fetchone()[0])

    def spent_delta(self, since: float | None = None) -> float:
        """Σ δ of the ledger's (ε, δ) charges (at or after ``since``)."""
        row = self._db.execute("SELECT COALESCE(SUM(delta), 0) FROM ledger WHERE COALESCE(until, ts) >= ?",
                               (since if since is not None else -1e300,)).fetchone()
        return float(row[0])

    def spent_by_unit(self) -> dict[str, float]:
        """Σ ε of the ledger per privacy unit (``device``, ``value``)."""
        rows = self._db.execute("SELECT unit, SUM(epsilon) FROM ledger GROUP BY unit ORDER BY unit").fetchall()
        return {u: float(e) for u, e in rows}

    def spent_by_stream(self) -> dict[str, float]:
        rows = self._db.execute("SELECT stream, SUM(epsilon) FROM ledger GROUP BY stream ORDER BY stream").fetchall()
        return {s: float(e) for s, e in rows}

    def outbox_totals(self) -> dict[str, Any]:
        rows = self._db.execute(
            "SELECT status, COUNT(*), COALESCE(SUM(epsilon), 0) FROM outbox GROUP BY status"
        ).fetchall()
        out: dict[str, Any] = {s: {"count": int(c), "epsilon": float(e)} for s, c, e in rows}
        out["compacted"] = {
            "count": int(self._get("compacted_count", 0)),
            "epsilon": float(self._get("compacted_epsilon", 0.0)),
        }
        return out

    def check_invariants(self) -> dict[str, Any]:
        """Ledger total versus the ε of every report ever enqueued (pending, sent, rejected, compacted)."""
        ledger_total = self.spent()
        outbox = self.outbox_totals()
        reports_total = sum(v["epsilon"] for v in outbox.values())
        orphan = self._db.execute(
            "SELECT COUNT(*) FROM ledger l WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.seq = l.seq) "
            "AND l.seq >= (SELECT COALESCE(MIN(seq), 0) FROM outbox)"
        ).fetchone()[0]
        return {
            "ledger_total": ledger_total,
            "reports_total": reports_total,
            "orphan_charges": int(orphan),
            "ok": abs(ledger_total - reports_total) <= 1e-9 * max(1.0, ledger_total) and orphan == 0,
        }

    def integrity_check(self, quick: bool = False) -> list[str]:
        """``PRAGMA integrity_check`` (``quick_check`` with ``quick``: O(N), no index cross-checks): ``["ok"]`` for a
        sound database."""
        return [r[0] for r in self._db.execute(f"PRAGMA {'quick_check' if quick else 'integrity_check'}").fetchall()]

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "boot": self.boot,
            "next_seq": self.next_seq,
            "spent_total": self.spent(),
            "spent_delta": self.spent_delta(),
            "spent_by_stream": self.spent_by_stream(),
            "spent_by_unit": self.spent_by_unit(),
            "outbox": self.outbox_totals(),
            # reports not yet receipted by the coordinator (it has not confirmed storing them): they are re-sent
            "pending_reports": self.pending_count(),
            "link": self.link(),
            "memo_entries": int(self._db.execute("SELECT COUNT(*) FROM memo").fetchone()[0]),
            "counters": self.counters(),
            "rounds": dict(self._db.execute("SELECT status, COUNT(*) FROM rounds GROUP BY status").fetchall()),
            "ledger_resets": self.resets(),
        }
