"""Coordinator ingest throughput through a real mosquitto, against the broker's raw rate for the same payloads.

Measured in one run, on one spawned mosquitto (persistence on, loopback):

* **raw, mosquitto_pub** — ``mosquitto_pub -l -q 1`` publishing the signed report lines, ``mosquitto_sub -q 1 -C N``
  counting them: the rate of the broker path with C clients at both ends;
* **raw, paho** — the same payloads on their per-device topics from a paho (Python) publisher, mosquitto_sub counting;
* **coordinator, drain** — ``haarvest coordinator run`` in its own process, as deployed: its persistent session
  is registered, it stops, the broker queues the fleet's reports, it starts and drains them: validate (decode, topic
  binding, registry, signature, round, support, replay) + durable SQLite commit + PUBACK after commit. The rate is
  taken over the stored commit timestamps (the first batch, received before the first timestamp, left out).
  Measured for Ed25519 and HMAC-SHA256 report keys (:mod:`protocols.wire`), for paho's MQTT 5 and 3.1.1 receive
  paths, and with one coordinator per core on a shared subscription;
* **coordinator, live** — the paho publisher and the coordinator run at the same time (end to end).

Ratios are coordinator rate / raw mosquitto_pub rate (the issue's target is ≥ 50 %) and / raw paho rate.

A second section drains the same reports into a throwaway PostgreSQL server (:mod:`simulations.postgres`): one
worker, two workers on a shared subscription, one worker with Ed25519 keys over MQTT 5, each with the CPU per report
of the workers, of PostgreSQL and of mosquitto; from those, a sizing table for fleets up to 10^7 devices
(:func:`postgres_report`, docs/scale.md).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import paho.mqtt.client as mqtt

from coordinator.rounds import RoundManager
from protocols.contract import make_body
from coordinator.simfleet import SimFleet
from coordinator.store import open_store
from protocols import wire
from protocols.mqtt import new_client
from simulations.broker import Broker, MosquittoOptions, start_broker
from simulations.proc_stats import tree_cpu
from protocols.errors import MissingPostgres
from simulations.postgres import ThrowawayPostgres

STREAMS = ("s0", "s1", "s2", "s3")


def _start_broker(workdir: Path, max_queued: int = 1_000_000) -> Broker:
    """A mosquitto of our own on a free loopback port (persistence on); a persistent session may have
    ``max_queued`` messages queued while its client is away; no in-flight limit."""
    return start_broker(workdir, "mosquitto",
                        options=MosquittoOptions(persistence=True, max_queued=max_queued, max_inflight=0))


def _params() -> dict:
    return {"streams": {s: {"kind": "numeric", "mechanism": "duchi", "params": {"epsilon": 0.25}, "dims": [s],
                            "bounds": [[0, 100]]} for s in STREAMS}}


def _reports(fleet: SimFleet, round_id: str) -> list[tuple[str, bytes]]:
    body = make_body(0)  # a Duchi report at ε = 0.25: index 0 (−B)
    return [dev.report(round_id, s, "duchi", body) for s in STREAMS for dev in fleet.devices]


def _sub_counter(port: int, n: int) -> subprocess.Popen:
    proc = subprocess.Popen(["mosquitto_sub", "-p", str(port), "-t", wire.REPORTS_WILDCARD, "-q", "1", "-C", str(n)],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc


def _raw_mosquitto_pub(port: int, payloads: list[bytes], work: Path) -> float:
    lines = work / "lines.txt"
    lines.write_bytes(b"\n".join(payloads) + b"\n")
    return _mosquitto_pub_lines(port, lines, len(payloads))


#: Lines per ``mosquitto_pub -l`` process. mosquitto_pub 2.0.11 fed ≈ 34,500 report lines at full speed sends a
#: corrupt packet (the broker logs "disconnected due to out of memory" and the rest is lost), so longer files go
#: through one process per chunk, one after the other (a reconnection per chunk: milliseconds).
PUB_CHUNK = 20_000


def _mosquitto_pub_lines(port: int, lines: Path, n: int, timeout: float = 300) -> float:
    """Reports/s of ``mosquitto_pub -l -q 1`` publishing the ``n`` payload lines of ``lines`` (in chunks of
    :data:`PUB_CHUNK` lines, one process after the other) until ``mosquitto_sub -q 1 -C n`` has received them all."""
    chunks: list[Path] = []
    with open(lines, "rb") as fh:
        while block := list(itertools.islice(fh, PUB_CHUNK)):
            chunks.append(lines.with_name(f"{lines.name}.{len(chunks)}"))
            chunks[-1].write_bytes(b"".join(block))
    sub = _sub_counter(port, n)
    t0 = time.perf_counter()
    for chunk in chunks:
        with open(chunk, "rb") as fh:
            subprocess.run(["mosquitto_pub", "-p", str(port), "-t", wire.report_topic("raw"), "-q", "1", "-l"],
                           stdin=fh, check=True)
    try:
        sub.wait(timeout)
    except subprocess.TimeoutExpired:
        sub.kill()
        raise RuntimeError(f"mosquitto_sub did not receive the {n} reports mosquitto_pub sent") from None
    rate = n / (time.perf_counter() - t0)
    for chunk in chunks:
        chunk.unlink()
    return rate


def _paho_publisher(port: int) -> mqtt.Client:
    client = new_client(f"bench-pub-{os.getpid()}-{time.monotonic_ns()}", mqtt.MQTTv5, persistent=False)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def _publish_all(client: mqtt.Client, reports: list[tuple[str, bytes]]) -> None:
    infos = [client.publish(t, p, qos=1) for t, p in reports]
    for info in infos[-100:]:
        info.wait_for_publish(300)


def _raw_paho(port: int, reports: list[tuple[str, bytes]]) -> float:
    sub = _sub_counter(port, len(reports))
    client = _paho_publisher(port)
    t0 = time.perf_counter()
    _publish_all(client, reports)
    sub.wait(300)
    rate = len(reports) / (time.perf_counter() - t0)
    client.disconnect()
    client.loop_stop()
    return rate


def _worker_command(port: int, db: Path, work: Path, name: str, protocol: str, share: bool,
                    batch_size: int | None = 2000) -> list[str]:
    """The ``haarvest coordinator run`` command line of a benchmark coordinator (``batch_size`` None: the
    coordinator's default)."""
    cmd = [sys.executable, "-m", "coordinator.cli", "coordinator", "run", "--db", str(db), "--key", str(work / "key"),
           "--mqtt-port", str(port), "--client-id", f"bench-{name}", "--batch-ms", "20", "--mqtt-protocol", protocol]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    # a group per drain: mosquitto keeps handing a share of the group's messages to the persistent sessions of
    # members that are offline (an earlier drain's workers), which would hold them until those reconnect
    return cmd + ["--share-group", f"bench-{name.rsplit('-', 1)[0]}"] if share else cmd


def _start_workers(port: int, db: Path | str, work: Path, names: list[str], protocol: str,
                   share: bool) -> tuple[list[subprocess.Popen], float, float]:
    """``haarvest coordinator run`` in its own process (as deployed) per name, all spawned at once (so that workers
    on a shared subscription start draining together), returned once each said ``ready``; with the wall-clock time
    they were spawned and the time the first said ``ready``. ``ready`` comes after the subscription and the
    round's republication, which waits behind a queue being delivered: with an empty queue, ready − spawned is the
    start-up."""
    root = Path(__file__).resolve().parents[2]
    spawned = time.time()
    procs = [subprocess.Popen(_worker_command(port, db, work, name, protocol, share), stdout=subprocess.PIPE,
                              stderr=open(work / f"{name}.log", "ab"), cwd=root,
                              env=dict(os.environ, PYTHONPATH=str(root)))
             for name in names]
    lines: dict[int, tuple[bytes, float]] = {}

    def read(i: int) -> None:  # each worker's "ready" timed as it comes, whichever comes first
        lines[i] = (procs[i].stdout.readline(), time.time())

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for t in readers:
        t.start()
    for t in readers:
        t.join(120)
    for i, name in enumerate(names):
        if b"ready" not in lines.get(i, (b"", 0.0))[0]:
            raise RuntimeError(f"coordinator {name} did not start; see {work}/{name}.log")
    return procs, spawned, min(t for _, t in lines.values())


def _start_worker(port: int, db: Path | str, work: Path, name: str, protocol: str, share: bool) -> subprocess.Popen:
    """One :func:`_start_workers`."""
    return _start_workers(port, db, work, [name], protocol, share)[0][0]


def _prepare(db: Path | str, fleet: SimFleet, round_id: str) -> list[tuple[str, bytes]]:
    """Enrol ``fleet`` in the store at ``db`` (a SQLite path or a PostgreSQL DSN), open ``round_id``; the fleet's
    signed reports for it."""
    store = open_store(db)
    for rec in fleet.enrollment():
        store.upsert_device(rec["device_id"], rec["public_key"])
    RoundManager(store, wire.generate_signing_key()).open_round(round_id, 1.0, _params())
    store.close()
    return _reports(fleet, round_id)


class _Reader:
    """Read-only SQL on the store the coordinators write (a SQLite file or a PostgreSQL DSN), ``?`` placeholders."""

    def __init__(self, db: Path | str) -> None:
        self.pg = str(db).startswith("postgresql://")
        if self.pg:
            import psycopg

            self.conn = psycopg.connect(str(db), autocommit=True)
        else:
            self.conn = sqlite3.connect(db, timeout=30)

    def one(self, sql: str, args: tuple = ()) -> tuple:
        return self.conn.execute(sql.replace("?", "%s") if self.pg else sql, args).fetchone()

    def all(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self.conn.execute(sql.replace("?", "%s") if self.pg else sql, args).fetchall()

    def close(self) -> None:
        self.conn.close()


def _stored_rate(db: Path | str, round_id: str, n: int, timeout: float = 600, since: float | None = None) -> float:
    """Wait until ``n`` reports of ``round_id`` are stored; their rate from the first to the last commit, or with
    ``since`` (a wall-clock time) from then to the last commit: n / (last − since).

    Each report's ``received_at`` is its batch's validation time, so the first batch's reports arrived before the
    first timestamp: they are left out of the count (rate = reports after the first batch / time span). A receiver
    runs ahead of its coordinator by up to three batches, and with several workers each one's first batches arrive
    before its first timestamp, so this rate runs high for short drains; ``since`` = the workers' subscription gives
    the conservative one."""
    deadline = time.monotonic() + timeout
    conn = _Reader(db)
    try:
        while True:
            count, t_first, t_last = conn.one(
                "SELECT COUNT(*), MIN(received_at), MAX(received_at) FROM reports WHERE round_id = ?", (round_id,))
            if count >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator stored only {count} of {n} reports")
            time.sleep(0.02)
        (first_batch,) = conn.one("SELECT COUNT(*) FROM reports WHERE round_id = ? AND received_at = ?",
                                  (round_id, t_first))
    finally:
        conn.close()
    if since is not None:  # no later than the first commit: the drain had started by then
        return n / max(t_last - min(since, t_first), 1e-9)
    return (n - first_batch) / max(t_last - t_first, 1e-9)


@dataclass
class _Drain:
    """One drain: reports/s over the stored timestamps, and CPU seconds spent on it by the coordinator processes
    (their CPU at the end less their start-up CPU), by the broker (delivering the queue; and, before, taking the
    reports in) and by the PostgreSQL server (0 for SQLite, which runs inside the coordinator), with the load
    average (1 min) before and after, and what the PostgreSQL database grew by per stored report."""

    rate: float
    cpu: float
    broker_in: float = 0.0
    broker_out: float = 0.0
    db_cpu: float = 0.0
    db_bytes: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    #: reports/s from the workers' subscription to the last commit (conservative; :func:`_stored_rate`)
    subscribed: float = 0.0


def _drain(port: int, work: Path, fleet: SimFleet, protocol: str, label: str, workers: int = 1,
           broker: Broker | None = None, pg: ThrowawayPostgres | None = None) -> _Drain:
    """``workers`` coordinator processes (``haarvest coordinator run``; a shared subscription when more than one)
    over one SQLite file, or one PostgreSQL database of ``pg``: register their persistent sessions, stop, let the
    broker queue the fleet's reports, start them and let them drain the queue (:class:`_Drain`)."""
    db: Path | str = pg.create_database(label.replace("-", "_")) if pg is not None else work / f"{label}.db"
    reports = _prepare(db, fleet, label)
    names = [f"{label}-{i}" for i in range(workers)]
    procs, spawned, ready = _start_workers(port, db, work, names, protocol, workers > 1)
    startup_s = ready - spawned  # imports, store, connect, subscribe: wall time to start with an empty queue
    startup = max(tree_cpu(p.pid) for p in procs)  # imports, store, connect: what a start costs without work
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    broker_cpu = (lambda: tree_cpu(broker.proc.pid)) if broker is not None else (lambda: 0.0)
    db_cpu = pg.cpu_seconds if pg is not None else (lambda: 0.0)
    b0 = broker_cpu()
    pub = _paho_publisher(port)
    _publish_all(pub, reports)
    pub.disconnect()
    pub.loop_stop()
    time.sleep(0.5)
    size0 = _db_size(db) if pg is not None else 0.0
    b1, d1, load0 = broker_cpu(), db_cpu(), os.getloadavg()[0]
    procs, spawned, _ = _start_workers(port, db, work, names, protocol, workers > 1)
    try:
        rate = _stored_rate(db, label, len(reports))
        subscribed = _stored_rate(db, label, len(reports), since=spawned + startup_s)
        cpu = sum(tree_cpu(p.pid) - startup for p in procs)
        b2, d2, load1 = broker_cpu(), db_cpu(), os.getloadavg()[0]
        conn = _Reader(db)
        counters = dict(conn.all("SELECT name, value FROM counters"))
        conn.close()
        assert set(counters) <= {"accepted", "duplicate"}, f"the drain rejected reports: {counters}"
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    grown = _db_size(db) - size0 if pg is not None else 0.0
    return _Drain(rate, cpu, b1 - b0, b2 - b1, d2 - d1, grown / len(reports), (load0, load1), subscribed)


def _db_size(dsn: Path | str) -> float:
    """Bytes of a PostgreSQL database after a checkpoint (what its tables and indexes hold on disk)."""
    conn = _Reader(dsn)
    try:
        conn.conn.execute("CHECKPOINT")
        return float(conn.one("SELECT pg_database_size(current_database())")[0])
    finally:
        conn.close()


def _publisher_process(port: int, reports: list[tuple[str, bytes]], work: Path) -> subprocess.Popen:
    """A separate Python process publishing ``reports`` (QoS 1, per-device topics) — the fleet, seen from the
    coordinator; it prints ``ready`` once connected and starts publishing when its stdin is closed."""
    lines = work / "live-reports.txt"
    lines.write_bytes(b"".join(t.encode() + b"\t" + p + b"\n" for t, p in reports))
    code = ("import sys; from simulations.bench.ingest import _paho_publisher, _publish_all\n"
            f"reports = [tuple(line.rstrip(b'\\n').split(b'\\t', 1)) for line in open({str(lines)!r}, 'rb')]\n"
            "reports = [(t.decode(), p) for t, p in reports]\n"
            f"client = _paho_publisher({port}); print('ready', flush=True); sys.stdin.read()\n"
            "_publish_all(client, reports); client.disconnect(); client.loop_stop()\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root,
                            env=dict(os.environ, PYTHONPATH=str(root)))
    if b"ready" not in proc.stdout.readline():
        raise RuntimeError("the publisher process did not start")
    return proc


def _live(port: int, work: Path, fleet: SimFleet, protocol: str) -> float:
    """The fleet (a separate paho publisher process) and a coordinator process at once, from the first publish to
    the last commit: bounded by the publisher's own rate (the raw paho row)."""
    db = work / "live.db"
    reports = _prepare(db, fleet, "live")
    coord = _start_worker(port, db, work, "live", protocol, share=False)
    try:
        pub = _publisher_process(port, reports, work)
        t0 = time.perf_counter()
        pub.stdin.close()
        _stored_rate(db, "live", len(reports))
        rate = len(reports) / (time.perf_counter() - t0)
        pub.wait(60)
    finally:
        coord.send_signal(signal.SIGTERM)
        coord.wait(30)
    return rate


#: The sizing table's fleets (devices) and report intervals (one report per device every so many seconds).
FLEETS = (10_000, 100_000, 1_000_000, 10_000_000)
INTERVALS = (60, 300, 3600)
#: The sizing table provisions this many times the measured CPU per report and divides by the measured per-worker
#: rate over this factor: workers, database and broker run at ≤ 1/HEADROOM of what was measured.
HEADROOM = 2.0


def _postgres_section(broker: Broker, work: Path, ed_fleet: SimFleet, mac_fleet: SimFleet,
                      sqlite_311: _Drain) -> str:
    """The drains over PostgreSQL (1 and 2 workers on a shared subscription, HMAC over MQTT 3.1.1; 1 worker,
    Ed25519 over MQTT 5), rendered with the sizing table (:func:`postgres_report`)."""
    try:
        pg = ThrowawayPostgres().start()
    except MissingPostgres as exc:
        return f"## Coordinator ingest over PostgreSQL: workers on a shared subscription\n\nNot measured: {exc}.\n"
    try:
        drains = {
            (1, "HMAC", "3.1.1"): _drain(broker.port, work, mac_fleet, "3.1.1", "pg-mac-v311", 1, broker, pg),
            (2, "HMAC", "3.1.1"): _drain(broker.port, work, mac_fleet, "3.1.1", "pg-shared", 2, broker, pg),
            (1, "Ed25519", "5"): _drain(broker.port, work, ed_fleet, "5", "pg-ed-v5", 1, broker, pg),
        }
    finally:
        pg.stop()
    n = len(mac_fleet) * len(STREAMS)
    drains = {k: replace(d, rate=d.subscribed) for k, d in drains.items()}
    return postgres_report(n, drains, replace(sqlite_311, rate=sqlite_311.subscribed), len(os.sched_getaffinity(0)),
                           time.strftime("%Y-%m-%d"))


def _count(x: float) -> str:
    """A rate or a number of cores as the sizing table shows it: whole above 10, two digits down to 0.01."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}" if x >= 0.01 else "< 0.01"


def postgres_report(n: int, drains: dict[tuple[int, str, str], _Drain], sqlite_311: _Drain, cores: int,
                    when: str = "") -> str:
    """The PostgreSQL section from the measurements: the drains (``(workers, key algorithm, MQTT version)`` →
    :class:`_Drain`, each of ``n`` reports), the one-worker SQLite drain (HMAC, MQTT 3.1.1) for comparison, and the
    sizing table computed from them (:data:`FLEETS` × :data:`INTERVALS`, :data:`HEADROOM`)."""
    one, two, ed = drains[(1, "HMAC", "3.1.1")], drains[(2, "HMAC", "3.1.1")], drains[(1, "Ed25519", "5")]

    def us(seconds: float) -> float:
        return 1e6 * seconds / n

    out = [
        "## Coordinator ingest over PostgreSQL: workers on a shared subscription",
        "",
        (f"Measured {when}. " if when else "") +
        f"The same {n:,} reports and broker as above; the store is one PostgreSQL server on this machine (loopback, "
        "`fsync=on`, `synchronous_commit=on`: a batch is on disk before its PUBACK, as with SQLite FULL). Workers "
        "are `haarvest coordinator run --db postgresql://… --share-group GROUP` processes draining the broker's "
        "queue, as above; reports/s here run from the workers' subscription (their spawn plus the start-up time "
        "they took with an empty queue) to the last commit, for the SQLite row too — the table above counts from "
        "the first commit, by when receivers running ahead already hold batches, which flatters short drains. CPU per report: the workers (both processes of each), the PostgreSQL server (every "
        f"backend), mosquitto (taking the reports in, then delivering them). {cores} cores: the workers, "
        "PostgreSQL and mosquitto share them.",
        "",
        "| drain | reports/s | per worker | worker CPU | PostgreSQL CPU | mosquitto CPU (in + out) | database | load |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (workers, alg, proto), d in drains.items():
        out.append(f"| {workers} worker{'s' if workers > 1 else ''}, {alg}, MQTT {proto} | {d.rate:,.0f} | "
                   f"{d.rate / workers:,.0f} | {us(d.cpu):.0f} µs | {us(d.db_cpu):.0f} µs | "
                   f"{us(d.broker_in + d.broker_out):.0f} µs | {d.db_bytes:,.0f} B/report | "
                   f"{d.load[0]:.2f} → {d.load[1]:.2f} |")
    out.append(f"| (SQLite, 1 worker, HMAC, MQTT 3.1.1, above) | {sqlite_311.rate:,.0f} | {sqlite_311.rate:,.0f} | "
               f"{us(sqlite_311.cpu):.0f} µs | (in the worker) | — | — | — |")
    busy = two.rate * us(two.cpu + two.db_cpu + two.broker_out) / 1e6 / cores
    per_core = {"worker": 1e6 / us(one.cpu), "PostgreSQL": 1e6 / us(one.db_cpu),
                "mosquitto": 1e6 / us(one.broker_in + one.broker_out)}
    out += [
        "",
        "Conclusions (computed from the table above):",
        "",
        f"- One worker over PostgreSQL drained {one.rate:,.0f} reports/s (HMAC, MQTT 3.1.1), "
        f"{100 * one.rate / sqlite_311.rate:.0f} % of the same worker over SQLite ({sqlite_311.rate:,.0f}/s); "
        f"with Ed25519 signatures over MQTT 5 (the defaults) {ed.rate:,.0f}/s.",
        f"- Two workers on the shared subscription drained {two.rate:,.0f}/s, {two.rate / one.rate:.2f}× one worker. "
        f"While they did, the two workers, PostgreSQL and mosquitto kept this machine's {cores} cores "
        f"{100 * busy:.0f} % busy (CPU per report × rate): "
        + (f"the cores were saturated, so this run cannot show what a second worker adds on cores of its own (what "
           f"the workers share is the database, {us(two.db_cpu):.0f} µs of PostgreSQL CPU per report)."
           if busy > 0.8 else "the cores were not saturated."),
        f"- Per CPU core, a worker (both processes) validates and commits {per_core['worker']:,.0f} reports/s, "
        f"PostgreSQL stores {per_core['PostgreSQL']:,.0f}/s and mosquitto moves {per_core['mosquitto']:,.0f}/s "
        f"(HMAC, MQTT 3.1.1; Ed25519 over MQTT 5 costs a worker {us(ed.cpu) / us(one.cpu):.1f}× as much CPU).",
        f"- The PostgreSQL database grew by {one.db_bytes:,.0f} bytes per stored report (the row, its indexes, "
        "the counters and aggregates).",
        "",
        f"Sizing (computed from the one-worker drains above, with {HEADROOM:g}× headroom: workers at "
        f"{one.rate / HEADROOM:,.0f} reports/s each with HMAC keys, {ed.rate / HEADROOM:,.0f}/s with Ed25519; "
        f"PostgreSQL and broker cores at {us(one.db_cpu):.0f} and {us(one.broker_in + one.broker_out):.0f} µs per "
        f"report × {HEADROOM:g}). One report per device per interval (a round of s streams is s reports). The "
        "broker column is message work only, in cores of one mosquitto (single-threaded: one mosquitto is at most "
        "one core); holding the devices' connections is sized apart (docs/scale.md).",
        "",
        "| devices | one report every | reports/s | workers (HMAC) | workers (Ed25519) | PostgreSQL cores | "
        "broker cores | database growth per day |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for devices in FLEETS:
        for interval in INTERVALS:
            rate = devices / interval
            growth = rate * 86400 * one.db_bytes
            out.append(
                f"| {devices:,} | {interval // 60} min | {_count(rate)} | {math.ceil(HEADROOM * rate / one.rate)} | "
                f"{math.ceil(HEADROOM * rate / ed.rate)} | {_count(HEADROOM * rate * us(one.db_cpu) / 1e6)} | "
                f"{_count(HEADROOM * rate * us(one.broker_in + one.broker_out) / 1e6)} | "
                f"{growth / 1e9:,.1f} GB |")
    top = FLEETS[-1] / INTERVALS[0]
    out += [
        "",
        f"At the top of the table ({FLEETS[-1]:,} devices every {INTERVALS[0] // 60} min: {top:,.0f} reports/s) "
        f"the workers need {math.ceil(HEADROOM * top / one.rate)} (HMAC) to "
        f"{math.ceil(HEADROOM * top / ed.rate)} (Ed25519) processes, PostgreSQL "
        f"{HEADROOM * top * us(one.db_cpu) / 1e6:,.0f} cores of insert work on one primary and the broker "
        f"{HEADROOM * top * us(one.broker_in + one.broker_out) / 1e6:,.0f} mosquitto-cores: past one database "
        "server and one broker process (docs/scale.md).",
        "",
    ]
    return "\n".join(out)


def run(quick: bool = False) -> str:
    n_devices = 1000 if quick else 6000
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="haarvest-bench-ingest-"))
    broker = _start_broker(work / "broker")
    try:
        ed_fleet = SimFleet(n_devices, "device-ed")
        mac_fleet = SimFleet(n_devices, "device-mac", signature="hmac-sha256")
        sizes = {alg: sum(len(p) for _, p in reps) / len(reps)
                 for alg, reps in (("Ed25519", _reports(ed_fleet, "size")), ("HMAC", _reports(mac_fleet, "size")))}
        payloads = [p for _, p in _reports(mac_fleet, "raw")]
        n = len(payloads)
        raw_pub = _raw_mosquitto_pub(broker.port, payloads, work)
        raw_paho = _raw_paho(broker.port, _reports(mac_fleet, "raw-paho"))
        rows: list[tuple[str, float, str]] = []
        for label, fleet, protocol, alg in (("ed-v5", ed_fleet, "5", "Ed25519"),
                                            ("mac-v5", mac_fleet, "5", "HMAC"), ("mac-v311", mac_fleet, "3.1.1", "HMAC")):
            d = d_311 = _drain(broker.port, work, fleet, protocol, label)
            rows.append((f"coordinator drain, 1 coordinator, {alg}, MQTT {protocol}", d.rate,
                         f"{1e6 * d.cpu / n:.0f} µs CPU per report"))
        if cores > 1:
            d = _drain(broker.port, work, mac_fleet, "3.1.1", "shared", workers=cores)
            rows.append((f"coordinator drain, {cores} coordinators on a shared subscription, HMAC, MQTT 3.1.1", d.rate,
                         f"one SQLite file; {1e6 * d.cpu / n:.0f} µs CPU per report"))
        pg_section = _postgres_section(broker, work, ed_fleet, mac_fleet, sqlite_311=d_311)
        rows.append(("coordinator live (paho publisher process running concurrently), HMAC, MQTT 3.1.1",
                     _live(broker.port, work, mac_fleet, "3.1.1"), "bounded by the paho publisher"))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    best = max(rows[:-1], key=lambda r: r[1])
    out = [
        "## Coordinator ingest",
        "",
        f"{n:,} signed reports per measurement ({n_devices:,} devices × {len(STREAMS)} streams; "
        f"{sizes['HMAC']:.0f} bytes with an HMAC-SHA256 tag, {sizes['Ed25519']:.0f} with an Ed25519 signature), one "
        "mosquitto on loopback, QoS 1, SQLite WAL synchronous=FULL, batch ≤ 2000 / 20 ms, every report validated "
        "(schema, topic binding, registry, signature, round, support, replay) and committed before its PUBACK. "
        "A coordinator is `haarvest coordinator run` in its own process, with its MQTT receiver process; the CPU "
        "per report counts both. The raw rows carry the same HMAC payloads.",
        "",
        "| path | reports/s | vs mosquitto_pub | vs paho publisher | note |",
        "|---|---:|---:|---:|---|",
        f"| raw: mosquitto_pub -l → mosquitto_sub (QoS 1) | {raw_pub:,.0f} | 100 % | "
        f"{100 * raw_paho / raw_pub:.0f} % | C client at both ends |",
        f"| raw: paho publisher → mosquitto_sub (QoS 1) | {raw_paho:,.0f} | {100 * raw_paho / raw_pub:.0f} % | "
        "100 % | |",
    ]
    out += [f"| {name} | {rate:,.0f} | {100 * rate / raw_pub:.0f} % | {100 * rate / raw_paho:.0f} % | {note} |"
            for name, rate, note in rows]
    verdict = "meets" if best[1] >= 0.5 * raw_pub else "misses"
    out += ["", f"Sustained ingest (best drain: {best[0]}) is {100 * best[1] / raw_pub:.0f} % of the raw "
            f"mosquitto_pub rate: {verdict} the ≥ 50 % target.", ""]
    return "\n".join(out) + "\n" + pg_section


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
