"""The PostgreSQL store behind the same interface: a throwaway server (initdb + pg_ctl in a temp dir)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

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


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    return found


@pytest.fixture(scope="module")
def postgres_dsn():
    pytest.importorskip("psycopg")
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    prefix: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="haarvest-pg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root: use the postgres system user
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
        os.chown(workdir, pw.pw_uid, pw.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = workdir / "data"
    subprocess.run(prefix + [initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(prefix + [pg_ctl, "-D", str(data), "-l", str(workdir / "log"), "-w", "-o",
                             f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=on", "start"],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(prefix + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], stdout=subprocess.DEVNULL)
        shutil.rmtree(workdir, ignore_errors=True)


def test_postgres_store_two_workers(postgres_dsn):
    store = open_store(postgres_dsn)
    assert isinstance(store, PostgresStore)
    fleet = SimFleet(20)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(store, wire.generate_signing_key()).open_round("r1", 1.0, PARAMS)
    other = PostgresStore(postgres_dsn)  # a second worker with its own connection and validator
    v1, v2 = Validator(store), Validator(other)
    reports = fleet.reports("r1", "cpu", "duchi", [2.16 if i % 2 else -2.16 for i in range(20)],
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
    assert v2.check(*fleet.devices[0].report("r2", "cpu", "duchi", {"report": 2.16})).round_id == "r2"
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
    reports = fleet.reports("agg", "cpu", "duchi", list(np.where(rng.random(60) < 0.3, 2.16, -2.16)),
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
