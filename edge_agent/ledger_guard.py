"""The ledger cannot be silently reset: a monotonic mark outside the database, checked at every start.

A device's privacy ledger lives in its SQLite database. Deleting or truncating that file, losing its ``-wal`` file
or restoring an older copy would make the agent start again with an empty (or smaller) ledger and a full budget.
To make that impossible without a word, the agent keeps a small **mark** file beside the database
(``<state_dir>/ledger.mark``, JSON, replaced atomically: write, fsync, rename, fsync of the directory) holding
what the ledger had reached after the last committed device round:

* ``ledger_id`` — a random id drawn when the database was created (in its ``meta`` table);
* ``boot``, ``next_seq``, ``ledger_rows`` (the highest ledger row id; rows are append-only) and ``spent_total``;
* ``mac`` — HMAC-SHA256 of the rest under a key derived from the device's secret (:func:`mark_key`), so a mark
  written by hand (a "never used" one beside a deleted database) is refused.

All four numbers only grow. The mark is written *after* each commit, so after a crash it can lag the database but
never lead it. At start (:func:`check_ledger`, before the database is opened or created) the agent refuses to run —
:class:`LedgerIntegrityError`, one line, ``haarvest agent run`` exits 2 — when

* the device identity (its key files) or a mark exists but the database is missing or empty;
* the database's ``ledger_id`` differs from the mark's (another ledger was put in its place);
* any of the database's numbers is smaller than the mark's (an older copy, a lost ``-wal`` file, a truncation);
* the database fails SQLite's ``quick_check`` or the ledger/outbox invariant.

An operator who really means to start a new ledger runs ``haarvest agent reset-ledger --yes``
(:func:`reset_ledger`): the old database is kept aside (never deleted), the new one continues the sequence numbers
and boot counter (so the coordinator sees no sequence regression) and records the reset in its ``resets`` table;
the reset is also appended to ``<state_dir>/ledger.resets`` (JSON lines, outside the database) and counted in the
mark. A restore of the *whole* state directory (database and mark together) cannot be seen on the device; the
coordinator flags the sequence regression it causes (``seq_regression``, counted per device).
"""

from __future__ import annotations

import hmac
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from protocols.errors import LedgerIntegrityError

__all__ = ["LedgerIntegrityError", "MARK_NAME", "RESETS_NAME", "read_mark", "load_mark", "mark_key", "write_mark",
           "start_mark", "check_ledger", "compare", "reset_ledger"]

MARK_NAME = "ledger.mark"
RESETS_NAME = "ledger.resets"
#: the mark's monotonic numbers, in the order they are compared
MONOTONIC = ("boot", "next_seq", "ledger_rows", "spent_total")


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_key(hmac_secret: bytes) -> bytes:
    """The key that authenticates the mark: ``HMAC-SHA256(device secret, "haarvest/ledger-mark/v1")`` (the memo HMAC
    secret, which never leaves the device; domain-separated from the memo keys)."""
    return hmac.digest(hmac_secret, b"haarvest/ledger-mark/v1", "sha256")


def _mac(key: bytes, mark: dict[str, Any]) -> str:
    body = {k: v for k, v in mark.items() if k != "mac"}
    return hmac.digest(key, json.dumps(body, sort_keys=True).encode(), "sha256").hex()


def load_mark(state_dir: Path, key: bytes | None = None) -> tuple[dict[str, Any] | None, bool]:
    """``(mark without its "mac", authenticated)``; ``(None, False)`` if there is none. LedgerIntegrityError if it
    is unreadable, or if it carries a MAC that ``key`` does not verify (forged, or another device's)."""
    path = Path(state_dir) / MARK_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        raise LedgerIntegrityError(f"cannot read the ledger mark {path}: {exc.strerror or exc}") from None
    try:
        mark = json.loads(text)
        if not isinstance(mark, dict) or not all(isinstance(mark.get(k), (int, float)) for k in MONOTONIC):
            raise ValueError("missing fields")
    except ValueError:
        raise LedgerIntegrityError(f"the ledger mark {path} is corrupt; restore it or run "
                                   f"`haarvest agent reset-ledger --yes` to start a recorded new ledger") from None
    mac = mark.pop("mac", None)
    authenticated = False
    if key is not None and mac is not None:
        if not (isinstance(mac, str) and hmac.compare_digest(mac, _mac(key, mark))):
            raise LedgerIntegrityError(f"the ledger mark {path} fails its authentication (written by hand, or not this "
                                       f"device's); restore it or run `haarvest agent reset-ledger --yes` to start a "
                                       f"recorded new ledger")
        authenticated = True
    return mark, authenticated


def read_mark(state_dir: Path) -> dict[str, Any] | None:
    """The mark file's content (without its MAC), or None if there is none. LedgerIntegrityError if unreadable."""
    return load_mark(state_dir)[0]


def write_mark(state_dir: Path, mark: dict[str, Any], key: bytes | None = None) -> None:
    """Replace the mark atomically and durably (temporary file, fsync, rename, fsync of the directory), with its MAC
    under ``key`` (:func:`mark_key`) when given."""
    directory = os.fspath(state_dir)
    tmp = os.path.join(directory, MARK_NAME + ".tmp")
    body = {k: v for k, v in mark.items() if k != "mac"}
    if key is not None:
        body["mac"] = _mac(key, body)
    data = (json.dumps(body, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, MARK_NAME))
    _fsync_dir(directory)


def start_mark(state_dir: Path, key: bytes | None = None) -> None:
    """The mark of a device whose ledger does not exist yet (written, authenticated, when its identity is created)."""
    Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    write_mark(state_dir, {"ledger_id": None, "boot": 0, "next_seq": 0, "ledger_rows": 0, "spent_total": 0.0,
                           "resets": 0}, key)


def _reset_hint(db: Path) -> str:
    return (f"if the ledger was lost or replaced on purpose, run `haarvest agent reset-ledger --yes` "
            f"(recorded; the old database is kept) — state {db.parent}")


def check_ledger(database: Path, identity_exists: bool, key: bytes | None = None) -> dict[str, Any] | None:
    """Refuse to start on a missing, older, foreign or inconsistent ledger (:class:`LedgerIntegrityError`).

    Call it *before* opening the database (opening creates one). Returns the mark (None if there is none yet).
    With the device's mark ``key`` (:func:`mark_key`) and its identity on disk, a mark whose MAC fails is refused, and a mark without one is
    trusted only beside an existing database that :func:`compare` then checks (a mark from before marks were
    authenticated): a missing database with an unauthenticated mark — a hand-written "never used" mark — is refused.
    The numbers themselves are compared by :func:`compare`, once the database is open.
    """
    database = Path(database)
    # an identity held in memory (embedded agents) can change between runs on one state directory: no stable key to
    # verify with (the coordinator's witness covers those devices); an identity on disk keys the mark
    mark, authenticated = load_mark(database.parent, key if identity_exists else None)
    db_ok = database.exists() and database.stat().st_size > 0
    if db_ok:
        return mark
    if mark is not None and key is not None and identity_exists and not authenticated:
        raise LedgerIntegrityError(f"the ledger database {database} is missing and the device's mark carries no "
                                   f"authentication (written by hand?); " + _reset_hint(database))
    if mark is not None and (mark.get("ledger_id") is not None or any(mark[k] > 0 for k in MONOTONIC)):
        raise LedgerIntegrityError(f"the ledger database {database} is missing or empty but the device's mark says it "
                                   f"had reached seq {int(mark['next_seq'])} and ε {mark['spent_total']:.6g}; "
                                   + _reset_hint(database))
    if mark is None and identity_exists:
        raise LedgerIntegrityError(f"the ledger database {database} is missing but the device identity exists and "
                                   f"no ledger mark was ever written; " + _reset_hint(database))
    return mark


def compare(state: Any, mark: dict[str, Any] | None, identity_exists: bool = False) -> None:
    """The open database against the mark: same ledger, no number smaller, sound (LedgerIntegrityError). A device
    with an identity on disk and no mark must have a ledger with history (an empty database put beside an identity
    whose mark was deleted gave a full budget again)."""
    db = Path(state.path)
    check = state.integrity_check(quick=True)
    if check != ["ok"]:
        raise LedgerIntegrityError(f"the ledger database {db} is damaged ({check[0]}); " + _reset_hint(db))
    inv = state.check_invariants()
    if not inv["ok"]:
        raise LedgerIntegrityError(f"the ledger database {db} is inconsistent (ledger ε {inv['ledger_total']:.6g} vs "
                                   f"reports ε {inv['reports_total']:.6g}); " + _reset_hint(db))
    now = state.mark()
    if mark is None:
        if identity_exists and now["ledger_rows"] == 0 and now["next_seq"] == 0:
            raise LedgerIntegrityError(f"the ledger database {db} is empty, the device identity exists and its ledger "
                                       f"mark is gone; " + _reset_hint(db))
        return
    if mark.get("ledger_id") is not None and mark["ledger_id"] != now["ledger_id"]:
        raise LedgerIntegrityError(f"the ledger database {db} is not the device's ledger (id {now['ledger_id']}, "
                                   f"the mark says {mark['ledger_id']}); " + _reset_hint(db))
    for key in MONOTONIC:
        if now[key] < mark[key] - (1e-9 * max(1.0, abs(mark[key])) if key == "spent_total" else 0):
            raise LedgerIntegrityError(f"the ledger database {db} is older than the device's last state ({key} "
                                       f"{now[key]:.6g} < {mark[key]:.6g}: a restored copy or a lost -wal file?); "
                                       + _reset_hint(db))


def reset_ledger(database: Path, *, reason: str = "", next_seq: int | None = None, now: float | None = None,
                 key: bytes | None = None) -> dict[str, Any]:
    """Start a new, recorded ledger: keep the old database aside, continue ``next_seq`` and ``boot`` (the larger of
    the old database's, the mark's and ``next_seq``), record the reset in the new database, in
    ``ledger.resets`` and in the mark. Returns the reset record."""
    from .state import State

    database = Path(database)
    state_dir = database.parent
    now = time.time() if now is None else now
    mark = None
    try:
        mark = read_mark(state_dir)
    except LedgerIntegrityError:
        pass
    old: dict[str, Any] = {}
    if database.exists() and database.stat().st_size > 0:
        try:
            with State(database) as st:
                old = st.mark()
        except (sqlite3.DatabaseError, RuntimeError):
            old = {}
    seq = max(int(old.get("next_seq", 0)), int((mark or {}).get("next_seq", 0)), int(next_seq or 0))
    boot = max(int(old.get("boot", 0)), int((mark or {}).get("boot", 0)))
    resets = int((mark or {}).get("resets", 0)) + 1
    kept = None
    if database.exists():
        kept = database.with_name(f"{database.name}.reset-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(database) + suffix)
            if src.exists():
                os.replace(src, Path(str(kept) + suffix))
    record = {"ts": now, "reason": reason, "old_ledger_id": old.get("ledger_id") or (mark or {}).get("ledger_id"),
              "old_spent_total": old.get("spent_total", (mark or {}).get("spent_total")), "next_seq": seq,
              "boot": boot, "kept": str(kept) if kept else None, "resets": resets}
    with State(database) as st:
        st.record_reset(record)
        new_mark = st.mark()
    with open(state_dir / RESETS_NAME, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    write_mark(state_dir, {**new_mark, "resets": resets}, key)
    return record
