"""Fleet scale: one round of N enrolled devices through a real mosquitto into one coordinator, then its estimates.

A million-device round: N = 10⁶ by default (``HAARVEST_BENCH_FLEET_N`` or ``--devices`` to change it; ``--quick`` /
``make bench BENCH_ARGS=--quick``: 2,000). Measured in one run, on one spawned mosquitto (persistence on and
saved as often as the shipped broker saves it — ``autosave_interval`` —, loopback, QoS 1):

* **enrolment** — N devices with HMAC-SHA256 report keys (:mod:`protocols.wire`; an Ed25519 signature costs far more
  to verify: the ingest section measures both) enrolled in the store in one transaction
  (:meth:`coordinator.store.Store.add_devices`: one ``executemany``);
* **the round** — three streams: ``load`` (numeric, ``hybrid``), ``app`` (frequency, ``oue``, k = 16) and ``env``
  (``haar``, 4 dims). Each device reports *one* stream (device i the stream i mod 3): N reports in all, not 3N. The
  true values are drawn per device, privatized with the stream's own mechanism (vectorised, as the devices'), signed
  with the device's key (:meth:`coordinator.simfleet.SimDevice.report`) and written to a file in a random arrival
  order (devices report at random times);
* **raw, mosquitto_pub** — the same payloads from that file through ``mosquitto_pub -l -q 1`` (in chunks, one
  process after the other: :data:`simulations.bench.ingest.PUB_CHUNK`) to ``mosquitto_sub -q 1 -C N``: the broker's
  rate with C clients at both ends, in this run;
* **coordinator, drain** — ``haarvest coordinator run`` in its own process, as deployed (its default batch size,
  :data:`coordinator.defaults.BATCH_SIZE`; the ingest section's 20 ms), once over MQTT 5 (the default) and once over
  MQTT 3.1.1 (for brokers without MQTT 5), each with a store and a persistent session of its own
  (``HAARVEST_BENCH_FLEET_MQTT=5`` or ``=3.1.1`` for one of them only). In turn, each registers its session and stops;
  a paho publisher process puts the N reports on their per-device topics (the broker queues them for that session
  alone — mosquitto's CPU per delivered message grows with the messages it holds —: its queue limit is raised to N
  here — the shipped broker configuration keeps fewer —, and its in-flight window per client is the receiver's Receive
  Maximum for both protocols); then the coordinator starts again and drains its queue — validate (decode, topic
  binding, registry, signature, round, support, replay) + durable SQLite commit with the stream aggregates + PUBACK
  after the commit + a receipt per device. Should it exit, it is restarted as the shipped systemd unit would
  (``Restart=always``, after its ``RestartSec``), and the exits and what the coordinator said are reported. The rate
  is taken over the stored commit timestamps (the first batch, received before the first timestamp, left out) — from
  the first to the last commit, and, when there were exits, within the coordinator's runs; the ratio to the
  mosquitto_pub rate is the issue's target (≥ 50 %). CPU per report of the coordinator process, of its MQTT receiver
  and of mosquitto; peak RSS (``VmHWM``, sampled) of the coordinator's two processes and of mosquitto, and the SQLite
  file size after the stop;
* **estimates** — at 10⁴, 10⁵ and 10⁶ stored reports (the first k reports of the round in arrival order, committed
  as ingest does — :meth:`~coordinator.store.Store.commit_batch` with the validator's statistics — into a store of
  their own; the largest size is the drained store itself), each in a *fresh process* after the coordinator has
  stopped: :func:`coordinator.estimate.estimate_round` per stream and for the whole round, the HTTP API's
  ``/api/estimates/<round>`` (an uncached request each time: every request asks for another confidence level), and
  the old path — every stored body re-read and decoded, what ``estimate_round`` does for a stale stream. Target:
  every estimate ≤ 50 ms whatever the number of stored reports.

Run alone: ``python -m simulations.bench.fleet_scale [--devices N] [--quick]`` (prints the section);
``make bench BENCH_ARGS="--only fleet_scale"`` writes it into docs/generated/bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from coordinator import defaults
from coordinator.rounds import RoundManager
from coordinator.simfleet import SimDevice
from coordinator.store import SQLITE_CACHE_KIB, SQLiteStore, StoredReport
from protocols import wire
from protocols.contract import StreamSpec, make_body, normalise
from simulations.proc_stats import children, peak_rss, process_cpu, python_speed, tree_cpu
from coordinator.mqtt_receiver import IngestSettings
from simulations.bench.ingest import _mosquitto_pub_lines, _start_worker, _worker_command
from simulations.broker import MosquittoOptions, shipped_option, start_broker

ROUND = "fleet"
FULL_N = 1_000_000
QUICK_N = 2_000
ENV_N = "HAARVEST_BENCH_FLEET_N"
#: the coordinators' MQTT protocols, drained in turn: 5 (the default) and 3.1.1 (for brokers without MQTT 5)
PROTOCOLS = ("5", "3.1.1")
ENV_PROTOCOL = "HAARVEST_BENCH_FLEET_MQTT"  # one of PROTOCOLS only (default: both)
#: the round: one numeric stream, one frequency oracle over 16 items, one Haar record of 4 dimensions
PARAMS = {"streams": {
    "load": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": 1.0}, "dims": ["load"],
             "bounds": [[0, 100]]},
    "app": {"kind": "frequency", "mechanism": "oue", "params": {"epsilon": 2.0, "k": 16}, "dims": ["app"]},
    "env": {"kind": "haar", "mechanism": "haar", "params": {"epsilon": 2.0}, "dims": ["t1", "t2", "t3", "t4"],
            "bounds": [[0, 50]] * 4},
}}
STREAMS = tuple(PARAMS["streams"])
TARGET_RATIO = 0.5
TARGET_MS = 50.0
CHUNK = 50_000  # devices signed per vectorised privatization pass


def device_id(i: int) -> str:
    return f"fleet-{i:07d}"


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _true_values(stream: str, spec: StreamSpec, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` devices' true values of ``stream``: load ~ 100·Beta(2, 5); app ~ Zipf(1) over 16 items; env ~ four
    correlated readings around 10, 20, 30 and 40."""
    if stream == "load":
        return 100.0 * rng.beta(2.0, 5.0, m)
    if stream == "app":
        p = 1.0 / np.arange(1, spec.build().k + 1)
        return rng.choice(p.size, size=m, p=p / p.sum())
    base = rng.normal(0.0, 4.0, (m, 1))
    return np.clip(np.array([10.0, 20.0, 30.0, 40.0]) + base + rng.normal(0.0, 3.0, (m, 4)), 0.0, 50.0)


class Fleet:
    """N devices' HMAC report keys (one random blob, 32 bytes each) and the truth of the round they report."""

    def __init__(self, n: int, seed: int = 18) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.secrets = os.urandom(wire.MAC_KEY_BYTES * n)
        self.specs = {s: StreamSpec.model_validate(raw) for s, raw in PARAMS["streams"].items()}
        self.truth_sum: dict[str, np.ndarray] = {}
        self.counts = {s: 0 for s in STREAMS}

    def key(self, i: int) -> wire.MacKey:
        return wire.MacKey(self.secrets[wire.MAC_KEY_BYTES * i:wire.MAC_KEY_BYTES * (i + 1)])

    def enrol(self, db: Path) -> float:
        """Every device into the store's devices table (:meth:`~coordinator.store.Store.add_devices`: one
        ``executemany``, one transaction). Seconds taken."""
        store = SQLiteStore(db)  # the schema
        try:
            t0 = time.perf_counter()
            store.add_devices((device_id(i), wire.registry_key(self.key(i))) for i in range(self.n))
            return time.perf_counter() - t0
        finally:
            store.close()

    def write_reports(self, round_id: str, topics_file: Path, lines_file: Path) -> tuple[float, float]:
        """Sign every device's report (device i: stream i mod 3) in a random arrival order: ``topic\\tpayload``
        lines to ``topics_file``, payload lines to ``lines_file``. (seconds, mean payload bytes)."""
        t0 = time.perf_counter()
        order = self.rng.permutation(self.n)
        size = 0
        with open(topics_file, "wb") as tf, open(lines_file, "wb") as lf:
            for start in range(0, self.n, CHUNK):
                chunk = order[start:start + CHUNK]
                payloads: dict[int, tuple[str, bytes]] = {}
                for si, stream in enumerate(STREAMS):
                    ids = chunk[chunk % len(STREAMS) == si]
                    if not ids.size:
                        continue
                    spec = self.specs[stream]
                    mech, codec = spec.build(), spec.entry
                    x = _true_values(stream, spec, ids.size, self.rng)
                    self._add_truth(stream, spec, x)
                    if spec.kind == "frequency":
                        rows = mech.privatize(x, self.rng)
                    else:
                        lo, hi = spec.lo_hi()
                        t = normalise(x if x.ndim == 2 else x[:, None], lo, hi)
                        rows = mech.privatize(t if spec.kind == "haar" else t[:, 0], self.rng)
                    for i, row in zip(ids.tolist(), rows):  # each device's first report (boot 1, seq 1)
                        payloads[i] = SimDevice(device_id(i), self.key(i)).report(
                            round_id, stream, spec.wire_mechanism, make_body(codec.encode_row(mech, row)))
                for i in chunk.tolist():
                    topic, p = payloads[i]
                    size += len(p)
                    tf.write(topic.encode() + b"\t" + p + b"\n")
                    lf.write(p + b"\n")
        return time.perf_counter() - t0, size / self.n

    def _add_truth(self, stream: str, spec: StreamSpec, x: np.ndarray) -> None:
        if spec.kind == "frequency":
            part = np.bincount(x, minlength=spec.build().k).astype(float)
        else:
            part = (x if x.ndim == 2 else x[:, None]).sum(axis=0)
        self.truth_sum[stream] = self.truth_sum.get(stream, 0) + part
        self.counts[stream] += x.shape[0]

    def truth(self, stream: str) -> np.ndarray:
        return self.truth_sum[stream] / self.counts[stream]


# --- the broker path ------------------------------------------------------------------------------------------------


def _queue_reports(port: int, topics_file: Path, n: int) -> float:
    """Publish ``topics_file``'s reports (QoS 1, per-device topics) from a paho publisher process, at most 20,000
    unacknowledged at a time; returns once the broker has acknowledged them all. Reports/s."""
    code = ("import sys, collections\n"
            "from simulations.bench.ingest import _paho_publisher\n"
            f"client = _paho_publisher({port}); window = collections.deque()\n"
            f"for line in open({str(topics_file)!r}, 'rb'):\n"
            "    topic, payload = line.rstrip(b'\\n').split(b'\\t', 1)\n"
            "    window.append(client.publish(topic.decode(), payload, qos=1))\n"
            "    if len(window) > 20000:\n"
            "        window.popleft().wait_for_publish(300)\n"
            "for info in window:\n"
            "    info.wait_for_publish(300)\n"
            "client.disconnect(); client.loop_stop()\n")
    root = Path(__file__).resolve().parents[2]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    return n / (time.perf_counter() - t0)


def _accepted(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM counters WHERE name = 'accepted'").fetchone()
    return int(row[0]) if row else 0


def _restart_delay() -> float:
    """``RestartSec`` of the shipped systemd unit (deploy/systemd/haarvest-coordinator.service): how long the
    deployed coordinator stays down after it exits."""
    unit = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "haarvest-coordinator.service"
    found = re.search(r"^RestartSec=(\d+(?:\.\d+)?)\s*$", unit.read_text(), re.M) if unit.exists() else None
    return float(found.group(1)) if found else 5.0


class _Supervisor:
    """``haarvest coordinator run`` kept running as the shipped systemd unit does (``Restart=always``, restarted
    ``RestartSec`` after it exits), sampled for peak RSS (``VmHWM``) and CPU seconds of its processes."""

    def __init__(self, cmd: list[str], log: Path, delay: float) -> None:
        self.cmd, self.log, self.delay = cmd, log, delay
        self.root = Path(__file__).resolve().parents[2]
        self.proc: subprocess.Popen | None = None
        self.exits: list[int] = []
        self.restart_at: float | None = None
        self.rss_main = self.rss_receiver = 0
        self.cpu: dict[int, float] = {}  # pid → CPU seconds last seen (a process that exits keeps its last sample)
        self.mains: set[int] = set()  # the coordinator processes' pids (the others are their MQTT receivers)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), cwd=self.root,
                                     env=dict(os.environ, PYTHONPATH=str(self.root)))
        self.restart_at = None

    def poll(self) -> None:
        """Sample the live processes; restart an exited coordinator once its restart delay has passed."""
        if self.proc is not None and self.proc.poll() is not None:
            self.exits.append(self.proc.returncode)
            self.proc = None
            self.restart_at = time.monotonic() + self.delay
        if self.proc is None:
            if self.restart_at is not None and time.monotonic() >= self.restart_at:
                self.start()
            return
        try:
            pid = self.proc.pid
            self.mains.add(pid)
            kids = children(pid)
            self.rss_main = max(self.rss_main, peak_rss(pid))
            self.rss_receiver = max(self.rss_receiver, sum(peak_rss(c) for c in kids))
            for p in [pid, *kids]:
                self.cpu[p] = process_cpu(p)
        except (OSError, ValueError, IndexError):  # exited while sampled
            pass

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    @property
    def cpu_main_seconds(self) -> float:
        """CPU seconds of the coordinator processes alone (validate + commit; their receivers left out)."""
        return sum(c for p, c in self.cpu.items() if p in self.mains)

    def stop(self) -> None:
        if self.proc is not None:
            self.poll()
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)

    def errors(self) -> list[str]:
        """The distinct error lines the coordinator printed (``haarvest coordinator run: …``), broker address cut."""
        seen: list[str] = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("haarvest coordinator run:"):
                text = line.removeprefix("haarvest coordinator run:").split(" (broker ")[0].strip()
                if text not in seen:
                    seen.append(text)
        return seen


def _commit_rates(conn: sqlite3.Connection, gap: float) -> tuple[float, float, int, int]:
    """From the stored commit timestamps: (reports/s from the first to the last commit, reports/s within the
    coordinator's runs — the time between runs, a gap longer than ``gap`` s, left out —, number of such gaps,
    number of batches).
    Each report's ``received_at`` is its batch's validation time, so a run's first batch arrived before its first
    timestamp: it is left out of the count."""
    batches = conn.execute("SELECT received_at, COUNT(*) FROM reports WHERE round_id = ? GROUP BY received_at "
                           "ORDER BY received_at", (ROUND,)).fetchall()
    total = sum(c for _, c in batches)
    overall = (total - batches[0][1]) / max(batches[-1][0] - batches[0][0], 1e-9)
    counted = span = 0.0
    gaps = 0
    seg_start = 0
    for i in range(1, len(batches) + 1):
        if i == len(batches) or batches[i][0] - batches[i - 1][0] > gap:
            counted += sum(c for _, c in batches[seg_start + 1:i])
            span += batches[i - 1][0] - batches[seg_start][0]
            gaps += i < len(batches)
            seg_start = i
    return overall, counted / max(span, 1e-9), gaps, len(batches)


def register(port: int, work: Path, db: Path, name: str, protocol: str) -> tuple[float, float, float]:
    """Start the coordinator ``name`` once (its persistent session and subscription) and stop it: (start-up
    seconds, its processes' CPU seconds, the coordinator process's alone)."""
    t0 = time.perf_counter()
    coord = _start_worker(port, db, work, name, protocol, share=False)
    startup_s = time.perf_counter() - t0
    startup_cpu, startup_main = tree_cpu(coord.pid), process_cpu(coord.pid)
    coord.send_signal(signal.SIGTERM)
    coord.wait(60)
    return startup_s, startup_cpu, startup_main


def drain(port: int, work: Path, db: Path, n: int, name: str, protocol: str, startup: tuple[float, float, float],
          broker_pid: int | None = None) -> dict[str, Any]:
    """Start the coordinator ``name`` (restarted as the shipped systemd unit would whenever it exits) on the queue
    its session holds, and let it drain the ``n`` reports into ``db``."""
    startup_s, startup_cpu, startup_main = startup
    sup = _Supervisor(_worker_command(port, db, work, name, protocol, share=False, batch_size=None),
                      work / f"{name}.log", _restart_delay())
    load_d0 = _load()
    broker_cpu0 = process_cpu(broker_pid) if broker_pid else 0.0
    sup.start()
    conn = sqlite3.connect(db, timeout=30)
    try:
        deadline = time.monotonic() + max(600.0, n / 200)
        last_note = time.monotonic()
        while (done := _accepted(conn)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator stored only {done} of {n} reports")
            if time.monotonic() - last_note > 30:
                print(f"[fleet_scale] MQTT {protocol}: drained {done:,} of {n:,}, {len(sup.exits)} exits "
                      f"(load {_load()})", file=sys.stderr, flush=True)
                last_note = time.monotonic()
            sup.poll()
            time.sleep(0.5)
        load_d1 = _load()
        broker_cpu = process_cpu(broker_pid) - broker_cpu0 if broker_pid else 0.0
        sup.poll()
        overall, within, gaps, batches = _commit_rates(conn, gap=2.0)
        (count,) = conn.execute("SELECT COUNT(*) FROM reports WHERE round_id = ?", (ROUND,)).fetchone()
        counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
    finally:
        conn.close()
        sup.stop()
    if count != n or set(counters) - {"accepted", "duplicate"}:
        raise RuntimeError(f"the drain stored {count} of {n} reports; counters {counters}")
    runs = len(sup.exits) + 1
    return {"rate": overall, "rate_within": within, "gaps": gaps, "batches": batches, "exits": sup.exits,
            "errors": sup.errors(), "restart_s": sup.delay, "duplicates": counters.get("duplicate", 0),
            "protocol": protocol, "startup_s": startup_s, "startup_cpu": startup_cpu,
            "cpu_us": 1e6 * (sup.cpu_seconds - runs * startup_cpu) / n,
            "cpu_main_us": 1e6 * (sup.cpu_main_seconds - runs * startup_main) / n,
            "broker_cpu_us": 1e6 * broker_cpu / n,
            "rss_main": sup.rss_main, "rss_receiver": sup.rss_receiver,
            "load": (load_d0, load_d1)}


# --- estimates ------------------------------------------------------------------------------------------------------


def copy_first(db: Path, out: Path, k: int) -> None:
    """The round and its first ``k`` stored reports (arrival order) into a new store at ``out``, committed as ingest
    does: batches of 2,000 through :meth:`Store.commit_batch` with the validator's statistics as the aggregate."""
    from coordinator.validate import Validator

    src = sqlite3.connect(db)
    config, status = src.execute("SELECT config, status FROM rounds WHERE round_id = ?", (ROUND,)).fetchone()
    store = SQLiteStore(out)
    store.put_round(ROUND, config, status)
    validator = Validator(store)
    cur = src.execute("SELECT device_id, seq, boot, round_id, stream, mechanism, body, sig, received_at FROM reports "
                      "WHERE round_id = ? ORDER BY rowid LIMIT ?", (ROUND, k))
    while batch := cur.fetchmany(2000):
        store.commit_batch([StoredReport(*row) for row in batch], {}, aggregate=validator.statistics)
    store.close()
    src.close()


def _ms(xs: list[float]) -> tuple[float, float]:
    """(median, max) in milliseconds."""
    return 1e3 * statistics.median(xs), 1e3 * max(xs)


def measure_latency(db: str, reps: int, old_reps: int) -> dict[str, Any]:
    """In this (fresh) process: the estimate latencies of the round stored at ``db`` (see the module docstring)."""
    from coordinator.api import ApiServer
    from coordinator.decode import StreamDecoder
    from coordinator.estimate import estimate_round, estimate_stream
    from protocols.contract import parse_round_params

    store = SQLiteStore(db)
    params = parse_round_params(wire.RoundConfig.model_validate_json(store.round(ROUND)["config"]).params)
    t0 = time.perf_counter()
    estimate_round(store, ROUND)  # the process's first estimate: imports and first-use set-up
    cold = time.perf_counter() - t0
    new: dict[str, list[float]] = {s: [] for s in params.streams}
    whole: list[float] = []
    estimates: dict[str, Any] = {}
    for _ in range(reps):
        for name in params.streams:
            t0 = time.perf_counter()
            est = estimate_round(store, ROUND, streams=[name])[name]
            new[name].append(time.perf_counter() - t0)
            estimates[name] = est.to_dict()
        t0 = time.perf_counter()
        estimate_round(store, ROUND)
        whole.append(time.perf_counter() - t0)
    old: dict[str, list[float]] = {s: [] for s in params.streams}
    agree = 0.0
    for _ in range(old_reps):
        for name, spec in params.streams.items():
            t0 = time.perf_counter()
            decoder = StreamDecoder.for_spec(spec)  # what estimate_round does for a stale stream
            est = estimate_stream(spec, decoder.from_bodies(store.report_bodies(ROUND, name)), ROUND, name,
                                  decoder=decoder)
            old[name].append(time.perf_counter() - t0)
            agree = max(agree, float(np.max(np.abs(np.subtract(est.raw, estimates[name]["raw"])))))
    token = "bench-token-" + "x" * 16
    api = ApiServer(types.SimpleNamespace(store=store, key=wire.generate_signing_key(), ingest=None), tokens=[token])
    api.start()
    http: list[float] = []
    try:
        for i in range(reps + 1):  # another level each time: never served from the API's cache
            req = urllib.request.Request(f"{api.url}/api/estimates/{ROUND}?level={0.95 - 1e-4 * (i + 1):.6f}",
                                         headers={"Authorization": f"Bearer {token}"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.loads(resp.read())
            http.append(time.perf_counter() - t0)
            assert set(body) == set(params.streams), body
    finally:
        api.stop()
    counts: list[float] = []
    for _ in range(reps):  # what the endpoint does besides the estimates, to key its cache
        t0 = time.perf_counter()
        n = store.round_report_count(ROUND)
        counts.append(time.perf_counter() - t0)
    store.close()
    return {"n": n, "counts": counts, "cold": cold, "new": new, "whole": whole, "old": old, "http_cold": http[0],
            "http": http[1:],
            "agree": agree, "estimates": estimates}


def _latency_process(db: Path, reps: int, old_reps: int) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "simulations.bench.fleet_scale", "--latency", str(db),
                          "--reps", str(reps), "--old-reps", str(old_reps)],
                         capture_output=True, text=True, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    if out.returncode:
        raise RuntimeError(f"the latency process failed:\n{out.stderr}")
    return json.loads(out.stdout)


def sizes_for(n: int) -> list[int]:
    """10⁴, 10⁵ and 10⁶ stored reports, those below N, and N; a fleet below 10⁴: N/10 and N."""
    below = [s for s in (10**4, 10**5, 10**6) if s < n]
    return (below or [max(n // 10, 1)]) + [n]


# --- the run --------------------------------------------------------------------------------------------------------


#: what each protocol is to the coordinator, for the section's text
_PROTOCOL_ROLE = {"5": "its default", "3.1.1": "for brokers without MQTT 5"}


def _slug(protocol: str) -> str:
    return protocol.replace(".", "")


def measure(n: int, protocols: tuple[str, ...] = PROTOCOLS, reps: int = 20, old_reps: int = 5) -> dict[str, Any]:
    """Every measurement of the section (see the module docstring), as plain data for :func:`render`."""
    res: dict[str, Any] = {"n": n, "protocols": list(protocols), "reps": reps, "old_reps": old_reps,
                           "old_reps_full": max(2, old_reps // 2), "load_start": _load(), "speed_start": python_speed(),
                           "date": time.strftime("%Y-%m-%d")}
    work = Path(tempfile.mkdtemp(prefix="haarvest-bench-fleet-"))
    # each coordinator session may hold the whole round queued, and gets the in-flight window the receiver asks
    # MQTT 5 brokers for (Receive Maximum) over MQTT 3.1.1 too, where the broker's max_inflight_messages sets it;
    # the broker saves its state as often as the shipped one does
    broker = start_broker(work / "broker", "mosquitto", options=MosquittoOptions(
        persistence=True, max_queued=n + 1000, max_inflight=IngestSettings().receive_maximum,
        autosave_interval=int(shipped_option("autosave_interval"))))
    try:
        fleet = Fleet(n)
        db = work / "fleet.db"
        res["enrol_s"] = fleet.enrol(db)
        store = SQLiteStore(db)
        RoundManager(store, wire.generate_signing_key()).open_round(
            ROUND, sum(spec.epsilon for spec in fleet.specs.values()), PARAMS)
        store.close()
        topics_file, lines_file = work / "reports.tsv", work / "payloads.txt"
        res["sign_s"], res["size"] = fleet.write_reports(ROUND, topics_file, lines_file)
        res["streams"] = {name: {"kind": spec.kind, "mechanism": spec.wire_mechanism, "epsilon": spec.epsilon,
                                 "values": int(fleet.truth(name).size), "reports": fleet.counts[name],
                                 "hi": None if spec.kind == "frequency" else float(spec.lo_hi()[1][0]),
                                 "truth": fleet.truth(name).tolist()}
                          for name, spec in fleet.specs.items()}
        print(f"[fleet_scale] {n:,} devices enrolled in {res['enrol_s']:.1f} s, reports signed in "
              f"{res['sign_s']:.1f} s (load {_load()})", file=sys.stderr, flush=True)
        load0 = _load()
        res["raw"] = _mosquitto_pub_lines(broker.port, lines_file, n, timeout=max(300.0, n / 1000))
        res["raw_load"] = (load0, _load())
        print(f"[fleet_scale] mosquitto_pub: {res['raw']:,.0f}/s (load {_load()})", file=sys.stderr, flush=True)
        # per protocol, in turn: a store and a persistent session of its own, the round queued for it alone (mosquitto's
        # CPU per delivered message grows with the messages it holds), then the drain
        dbs: dict[str, Path] = {}
        res["drains"] = []
        for proto in protocols:
            name = f"fleet-{_slug(proto)}"
            dbs[proto] = work / f"{name}.db"
            for f in work.glob("fleet.db*"):
                shutil.copy(f, work / f.name.replace("fleet.db", dbs[proto].name))
            startup = register(broker.port, work, dbs[proto], name, proto)
            load0 = _load()
            queue_rate = _queue_reports(broker.port, topics_file, n)
            queue_load = (load0, _load())
            time.sleep(0.5)
            d = drain(broker.port, work, dbs[proto], n, name, proto, startup, broker.proc.pid)
            d["queue_rate"], d["queue_load"] = queue_rate, queue_load
            res["drains"].append(d)
            print(f"[fleet_scale] MQTT {proto}: drained at {d['rate']:,.0f}/s, {len(d['exits'])} exits "
                  f"(load {_load()})", file=sys.stderr, flush=True)
        res["broker_rss"] = peak_rss(broker.proc.pid)
        db = dbs[protocols[0]]
        res["db_bytes"] = sum(f.stat().st_size for f in work.glob(db.name + "*"))
        res["latency"] = []
        for k in sizes_for(n):
            target = db
            if k < n:
                target = work / f"first-{k}.db"
                copy_first(db, target, k)
            load0 = _load()
            lat = _latency_process(target, reps, old_reps if k < 10**6 else res["old_reps_full"])
            lat["load"] = (load0, _load())
            res["latency"].append(lat)
            print(f"[fleet_scale] estimates at {k:,} stored reports measured (load {_load()})", file=sys.stderr,
                  flush=True)
    except BaseException:
        for log in sorted(work.glob("*.log")) + [work / "broker" / "log"]:  # what the processes said, before rmtree
            if log.exists():
                print(f"[fleet_scale] {log.name}:\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
        raise
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    res["load_end"] = _load()
    res["speed_end"] = python_speed()
    return res


# --- the section ----------------------------------------------------------------------------------------------------


def _f(ms: float) -> str:
    """Milliseconds to three significant figures or so."""
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def _stream_text(name: str, st: dict[str, Any]) -> str:
    shape = f"{st['values']} items" if st["kind"] == "frequency" else \
        f"{st['values']} dim{'s' if st['values'] > 1 else ''}"
    return f"`{name}` ({st['kind']}, {st['mechanism']}, {shape}, ε = {st['epsilon']:g}): {st['reports']:,} reports"


def _accuracy(res: dict[str, Any]) -> tuple[list[str], int, int]:
    """Table rows of the largest round's estimates against the truth; (rows, values covered, values)."""
    estimates = res["latency"][-1]["estimates"]
    rows, covered, total = [], 0, 0
    for name, st in res["streams"].items():
        e = estimates[name]
        truth = np.asarray(st["truth"], dtype=float)
        est, lo, hi, se = (np.asarray(e[k], dtype=float) for k in ("raw", "ci_low", "ci_high", "stderr"))
        inside = int(np.sum((truth >= lo) & (truth <= hi)))
        covered, total = covered + inside, total + truth.size
        err = np.abs(est - truth)
        j = int(np.argmax(err))
        scale = "" if st["hi"] is None else f" (range 0–{st['hi']:g})"
        rows.append(f"| {name} | {e['mechanism']}{scale} | {e['n']:,} | {truth.size} | {err[j]:.3g} "
                    f"({e['labels'][j]}: {est[j]:.3g} vs {truth[j]:.3g}) | {np.max(err / se):.2f} | "
                    f"{inside} of {truth.size} |")
    return rows, covered, total


def _flat(per_stream: dict[str, list[float]]) -> list[float]:
    return [x for xs in per_stream.values() for x in xs]


def _drain_rows(d: dict[str, Any], n: int, raw: float) -> list[str]:
    """The drain table's rows of one coordinator (one protocol)."""
    rows = [f"| coordinator over MQTT {d['protocol']}: drain of {n:,} queued reports, first to last commit | "
            f"{d['rate']:,.0f} | {100 * d['rate'] / raw:.0f} % | "
            + (f"{len(d['exits'])} exits and restarts included; " if d["exits"] else "")
            + f"{d['batches']:,} batches (mean {n / d['batches']:,.0f} reports); "
            f"{d['cpu_us']:.0f} µs CPU per report (start-ups left out): coordinator {d['cpu_main_us']:.0f}, its "
            f"MQTT receiver {d['cpu_us'] - d['cpu_main_us']:.0f}, and mosquitto {d['broker_cpu_us']:.0f} more; load "
            f"{d['load'][0]} → {d['load'][1]} |"]
    if d["gaps"]:
        rows.append(f"| coordinator over MQTT {d['protocol']}, within its runs (the {d['gaps']} gaps between runs "
                    f"left out) | {d['rate_within']:,.0f} | {100 * d['rate_within'] / raw:.0f} % | the drain "
                    "without the exits |")
    return rows


def _drain_conclusion(d: dict[str, Any], n: int, raw: float) -> str:
    ratio, within = d["rate"] / raw, d["rate_within"] / raw
    cpu_budget = 2e6 / (TARGET_RATIO * raw)  # µs of CPU per report two cores allow at the target rate
    return (f"- Drain over MQTT {d['protocol']}: {d['rate']:,.0f} reports/s is {100 * ratio:.0f} % of mosquitto_pub's "
            f"{raw:,.0f}/s for the same payloads in this run: {'meets' if ratio >= TARGET_RATIO else 'misses'} the "
            f"≥ {100 * TARGET_RATIO:.0f} % target; {n:,} reports drained in {n / d['rate']:,.0f} s"
            + (f", {len(d['exits'])} exits of the coordinator included; within its runs it drained "
               f"{d['rate_within']:,.0f}/s ({100 * within:.0f} %, "
               f"{'meeting' if within >= TARGET_RATIO else 'missing'} the target)" if d["exits"] else "")
            + f". It took {d['cpu_us'] + d['broker_cpu_us']:.0f} µs of CPU per report with mosquitto's; the target "
            f"rate leaves two cores {cpu_budget:.0f} µs per report, and one core — the coordinator process, whose "
            f"Python holds one GIL — {cpu_budget / 2:.0f} µs (it took {d['cpu_main_us']:.0f}).")


def render(res: dict[str, Any]) -> str:
    """The Markdown section: tables and conclusions computed from :func:`measure`'s numbers."""
    n, drains, raw = res["n"], res["drains"], res["raw"]
    d = drains[0]
    lat = res["latency"]
    rss = d["rss_main"] + d["rss_receiver"]
    protocols = " and ".join(f"MQTT {x['protocol']} ({_PROTOCOL_ROLE.get(x['protocol'], 'a setting')})"
                             for x in drains)
    out = [
        "## Fleet scale: one round, one coordinator",
        "",
        f"Measured {res['date']}. {n:,} enrolled devices with HMAC-SHA256 report keys (enrolled in "
        f"{res['enrol_s']:.1f} s: one "
        "`executemany` into the devices table, one transaction), one round of three streams — "
        + ", ".join(_stream_text(name, st) for name, st in res["streams"].items())
        + f" — each device reporting one stream: {n:,} reports of {res['size']:.0f} bytes on average, privatized "
        f"and signed in {res['sign_s']:.0f} s to a file, in a random arrival order. One mosquitto on loopback "
        f"(persistence on, saved every {shipped_option('autosave_interval')} s as the shipped broker is, a queue of up "
        f"to {n:,} messages per session, an in-flight window of "
        f"{IngestSettings().receive_maximum:,} messages per client: the receiver's MQTT 5 Receive Maximum, and the "
        "broker's `max_inflight_messages` for MQTT 3.1.1), QoS 1. The coordinator is `haarvest coordinator run` "
        f"(batch ≤ {defaults.BATCH_SIZE:,} / 20 ms, each batch validated while the previous one commits; SQLite WAL "
        f"synchronous=FULL, a {SQLITE_CACHE_KIB // 1024} MiB page cache, the stream aggregates in the same "
        f"transaction), over {protocols}, each into a store of its own, draining in "
        "turn the queue the broker kept for its persistent session while it was stopped (the round queued for "
        f"each coordinator alone, just before its drain). Load average (1 min) {res['load_start']} at the start, "
        f"{res['load_end']} at the end; 2 cores. A fixed pure-Python loop "
        f"(:func:`simulations.proc_stats.python_speed`) took {res['speed_start']:.0f} ns per step at the start and "
        f"{res['speed_end']:.0f} at the end: this shared virtual machine's speed changes between runs, and the "
        "coordinator's CPU-bound Python with it, mosquitto_pub's rate far less.",
        "",
        "| path | reports/s | vs mosquitto_pub | note |",
        "|---|---:|---:|---|",
        f"| raw: mosquitto_pub -l → mosquitto_sub (QoS 1), same payloads | {raw:,.0f} | 100 % | "
        f"load {res['raw_load'][0]} → {res['raw_load'][1]} |",
        *[row for x in drains for row in _drain_rows(x, n, raw)],
        *[f"| (queueing them for the MQTT {x['protocol']} coordinator: paho publisher process → broker, "
          f"coordinator stopped) | {x['queue_rate']:,.0f} | {100 * x['queue_rate'] / raw:.0f} % | not a target; load "
          f"{x['queue_load'][0]} → {x['queue_load'][1]} |" for x in drains],
        "",
        f"| memory (MQTT {d['protocol']}) | size | per device |",
        "|---|---:|---:|",
        f"| coordinator, main process (validate + commit), peak RSS | {_mib(d['rss_main'])} | "
        f"{d['rss_main'] / n:,.0f} B |",
        f"| coordinator, MQTT receiver process, peak RSS | {_mib(d['rss_receiver'])} | "
        f"{d['rss_receiver'] / n:,.0f} B |",
        f"| mosquitto, peak RSS ({n:,} reports queued at once) | {_mib(res['broker_rss'])} | "
        f"{res['broker_rss'] / n:,.0f} B |",
        f"| SQLite file after the stop (devices, round, reports, aggregates) | {_mib(res['db_bytes'])} | "
        f"{res['db_bytes'] / n:,.0f} B |",
        "",
        f"The coordinator started in {d['startup_s']:.1f} s ({d['startup_cpu']:.1f} CPU s) with its {n:,} devices "
        "loaded and an empty queue.",
    ]
    for x in drains:
        if x["exits"]:
            out += ["", f"**The coordinator over MQTT {x['protocol']} exited {len(x['exits'])} times during the "
                    f"drain** (exit code {', '.join(map(str, sorted(set(x['exits']))))}), each time restarted "
                    f"{x['restart_s']:g} s later (the shipped unit's `RestartSec`); {x['duplicates']:,} redelivered "
                    "reports were already stored (`duplicate`). It said: "
                    + "; ".join(f"“{e}”" for e in x["errors"]) + "."]
    out += [
        "",
        "Estimate latency, each size in a fresh process after the coordinator stopped: the process's first "
        "`estimate_round` of the whole round (cold: imports and first-use set-up) and first HTTP request apart, "
        f"then {res['reps']} repetitions of `estimate_round` per stream, of the whole round and of an uncached "
        f"`GET /api/estimates/{ROUND}` (every stream, JSON); the old path (every body re-read, decoded and "
        f"estimated, as for a stale stream) {res['old_reps']} times per stream below 10⁶ reports, "
        f"{res['old_reps_full']} at 10⁶. Milliseconds, median / max.",
        "",
        "| stored reports | first call, cold (round / HTTP) | per stream, aggregates | whole round, aggregates | "
        "HTTP estimate endpoint | per stream, old path (bodies) | old / new (median) | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in lat:
        (nm, nx), (wm, wx), (hm, hx), (om, ox) = (_ms(_flat(r["new"])), _ms(r["whole"]), _ms(r["http"]),
                                                  _ms(_flat(r["old"])))
        out.append(f"| {r['n']:,} | {_f(1e3 * r['cold'])} / {_f(1e3 * r['http_cold'])} | {_f(nm)} / {_f(nx)} | "
                   f"{_f(wm)} / {_f(wx)} | {_f(hm)} / {_f(hx)} | {_f(om)} / {_f(ox)} | {om / nm:,.0f}× | "
                   f"{r['load'][0]} → {r['load'][1]} |")
    acc, covered, total = _accuracy(res)
    out += [
        "",
        f"The round's estimates at {lat[-1]['n']:,} reports against the devices' true values (95 % intervals):",
        "",
        "| stream | mechanism | reports | values | largest error (where: estimate vs truth) | largest error / "
        "stderr | truth inside the interval |",
        "|---|---|---:|---:|---|---:|---:|",
        *acc,
        "",
        "Conclusions (computed from the tables above):",
        "",
        *[_drain_conclusion(x, n, raw) for x in drains],
    ]
    worst = [1e3 * max(_flat(r["new"])) for r in lat]
    out.append("- Estimates from the aggregates: the slowest single-stream estimate took "
               + ", ".join(f"{_f(w)} ms at {r['n']:,}" for w, r in zip(worst, lat))
               + " stored reports (whole round: " + ", ".join(_f(1e3 * max(r["whole"])) for r in lat) + " ms): "
               + ("meets" if all(w <= TARGET_MS for w in worst) else "misses")
               + f" the ≤ {TARGET_MS:.0f} ms target at every size. A fresh process's first estimate pays its imports "
               "and set-up once: " + ", ".join(f"{_f(1e3 * r['cold'])} ms" for r in lat) + ".")
    lo, hi = lat[0], lat[-1]
    med = [statistics.median(_flat(r["new"])) for r in (lo, hi)]
    med_old = [statistics.median(_flat(r["old"])) for r in (lo, hi)]
    out.append(f"- From {lo['n']:,} to {hi['n']:,} stored reports ({hi['n'] / lo['n']:,.0f}× more) the median "
               f"estimate went from {_f(1e3 * med[0])} to {_f(1e3 * med[1])} ms with aggregates "
               f"({med[1] / med[0]:.1f}×) and from {_f(1e3 * med_old[0])} to {_f(1e3 * med_old[1])} ms on the old "
               f"path ({med_old[1] / med_old[0]:.0f}×); the two paths' unbiased estimates agree to "
               f"{max(r['agree'] for r in lat):.1e} at every size.")
    worst_http = [1e3 * max(r["http"]) for r in lat]
    over = [r for w, r in zip(worst_http, lat) if w > TARGET_MS]
    out.append("- The HTTP endpoint (every stream of the round, uncached) took at most "
               + ", ".join(f"{_f(w)} ms at {r['n']:,}" for w, r in zip(worst_http, lat))
               + (": within the target too" if not over else
                  ": over the target at " + ", ".join(f"{r['n']:,}" for r in over))
               + f"; its median went from {_f(1e3 * statistics.median(lo['http']))} to "
               f"{_f(1e3 * statistics.median(hi['http']))} ms. Besides the estimates it reads the round's report count "
               "to key its cache (`Store.round_report_count`: the aggregates' n, a few rows): "
               + ", ".join(f"{_f(1e3 * statistics.median(r['counts']))} ms" for r in lat) + " (median) at these sizes.")
    out.append(f"- Memory: the coordinator peaked at {_mib(rss)} for {n:,} devices ({rss / n:,.0f} B per device, both "
               f"processes), mosquitto at {_mib(res['broker_rss'])} with the whole round queued; the SQLite file "
               f"holds {res['db_bytes'] / n:,.0f} B per device and report.")
    out.append(f"- Accuracy: {covered} of {total} true values lie inside their 95 % intervals "
               f"({100 * covered / total:.0f} %).")
    return "\n".join(out) + "\n"


def run(quick: bool = False, devices: int | None = None) -> str:
    """The section (``make bench``): N from ``devices``, else ``$HAARVEST_BENCH_FLEET_N``, else 2,000 quick / 10⁶."""
    n = devices or int(os.environ.get(ENV_N) or (QUICK_N if quick else FULL_N))
    reps, old_reps = (5, 2) if quick else (20, 5)
    only = os.environ.get(ENV_PROTOCOL)
    if only and only not in PROTOCOLS:
        raise ValueError(f"{ENV_PROTOCOL} must be one of {', '.join(PROTOCOLS)}, got {only!r}")
    return render(measure(n, (only,) if only else PROTOCOLS, reps, old_reps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--devices", type=int, default=None, help=f"fleet size (default {FULL_N:,}; ${ENV_N})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_N:,} devices")
    parser.add_argument("--latency", metavar="DB", help=argparse.SUPPRESS)  # the fresh estimate-latency process
    parser.add_argument("--reps", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--old-reps", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.latency:
        print(json.dumps(measure_latency(args.latency, args.reps, args.old_reps)))
        return 0
    print(run(quick=args.quick, devices=args.devices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
