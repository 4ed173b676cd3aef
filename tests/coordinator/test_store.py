"""The store's device registry: batch enrolment (:meth:`coordinator.store.Store.add_devices`) on SQLite and
PostgreSQL; replay high-water marks read from the stored reports, and the reports' layout."""

from __future__ import annotations

import sqlite3

import pytest

from coordinator.simfleet import SimFleet
from coordinator.store import PostgresStore, SQLiteStore, Store, StoredReport

pytestmark = pytest.mark.integration


def _check_add_devices(store: Store, integrity_error: type[Exception]) -> None:
    fleet = SimFleet(5, signature="hmac-sha256")
    pairs = [(d.device_id, d.public_key) for d in fleet.devices]
    store.upsert_device(pairs[0][0], "old-key", contract={"cpu": "duchi"})
    assert store.add_devices(iter(pairs)) == 5  # any iterable, counted
    records = store.device_records()
    assert {d: (r["public_key"], r["status"]) for d, r in records.items()} == {d: (k, "active") for d, k in pairs}
    assert records[pairs[0][0]]["contract"] == {"cpu": "duchi"}  # KEEP: an enrolled device keeps its contract
    assert records[pairs[1][0]]["contract"] is None
    assert store.add_devices(pairs[:2], status="revoked", contract=None) == 2  # what upsert_device does to each
    assert store.device_statuses() == {pairs[0][0]: "revoked", pairs[1][0]: "revoked"}
    assert store.device_records()[pairs[0][0]]["contract"] is None
    with pytest.raises(ValueError):
        store.add_devices(pairs, status="gone")
    # one transaction: a failing row leaves none of the batch behind
    with pytest.raises(integrity_error):
        store.add_devices([("new-1", "k1"), ("new-2", None)])  # public_key is NOT NULL
    assert "new-1" not in store.devices()
    assert store.add_devices([]) == 0


def test_add_devices_sqlite(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    try:
        _check_add_devices(store, sqlite3.IntegrityError)
    finally:
        store.close()


def test_add_devices_postgres(postgres_dsn):
    import psycopg

    store = PostgresStore(postgres_dsn)
    try:
        _check_add_devices(store, psycopg.IntegrityError)
    finally:
        store.close()


def _report(device: str, seq: int, stream: str) -> StoredReport:
    return StoredReport(device, seq, 1, "r1", stream, "oue", '{"r":[0,1]}', f"sig-{device}-{seq}", 1.0)


def _check_high_water(store: Store) -> None:
    assert store.high_water_marks() == {}
    store.commit_batch([_report("a", 3, "s1"), _report("a", 7, "s2"), _report("b", 2, "s1")], {})
    store.commit_batch([_report("a", 5, "s3"), _report("b", 4, "s2")], {})
    assert store.high_water_marks() == {"a": 7, "b": 4}  # each device's largest stored seq, whatever the order
    assert store.commit_batch([_report("a", 9, "s1")], {}) == 0  # a second report of (r1, s1): not stored
    assert store.high_water_marks() == {"a": 7, "b": 4}
    assert store.counters() == {"accepted": 5, "duplicate": 1}


def test_high_water_marks_sqlite(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    try:
        _check_high_water(store)
        tables = {r[0] for r in store._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "high_water" not in tables  # one row per report, no second per-device row to update
    finally:
        store.close()


def test_old_layout_keeps_working(tmp_path):
    """A database made by an older version (a high_water table, UNIQUE (device_id, round_id, stream) and a
    (round_id, stream) index) opens, stores and answers as a new one."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE reports (device_id TEXT NOT NULL, seq BIGINT NOT NULL, boot BIGINT NOT NULL,
            round_id TEXT NOT NULL, stream TEXT NOT NULL, mechanism TEXT NOT NULL, body TEXT NOT NULL,
            sig TEXT NOT NULL, received_at DOUBLE PRECISION NOT NULL, UNIQUE (device_id, seq),
            UNIQUE (device_id, round_id, stream));
        CREATE INDEX reports_by_round ON reports (round_id, stream);
        CREATE TABLE high_water (device_id TEXT PRIMARY KEY, seq BIGINT NOT NULL);""")
    conn.close()
    store = SQLiteStore(path)
    try:
        _check_high_water(store)
        assert store.report_counts("r1") == {("r1", "s1"): 2, ("r1", "s2"): 2, ("r1", "s3"): 1}
    finally:
        store.close()


def test_high_water_marks_postgres(postgres_dsn):
    store = PostgresStore(postgres_dsn)
    try:
        _check_high_water(store)
    finally:
        store.close()
