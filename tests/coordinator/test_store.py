"""The store's device registry: batch enrolment (:meth:`coordinator.store.Store.add_devices`) on SQLite and
PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest

from coordinator.simfleet import SimFleet
from coordinator.store import PostgresStore, SQLiteStore, Store

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
