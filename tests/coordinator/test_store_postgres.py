"""The PostgreSQL store behind the same interface: a throwaway server (``postgres_dsn``, tests/conftest.py)."""

from __future__ import annotations

import pytest

from coordinator.estimate import estimate_round
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimFleet
from coordinator.store import PostgresStore, open_store
from coordinator.validate import Validator
from protocols import catalogue, wire

pytestmark = pytest.mark.integration

PARAMS = {"streams": {"cpu": {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 1.0}, "dims": ["cpu"],
                              "bounds": [[0, 1]]}}}


def test_postgres_store_two_workers(postgres_dsn):
    store = open_store(postgres_dsn)
    assert isinstance(store, PostgresStore)
    fleet = SimFleet(20)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 1.0, PARAMS)
    other = PostgresStore(postgres_dsn)  # a second worker with its own connection and validator
    v1, v2 = Validator(store), Validator(other)
    reports = fleet.reports("r1", "cpu", "duchi", [i % 2 for i in range(20)],
                            catalogue.build("duchi", epsilon=1.0))
    # both workers receive the first 10 (a race): rows are stored once
    assert store.commit_batch([v1.check(t, p) for t, p in reports[:10]], {}) == 10
    assert other.commit_batch([v2.check(t, p) for t, p in reports[:10]], {"malformed": 2}) == 0
    assert other.commit_batch([v2.check(t, p) for t, p in reports[10:]], {}) == 10
    v1.batch_committed()
    with pytest.raises(wire.WireError) as err:  # worker 1 stored this one itself
        v1.check(*reports[5])
    assert err.value.reason == "duplicate"
    # worker 1's cache never saw what worker 2 stored: the database constraint makes it a no-op
    assert store.commit_batch([v1.check(*reports[15])], {}) == 0
    assert store.counters() == {"accepted": 20, "duplicate": 11, "malformed": 2}  # rows dropped as stored
    assert store.high_water_marks()[fleet.devices[0].device_id] == 1
    assert store.report_counts() == {("r1", "cpu"): 20}
    est = estimate_round(store, "r1")["cpu"]
    assert est.n == 20 and est.error is None
    # a round opened through one connection is found by the other worker's validator at its first report
    RoundManager(store, wire.generate_signing_key()).open_round("r2", 1.0, PARAMS)
    assert v2.check(*fleet.devices[0].report("r2", "cpu", "duchi", {"report": 1})).round_id == "r2"
    store.set_round_status("r1", "closed")
    assert other.rounds()[0]["status"] == "closed"
    assert other.round("r1")["status"] == "closed" and other.round("nope") is None
    store.close()
    other.close()


def test_postgres_store_recovers_from_a_failed_statement_and_a_dropped_connection(postgres_dsn):
    """A failed statement is rolled back (PostgreSQL would refuse every later one in the aborted transaction) and
    a connection the server dropped is reopened: the ingest's retry of a batch can then succeed."""
    import psycopg

    store = PostgresStore(postgres_dsn)
    with pytest.raises(psycopg.Error):
        store._exec("SELECT no_such_function()")
    assert isinstance(store.high_water_marks(), dict)  # the next statement runs
    killer = PostgresStore(postgres_dsn)
    pid = store._exec("SELECT pg_backend_pid()")[0][0]
    killer._exec("SELECT pg_terminate_backend(?)", (pid,))
    with pytest.raises(psycopg.Error):  # the statement that meets the dropped connection fails ...
        store.high_water_marks()
    assert isinstance(store.high_water_marks(), dict)  # ... and the next one reconnects
    store.close()
    killer.close()


def test_postgres_two_workers_keep_aggregates_that_merge_and_never_double_count(postgres_dsn):
    """Two ingest workers race on overlapping batches (threads, one connection each): the round's aggregates are
    the sum of their two writer rows, count every report once, give the estimate the stored reports give, and
    survive a rebuild (which holds off writers with a table lock)."""
    import threading

    import numpy as np

    from coordinator.aggregates import check_aggregates
    from coordinator.decode import StreamDecoder
    from coordinator.estimate import estimate_stream
    from protocols.contract import StreamSpec

    workers = [PostgresStore(postgres_dsn), PostgresStore(postgres_dsn)]
    fleet = SimFleet(60, prefix="agg")
    for rec in fleet.enrollment():
        workers[0].upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(workers[0], wire.generate_signing_key()).open_round("agg", 1.0, PARAMS)
    validators = [Validator(w) for w in workers]
    rng = np.random.default_rng(3)
    reports = fleet.reports("agg", "cpu", "duchi", list(np.where(rng.random(60) < 0.3, 1, 0)),
                            catalogue.build("duchi", epsilon=1.0))
    batches = [reports[:40], reports[20:]]  # 20 reports reach both workers

    def ingest(i: int) -> None:
        accepted = [validators[i].check(t, p) for t, p in batches[i]]
        workers[i].commit_batch(accepted, {}, validators[i].statistics)

    threads = [threading.Thread(target=ingest, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    reader = PostgresStore(postgres_dsn)
    kept = reader.aggregates("agg", "cpu")
    assert kept is not None and kept.n == 60
    assert reader._exec("SELECT COUNT(*) FROM aggregates WHERE round_id = 'agg'")[0][0] == 2
    spec = StreamSpec.model_validate(PARAMS["streams"]["cpu"])
    from_reports = estimate_stream(spec, StreamDecoder.for_spec(spec).from_bodies(reader.report_bodies("agg", "cpu")))
    est = estimate_round(reader, "agg")["cpu"]
    assert est.n == 60 and np.allclose(est.raw, from_reports.raw) and np.allclose(est.stderr, from_reports.stderr)
    assert [c.status for c in check_aggregates(reader, ["agg"])] == ["agree"]
    assert [c.status for c in check_aggregates(reader, ["agg"], rebuild=True)] == ["rebuilt"]
    assert reader.aggregates("agg", "cpu").n == 60 and check_aggregates(reader, ["agg"])[0].status == "agree"
    for s in (*workers, reader):
        s.close()


def test_postgres_workers_started_at_once_on_a_fresh_database(postgres_server):
    """Workers starting together on an empty database all create (or find) the schema: PostgreSQL's
    ``CREATE TABLE IF NOT EXISTS`` is not atomic (all but one failed on ``pg_type``'s unique index before the schema
    was created under an advisory lock)."""
    import threading

    dsn = postgres_server.create_database("fresh_start")
    barrier, errors, stores = threading.Barrier(4), [], []

    def start() -> None:
        barrier.wait()
        try:
            stores.append(PostgresStore(dsn))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(stores) == 4
    assert stores[0].stale_aggregates() == set() and stores[0].counters() == {}
    for s in stores:
        s.close()


def test_postgres_two_workers_commit_overlapping_batches_concurrently(postgres_server):
    """Two workers (one connection each, in threads: psycopg waits on the server without the GIL) ingest the same
    reports at once, in different orders and batchings, so that most reports are raced: every report is stored
    once, each worker's aggregate row counts exactly the reports its own inserts stored (the loser of a race adds
    nothing), the ``accepted`` and ``duplicate`` counters add up (no lost update of the shared counter rows), and
    the merged aggregates agree with the stored reports."""
    import threading

    import numpy as np

    from coordinator.aggregates import check_aggregates
    from coordinator.decode import StreamDecoder
    from coordinator.estimate import estimate_stream
    from protocols.contract import StreamSpec

    dsn = postgres_server.create_database("overlap")
    workers = [PostgresStore(dsn), PostgresStore(dsn)]
    n = 240
    fleet = SimFleet(n, prefix="ovl", signature="hmac-sha256")
    for rec in fleet.enrollment():
        workers[0].upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(workers[0], wire.generate_signing_key()).open_round("ovl", 1.0, PARAMS)
    rng = np.random.default_rng(18)
    reports = fleet.reports("ovl", "cpu", "duchi", list(np.where(rng.random(n) < 0.4, 1, 0)),
                            catalogue.build("duchi", epsilon=1.0))
    orders = [rng.permutation(n), rng.permutation(n)]
    sizes = [7, 11]
    validators = [Validator(w) for w in workers]
    inserted = [0, 0]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def ingest(i: int) -> None:
        try:
            barrier.wait()
            order = orders[i]
            for start in range(0, n, sizes[i]):
                batch = [reports[j] for j in order[start:start + sizes[i]]]
                results = validators[i].check_batch(batch)
                accepted = [r for r in results if not isinstance(r, wire.WireError)]
                assert len(accepted) == len(batch), results  # neither worker saw these before: its own check passes
                inserted[i] += workers[i].commit_batch(accepted, {"batches": 1}, validators[i].statistics)
                validators[i].batch_committed()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    reader = PostgresStore(dsn)
    assert reader.report_counts() == {("ovl", "cpu"): n}
    assert sum(inserted) == n and min(inserted) > 0
    counters = reader.counters()
    assert counters["accepted"] == n and counters["duplicate"] == n  # each report offered twice, stored once
    assert counters["batches"] == sum(-(-n // size) for size in sizes)
    per_writer = dict(reader._exec("SELECT writer, n FROM aggregates WHERE round_id = 'ovl'"))
    assert per_writer == {workers[0]._writer: inserted[0], workers[1]._writer: inserted[1]}
    assert reader.aggregates("ovl", "cpu").n == n
    assert [c.status for c in check_aggregates(reader, ["ovl"])] == ["agree"]
    spec = StreamSpec.model_validate(PARAMS["streams"]["cpu"])
    from_bodies = estimate_stream(spec, StreamDecoder.for_spec(spec).from_bodies(reader.report_bodies("ovl", "cpu")))
    est = estimate_round(reader, "ovl")["cpu"]
    assert est.n == n and np.allclose(est.raw, from_bodies.raw) and np.allclose(est.stderr, from_bodies.stderr)
    for s in (*workers, reader):
        s.close()
