"""``haarvest demo``: a broker, the coordinator and a fleet of real agents, end to end, on one machine.

What runs (``make demo``; docs/demo.md):

1. an MQTT broker on a free loopback port — mosquitto if installed, else the embedded amqtt (MQTT 3.1.1 only;
   :mod:`simulations.broker`);
2. the coordinator (:class:`coordinator.service.Coordinator`: MQTT ingest, SQLite store, signed rounds, HTTP
   dashboard on a free port);
3. N agents (:class:`edge_agent.Agent`, each with its own state directory — ledger, memo, outbox — and its own
   Ed25519 identity and HMAC secret, one MQTT connection each), driven by :func:`edge_agent.run_fleet` in worker
   processes of at most :data:`AGENTS_PER_PROCESS` agents (paho's network loop uses ``select()``, which cannot watch
   file descriptors ≥ 1024; an agent holds about six: its MQTT socket and wake-up pair, SQLite's db/WAL/shm).
   Device i replays row i of a seeded sample of the Adult data (``data/adult``, shipped with the repository),
   decoded with its codebook (``data/adult/codebook.json``): age and hours-per-week as the midpoint of their bin
   (years, hours per week), education-num as its level 1–16, sex and native-country by name; plus two synthetic
   evolving dimensions: ``load`` (a per-device baseline in %, a population trend of +6 per round and per-round
   noise) and ``app`` (one of 8 named apps, redrawn with probability 0.25 each round from a popularity that drifts
   towards ``maps``); and one volatile, heavy-tailed one, ``latency`` (ms, :meth:`DemoData.latency_model`: a
   per-device log-normal baseline, fresh log-normal jitter every round and a congestion episode that slows a
   varying share of the devices several-fold);
4. R rounds. Round 1 asks for the devices' own stream specs (``Agent.stream_specs()``: bounds and mechanisms are the
   devices') plus a heavy-hitter round on ``country`` (top 2 bits of a 6-bit code). Every later round is planned by
   :meth:`coordinator.rounds.RoundManager.open_next_round` from the earlier rounds' *published aggregates* only
   (SPEC §5, sequential interaction): α-rounding steps from the volatility of the estimated means, and the next
   heavy-hitter prefixes from the significant items of the previous round;
5. after each round the coordinator's estimates (with confidence intervals) are compared with the truth, which the
   demo knows because it generated the readings — for ``latency`` the fleet's p50 and p95 (the estimate's
   quantiles and their intervals, :mod:`coordinator.estimate`) against the true p50 and p95 of the devices'
   readings that round.

Streams (per device, per round): ``profile`` — the Haar record mechanism (:class:`protocols.pipeline.HaarRecord`,
ε = 4) over (age, education, hours); ``load`` — HM (ε = 2), α-rounded with the planned steps; ``sex`` — ``auto``
(ε = 1, GRR); ``country`` — OUE (ε = 2) over the round's heavy-hitter items; ``app`` — LOLOHA (ε∞ = 4, ε1 = 2),
its memoized PRR re-randomized by a fresh IRR in every report; ``latency`` — a distribution stream
(``distribution_auto``, ε = 4, D = 32 buckets over [0, 1000] ms: the least-variance mechanism for the CDF). The
devices run the default ``device`` privacy unit
(edge_agent.config): every report is a fresh randomization charged its ε (LOLOHA: its IRR's ε for an arbitrary
input change), so each device's ledger total bounds everything it released against any other readings; nothing is
served from a memo. The ε are large because a few hundred devices is a tiny population for LDP (interval widths
shrink as 1/√n). The table shows the *unbiased* estimates and their intervals (no consistency post-processing), so
the coverage can be checked.

Output: the table of true vs estimated values on stdout, and in ``--out``: ``report.html`` (charts with bands and
the truth, the table), ``dashboard.html`` (the coordinator's live dashboard page), ``estimates.json`` and the run's
state (``run/``: coordinator database, agents' databases, broker log).
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import math
import multiprocessing as mp
import queue
import shutil
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from simulations.datasets import adult_codebook, bin_midpoints, load_adult

__all__ = ["DemoConfig", "DemoResult", "DemoData", "run_demo", "register", "load_adult_rows", "QUICK"]

#: ``--quick`` (CI): fewer agents and rounds.
QUICK = {"agents": 60, "rounds": 3}
#: Agents per worker process (each agent holds ~6 file descriptors; paho's select() loop stops at fd 1024).
AGENTS_PER_PROCESS = 100
#: Adult columns used (demo dimension → codebook column, data/adult/codebook.json). The devices read decoded values:
#: age and hours-per-week the midpoint of their bin (years, hours per week), education-num its level 1–16 (9 =
#: HS-grad, 13 = Bachelors), sex and native-country their category (the estimates are labelled with the names).
ADULT_COLUMNS = {"age": "age", "education": "education_num", "hours": "hours_per_week", "sex": "sex",
                 "country": "native_country"}
#: The synthetic ``app`` dimension's categories (``maps`` grows more popular round by round).
APP_NAMES = ("browser", "mail", "video", "maps", "music", "chat", "camera", "games")
APP_K = len(APP_NAMES)
HH_BITS = 6
#: The ``latency`` distribution stream: declared bounds (ms; slower requests time out at 1 s — the device clips),
#: buckets of its public grid, and the quantiles the demo compares with the truth.
LATENCY_BOUNDS = (0.0, 1000.0)
LATENCY_BUCKETS = 32
QUANTILES = (0.5, 0.95)
#: The most ε a round may ask of a device: profile 4 + load 2 + sex 1 + country 2 + app ε∞ 4 + latency 4 (large: 200
#: devices is a tiny population for LDP — interval widths shrink as 1/√n). Under the device unit every report is
#: charged.
ROUND_EPSILON = 17.0


@dataclass
class DemoConfig:
    agents: int = 200
    rounds: int = 4
    out: Path = Path("demo-output")
    quick: bool = False
    seed: int = 20261122
    broker: str = "auto"
    level: float = 0.95
    serve: bool = False
    round_timeout: float = 60.0
    adult_dir: Path | None = None


@dataclass
class DemoResult:
    """What the demo measured: per-round table rows, timings, counters, output paths."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    setup_seconds: float = 0.0
    broker: str = ""
    agents: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)
    report_path: Path | None = None
    dashboard_path: Path | None = None
    repeated: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def coverage(self) -> float:
        inside = [r["inside"] for r in self.rows]
        return float(np.mean(inside)) if inside else float("nan")


# ---------------------------------------------------------------------------------------------------- data


def load_adult_rows(directory: Path | None = None) -> np.ndarray:
    """The coarse Adult table (rows × 15 integer codes, :func:`simulations.datasets.load_adult`: ``data/adult``
    or ``HAARVEST_ADULT_DIR``); :class:`~simulations.datasets.DatasetError` (a ValueError) if missing or malformed."""
    return np.asarray(load_adult(directory).data, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def _codebook() -> dict[str, dict]:
    return adult_codebook()


def _adult_dimensions() -> list[dict[str, Any]]:
    """The device's Adult dimensions, decoded: numeric ones on their codebook range with units, categorical ones
    with their category names."""
    from edge_agent.embed import categorical, numeric

    book, dims = _codebook(), []
    for name, column in ADULT_COLUMNS.items():
        entry = book[column]
        if entry["kind"] == "bins":
            dims.append(numeric(name, float(entry["bins"][0][0]), float(entry["bins"][-1][1]), units=entry["units"]))
        else:
            dims.append(categorical(name, len(entry["labels"]), categories=list(entry["labels"])))
    return dims


class DemoData:
    """Every device's reading in every round (seeded), and the truth the estimates are compared with."""

    def __init__(self, n: int, rounds: int, rng: np.random.Generator, adult: np.ndarray) -> None:
        if n < 2 or rounds < 1:
            raise ValueError("the demo needs at least 2 agents and 1 round")
        idx = rng.choice(adult.shape[0], size=n, replace=n > adult.shape[0])
        rows = adult[idx]
        self.n, self.rounds = n, rounds
        book = _codebook()
        self.static = {}
        for name, column in ADULT_COLUMNS.items():
            entry = book[column]
            codes = rows[:, entry["column"]]
            self.static[name] = bin_midpoints(entry)[codes] if entry["kind"] == "bins" else codes
        base = 8.0 + 50.0 * rng.beta(2.0, 4.0, n)
        self.load = np.clip(base[None, :] + 6.0 * np.arange(rounds)[:, None] + rng.normal(0, 4.0, (rounds, n)), 0, 100)
        app = np.empty((rounds, n), dtype=np.int64)
        pop0 = np.array([30, 20, 15, 5, 10, 8, 7, 5], dtype=float)
        for r in range(rounds):
            pop = pop0.copy()
            pop[3] += 12.0 * r  # app 3 gets more popular
            pop /= pop.sum()
            fresh = rng.choice(APP_K, size=n, p=pop)
            app[r] = fresh if r == 0 else np.where(rng.random(n) < 0.25, fresh, app[r - 1])
        self.app = app
        self.latency = self.latency_model(n, rounds, rng)

    #: Share of the devices caught in the congestion episode, round by round (then again from the start).
    CONGESTED = (0.04, 0.12, 0.22, 0.08)

    @classmethod
    def latency_model(cls, n: int, rounds: int, rng: np.random.Generator) -> np.ndarray:
        """(rounds, n) request latencies in ms, a volatile heavy-tailed device metric: device i's baseline
        ``b_i ~ LogNormal(ln 60, 0.45)`` (its network), times fresh ``LogNormal(0, 0.3)`` jitter every round, times
        a slow-down ``2.5·(1 + Lomax(2))`` (median ×3.5, a Pareto tail) for a fresh random share of the devices
        (:data:`CONGESTED`, round by round): the fleet's p95 about doubles as the episode peaks (round 3) and falls
        back, its p50 moves by a few ms. The few values above the declared 1000 ms are clipped by the devices."""
        base = np.exp(rng.normal(np.log(60.0), 0.45, n))
        jitter = np.exp(rng.normal(0.0, 0.3, (rounds, n)))
        share = np.array([cls.CONGESTED[r % len(cls.CONGESTED)] for r in range(rounds)])[:, None]
        slow = np.where(rng.random((rounds, n)) < share, 2.5 * (1.0 + rng.pareto(2.0, (rounds, n))), 1.0)
        return base[None, :] * jitter * slow

    def reading(self, i: int, r: int) -> dict[str, Any]:
        s = self.static
        return {"age": float(s["age"][i]), "education": float(s["education"][i]), "hours": float(s["hours"][i]),
                "sex": int(s["sex"][i]), "country": int(s["country"][i]), "load": float(self.load[r, i]),
                "app": int(self.app[r, i]), "latency": float(self.latency[r, i])}

    def truth(self, r: int, spec: Any, stream: str) -> list[float]:
        """The true value of each estimated quantity of ``stream`` in round r (means in x units, frequencies; for
        ``latency`` the true CDF at the right edges of the round's bucket grid — the fraction of devices in
        buckets 0..j, what the estimate's ``cdf`` estimates)."""
        from protocols.contract import heavy_hitter_items

        if stream == "latency":
            grid = spec.grid()
            return (np.cumsum(np.bincount(grid.bucket(self.latency[r]), minlength=grid.D)) / self.n).tolist()

        s = self.static
        if stream == "profile":  # means of the decoded values (years, level, hours per week)
            return [float(s["age"].mean()), float(s["education"].mean()), float(s["hours"].mean())]
        if stream == "load":
            return [float(self.load[r].mean())]
        if stream == "sex":
            return (np.bincount(s["sex"], minlength=2) / self.n).tolist()
        if stream == "app":
            return (np.bincount(self.app[r], minlength=APP_K) / self.n).tolist()
        if stream == "country":
            hh = spec.heavy_hitters
            items = heavy_hitter_items(hh, s["country"]) if hh is not None else s["country"]
            return (np.bincount(items, minlength=int(spec.params["k"])) / self.n).tolist()
        raise KeyError(stream)

    def true_quantiles(self, r: int, qs: tuple[float, ...] = QUANTILES) -> list[float]:
        """The fleet's true q-quantiles of ``latency`` in round r: ``inf{x : F_n(x) ≥ q}`` of the devices' readings
        clipped to the declared bounds (as the devices clip; the estimate's quantile is the same generalised
        inverse, of its CDF, interpolated linearly inside a bucket — :mod:`protocols.distribution.result`)."""
        x = np.clip(self.latency[r], *LATENCY_BOUNDS)
        return [float(v) for v in np.quantile(x, qs, method="inverted_cdf")]


# ---------------------------------------------------------------------------------------------------- fleet


def _device_config(i: int, run_dir: Path, broker: Any, coord_pub: str) -> Any:
    from edge_agent.embed import categorical, numeric, simple_config

    dims = _adult_dimensions() + [numeric("load", 0, 100, units="%"),
                                  categorical("app", APP_K, categories=list(APP_NAMES)),
                                  numeric("latency", *LATENCY_BOUNDS, units="ms")]
    streams = [
        {"name": "profile", "dimensions": ["age", "education", "hours"], "mechanism": "haar", "epsilon": 4.0},
        {"name": "load", "dimensions": ["load"], "mechanism": "hybrid", "epsilon": 2.0},
        {"name": "sex", "dimensions": ["sex"], "mechanism": "auto", "epsilon": 1.0},
        {"name": "country", "dimensions": ["country"], "mechanism": "oue", "epsilon": 2.0},
        {"name": "app", "dimensions": ["app"], "mechanism": "loloha", "epsilon_1": 2.0, "epsilon_inf": 4.0,
         "params": {"g": "optimal"}},
        {"name": "latency", "dimensions": ["latency"], "mechanism": "distribution_auto", "epsilon": 4.0,
         "params": {"D": LATENCY_BUCKETS}},
    ]
    return simple_config(
        f"demo-{i:04d}", run_dir / "agents" / f"demo-{i:04d}", dims, streams,
        total_cap=500.0, coordinator_public_key=coord_pub, schedule="rounds", sample_interval_s=86400.0,
        privacy={"epsilon": 1.0, "max_round_epsilon": ROUND_EPSILON},
        mqtt={"host": broker.host, "port": broker.port, "protocol": broker.protocol, "keepalive": 60,
              "reconnect_min_s": 1, "reconnect_max_s": 5, "max_inflight": 20},
    )


def _first_round_params(specs: dict[str, Any]) -> dict[str, Any]:
    """Round 1: the devices' own stream specs, and the first heavy-hitter step on ``country`` (top 2 of 6 bits)."""
    from protocols.contract import HeavyHitterSpec

    streams = json.loads(json.dumps(specs))
    hh = HeavyHitterSpec(bits=HH_BITS, prefix_bits=0, step_bits=2, candidates=[0])
    streams["country"]["heavy_hitters"] = hh.model_dump()
    streams["country"]["params"] = {**streams["country"]["params"], "k": hh.k}
    return {"streams": streams}


@dataclass(frozen=True)
class _BrokerAddress:
    host: str
    port: int
    protocol: str


def _fleet_worker(indices: list[int], data: DemoData, broker: _BrokerAddress, coord_pub: str, run_dir: str,
                  current_round: Any, stop: Any, results: Any, connect_timeout: float) -> None:
    """One worker process: its shard of agents under :func:`edge_agent.run_fleet` until ``stop`` is set.

    Messages on ``results``: ``("enrol", [records])``, ``("ready", n_connected)``, ``("done", {spent, memo_hits})``
    or ``("error", text)``.
    """
    try:
        from simulations.broker import die_with_parent

        die_with_parent()  # a demo killed outright leaves no worker behind
        from edge_agent import Agent, run_fleet
        from edge_agent.embed import enrolment, new_identity
        from edge_agent.sources import CallableSource
        from edge_agent.state import State

        agents = [Agent(_device_config(i, Path(run_dir), broker, coord_pub),
                        CallableSource(lambda i=i: data.reading(i, current_round.value)), secrets=new_identity())
                  for i in indices]
        results.put(("enrol", [enrolment(a.config, a.secrets) for a in agents]))
        halt = threading.Event()
        fleet = threading.Thread(target=run_fleet, args=(agents,),
                                 kwargs={"stop": halt, "poll_s": 0.02, "drain_timeout": 15.0}, daemon=True)
        fleet.start()
        _wait_for(lambda: all(a.transport is not None and a.transport.connected.is_set() for a in agents),
                  connect_timeout)
        results.put(("ready", sum(a.transport is not None and a.transport.connected.is_set() for a in agents)))
        while not stop.wait(0.2):
            pass
        halt.set()
        fleet.join(60)
        spent, hits = [], 0
        for a in agents:
            st = State(a.config.database_path)
            try:
                spent.append(st.spent())
                hits += int(st.counters().get("memo_hits", 0))
            finally:
                st.close()
        results.put(("done", {"spent": spent, "memo_hits": hits}))
    except BaseException as exc:  # noqa: BLE001 - report any failure to the parent, which stops the demo
        import traceback

        results.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class _Fleet:
    """The worker processes of the demo's fleet (spawned: no inherited threads or sockets)."""

    def __init__(self, data: DemoData, broker: Any, coord_pub: str, run_dir: Path, connect_timeout: float = 90.0):
        n = data.n
        procs = max(1, math.ceil(n / AGENTS_PER_PROCESS))
        ctx = mp.get_context("spawn")
        self.round = ctx.Value("i", 0)
        self.stop = ctx.Event()
        self.results = ctx.Queue()
        addr = _BrokerAddress(broker.host, broker.port, broker.protocol)
        shards = [list(range(n))[k::procs] for k in range(procs)]
        self.procs = [ctx.Process(target=_fleet_worker, name=f"haarvest-demo-fleet-{k}",
                                  args=(shard, data, addr, coord_pub, str(run_dir), self.round, self.stop,
                                        self.results, connect_timeout), daemon=True)
                      for k, shard in enumerate(shards)]
        for p in self.procs:
            p.start()

    def collect(self, kind: str, timeout: float) -> list[Any]:
        """One ``kind`` message from every worker (RuntimeError on a worker error or timeout)."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < len(self.procs):
            try:
                got, payload = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"fleet workers did not report {kind!r} within {timeout:.0f} s") from None
            if got == "error":
                raise RuntimeError(f"a fleet worker failed: {payload}")
            if got != kind:
                raise RuntimeError(f"fleet worker sent {got!r}, expected {kind!r}")
            out.append(payload)
        return out

    def close(self, timeout: float = 60.0) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout)
            if p.is_alive():
                p.terminate()
                p.join(5)


def _prefixes(hh: Any) -> str:
    """A heavy-hitter step's candidate prefixes, with the countries each still covers."""
    if not hh.prefix_bits:
        return "every country (the first step)"
    names = _codebook()["native_country"]["labels"]
    parts = [f"{c:0{hh.prefix_bits}b}… ({hh.prefix_name(c, hh.prefix_bits, names)})" for c in hh.candidates]
    return "prefixes " + ", ".join(parts)


def _wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()


def _wait_round(coord: Any, round_id: str, expected: int, timeout: float, settle: float = 4.0) -> int:
    """Wait until ``expected`` reports of the round are stored, or nothing new arrived for ``settle`` seconds."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        got = sum(coord.store.report_counts(round_id).values())
        if got >= expected:
            return got
        if got != last:
            last, last_change = got, time.monotonic()
        elif got > 0 and time.monotonic() - last_change > settle:
            return got
        time.sleep(0.05)
    return max(last, 0)


# ---------------------------------------------------------------------------------------------------- report


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}"


def _rows_for(rid: str, stream: str, est: Any, truth: list[float], level: float) -> list[dict[str, Any]]:
    out = []
    for j, label in enumerate(est.labels):
        t = truth[j] if j < len(truth) else float("nan")
        unit = est.units[j] if j < len(est.units) and est.units[j] else ""
        out.append({"round": rid, "stream": stream, "kind": est.kind, "item": label, "unit": unit, "n": est.n,
                    "true": t,
                    "estimate": est.estimate[j], "ci_low": est.ci_low[j], "ci_high": est.ci_high[j],
                    "stderr": est.stderr[j], "inside": bool(est.ci_low[j] - 1e-12 <= t <= est.ci_high[j] + 1e-12),
                    "level": level})
    return out


def _quantile_rows(rid: str, stream: str, est: Any, truth: list[float], level: float) -> list[dict[str, Any]]:
    """A distribution stream's rows: its estimated quantiles :data:`QUANTILES` (``est.quantiles``) with their
    intervals from the inverted CDF band, next to the true quantiles ``truth``. No standard error (the interval is
    not symmetric); a missing interval (a mechanism without a variance) is NaN and counts as not covering."""
    got = {round(q["q"], 9): q for q in est.quantiles}
    unit = est.units[0] if est.units and est.units[0] else ""
    out = []
    for q, t in zip(QUANTILES, truth):
        e = got.get(round(q, 9))
        if e is None:
            continue
        lo, hi = (float("nan") if e[k] is None else float(e[k]) for k in ("low", "high"))
        out.append({"round": rid, "stream": stream, "kind": est.kind, "item": f"p{100 * q:g}", "unit": unit,
                    "n": est.n, "true": t, "estimate": float(e["value"]), "ci_low": lo, "ci_high": hi,
                    "stderr": None, "inside": bool(lo - 1e-9 <= t <= hi + 1e-9), "level": level,
                    "top_bucket": est.edges[-2:]})
    return out


def bound_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per quantile whose interval reached into the top bucket of its grid in some round — its upper end
    is then the declared bound: the fleet is too small, at its ε, to bound that quantile from above (docs/demo.md)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "distribution":
            groups.setdefault((r["stream"], r["item"]), []).append(r)
    notes = []
    for (stream, item), rs in groups.items():
        reached = sum(r["ci_high"] > r["top_bucket"][0] for r in rs)
        if reached:
            unit = f" {rs[0]['unit']}" if rs[0]["unit"] else ""
            notes.append(f"{stream} {item}: its interval ran into the top bucket (up to the declared "
                         f"{rs[0]['top_bucket'][1]:g}{unit}) in {reached} of {len(rs)} rounds — {rs[0]['n']} devices "
                         "cannot bound it from above at this ε; its lower end still holds")
    return notes


def _shown(row: dict[str, Any]) -> bool:
    """Printed rows: every numeric row and quantile; frequency items that matter (true or estimated ≥ 5%)."""
    if row["kind"] in ("numeric", "vector", "haar", "distribution"):
        return True
    return max(row["true"], row["estimate"]) >= 0.05


def format_table(rows: list[dict[str, Any]], level: float) -> str:
    head = (f"{'round':<6} {'stream':<8} {'item':<22} {'true':>9} {'estimate':>9}  {int(level * 100)}% interval{'':<9}"
            " in CI")
    lines = [head, "-" * len(head)]
    for r in rows:
        if not _shown(r):
            continue
        ci = f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
        item = f"{r['item']} ({r['unit']})" if r.get("unit") else str(r["item"])
        lines.append(f"{r['round']:<6} {r['stream']:<8} {item[:22]:<22} {_fmt(r['true']):>9} "
                     f"{_fmt(r['estimate']):>9}  {ci:<21} {'yes' if r['inside'] else 'NO'}")
    return "\n".join(lines)


def _quantile_charts(rows: list[dict[str, Any]]) -> list[str]:
    """Per distribution stream and quantile, the estimate over the rounds with its interval and the true quantile
    (:func:`coordinator.api.svg_band_chart`), from the table's rows."""
    from coordinator.api import svg_band_chart

    charts = []
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == "distribution":
            series.setdefault((r["stream"], r["item"]), []).append(r)
    for (stream, item), pts in series.items():
        unit = f" ({pts[0]['unit']})" if pts[0]["unit"] else ""
        charts.append(svg_band_chart(
            f"{stream} — fleet {item} per round (n={pts[-1]['n']})", [p["round"] for p in pts],
            [p["estimate"] for p in pts], [p["ci_low"] for p in pts], [p["ci_high"] for p in pts],
            [p["true"] for p in pts], ylabel=f"{item} {stream}{unit}", level=float(pts[-1]["level"])))
    return charts


def _html_table(rows: list[dict[str, Any]]) -> str:
    body = "".join(
        f"<tr><td>{html.escape(r['round'])}</td><td>{html.escape(r['stream'])}</td>"
        f"<td>{html.escape(str(r['item']) + (' (' + r['unit'] + ')' if r.get('unit') else ''))}</td>"
        f"<td class=num>{r['n']}</td><td class=num>{_fmt(r['true'])}</td><td class=num>{_fmt(r['estimate'])}</td>"
        f"<td class=num>[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]</td>"
        f"<td class='{'' if r['inside'] else 'miss'}'>{'yes' if r['inside'] else 'no'}</td></tr>"
        for r in rows)
    return ("<table><tr><th>round</th><th>stream</th><th>item</th><th>n</th><th>true</th><th>estimate</th>"
            f"<th>interval</th><th>in CI</th></tr>{body}</table>")


# ---------------------------------------------------------------------------------------------------- run


def run_demo(cfg: DemoConfig, log: Callable[[str], None] = print) -> DemoResult:
    """Run the whole demo (see the module docstring); returns what it measured."""
    from protocols.contract import parse_round_params
    from coordinator.service import Coordinator, CoordinatorConfig
    from edge_agent.plans import stream_specs
    from simulations.broker import start_broker

    t0 = time.monotonic()
    out = Path(cfg.out)
    run_dir = out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # every demo starts from fresh devices and a fresh coordinator
    run_dir.mkdir(parents=True)
    rng = np.random.default_rng(cfg.seed)
    data = DemoData(cfg.agents, cfg.rounds, rng, load_adult_rows(cfg.adult_dir))
    result = DemoResult(agents=cfg.agents)

    broker = start_broker(run_dir / "broker", kind=cfg.broker)  # type: ignore[arg-type]
    result.broker = f"{broker.kind} (MQTT {broker.protocol}) on {broker.host}:{broker.port}"
    log(f"broker: {result.broker}")
    coord: Any = None
    fleet: _Fleet | None = None
    history: list[tuple[str, dict[str, Any]]] = []
    truth_by_round: dict[str, dict[str, list[float]]] = {}
    done: list[dict[str, Any]] = []
    try:
        coord = Coordinator(CoordinatorConfig(
            db=str(run_dir / "coordinator.db"), key_file=str(run_dir / "coordinator.key"), mqtt_host=broker.host,
            mqtt_port=broker.port, mqtt_protocol=broker.protocol, client_id="haarvest-demo-coordinator",
            http_port=0, batch_ms=10.0))
        fleet = _Fleet(data, broker, coord.public_key, run_dir)
        coord.start()
        log(f"coordinator: dashboard {coord.dashboard_url} (live while the demo runs; --serve keeps it up after)")
        for records in fleet.collect("enrol", 120.0):
            coord.import_devices(records)
        n_conn = sum(fleet.collect("ready", 180.0))
        result.setup_seconds = time.monotonic() - t0
        log(f"fleet: {n_conn}/{cfg.agents} agents connected in {len(fleet.procs)} worker process(es) after "
            f"{result.setup_seconds:.1f} s; each agent has its own state directory under {run_dir / 'agents'}")

        specs = stream_specs(_device_config(0, run_dir, broker, coord.public_key))
        params = parse_round_params(_first_round_params(specs))
        n_streams = len(params.streams)
        for r in range(cfg.rounds):
            rid = f"r{r + 1}"
            fleet.round.value = r
            t_round = time.monotonic()
            if r == 0:
                rc = coord.open_round(rid, ROUND_EPSILON, params, protocol="demo")
            else:  # planned from the published aggregates of the earlier rounds only (SPEC §5)
                rc = coord.rounds.open_next_round(rid, ROUND_EPSILON, params, history, protocol="demo")
            params = parse_round_params(rc.params)
            got = _wait_round(coord, rid, cfg.agents * n_streams, cfg.round_timeout)
            coord.close_round(rid)
            est = coord.estimate(rid, level=cfg.level, consistency=False)
            history.append((rid, est))
            truth_by_round[rid] = {s: data.truth(r, params.streams[s], s) for s in params.streams}
            rows = []
            for stream in params.streams:
                if est[stream].kind == "distribution":  # its quantiles against the true ones
                    rows += _quantile_rows(rid, stream, est[stream], data.true_quantiles(r), cfg.level)
                else:
                    rows += _rows_for(rid, stream, est[stream], truth_by_round[rid][stream], cfg.level)
            result.rows += rows
            hh = params.streams["country"].heavy_hitters
            info = {"round": rid, "reports": got, "expected": cfg.agents * n_streams,
                    "seconds": time.monotonic() - t_round, "depends_on": list(rc.depends_on),
                    "rounding": {s: p.rounding for s, p in params.streams.items() if p.rounding is not None},
                    "heavy_hitters": None if hh is None else hh.model_dump()}
            result.rounds.append(info)
            log("")
            log(f"round {rid}: {got}/{info['expected']} reports in {info['seconds']:.1f} s"
                + (f"; planned from {', '.join(rc.depends_on)}" if rc.depends_on else ""))
            if info["rounding"]:
                log("  α-rounding steps: " + ", ".join(f"{s}={[round(x, 4) if x else x for x in v]}"
                                                      for s, v in info["rounding"].items()))
            if hh is not None:
                log(f"  heavy hitters on country: the next {hh.step_bits} bits of {_prefixes(hh)} (k = {hh.k} items)")
            log(format_table(rows, cfg.level))
        result.metrics = coord.metrics_snapshot()
        _snapshot_dashboard(coord, out, result, log)
        fleet.stop.set()
        done = fleet.collect("done", 120.0)
        _finish(cfg, result, history, truth_by_round, done, t0, log)
        if cfg.serve:
            log(f"\nserving the dashboard at {coord.dashboard_url} until Ctrl-C or SIGTERM "
                "(the report above is already written)")
            while True:
                time.sleep(1)
        else:
            log(f"the dashboard was live only while the demo ran; `haarvest demo --serve` "
                f"(make demo DEMO_ARGS=--serve) keeps it up until Ctrl-C or SIGTERM")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see _main)
        if result.report_path is None:
            result.interrupted = True
            if history and coord is not None:
                result.metrics = coord.metrics_snapshot()
                log(f"\ninterrupted: writing the report of the {len(history)} finished round(s)")
                _finish(cfg, result, history, truth_by_round, done, t0, log)
            else:
                log("\ninterrupted before the first round finished: nothing to report")
    finally:
        if fleet is not None:
            fleet.close()
        if coord is not None:
            coord.close()
        broker.stop()
    return result


def _snapshot_dashboard(coord: Any, out: Path, result: DemoResult, log: Callable[[str], None]) -> None:
    """Save the coordinator's dashboard page as it is now (``dashboard.html``)."""
    if coord.api is None:
        return
    try:
        with urllib.request.urlopen(coord.dashboard_url, timeout=10) as resp:
            dash = resp.read().decode()
        result.dashboard_path = out / "dashboard.html"
        result.dashboard_path.write_text(dash)
    except OSError as exc:
        log(f"(could not fetch the dashboard: {exc})")


def repeated_streams(history: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Streams whose estimate in some round equals the previous round's exactly."""
    out = []
    for (_, prev), (_, cur) in zip(history, history[1:]):
        for stream, e in cur.items():
            p = prev.get(stream)
            if (p is not None and e.n and p.n and list(e.labels) == list(p.labels)
                    and list(e.estimate) == list(p.estimate) and stream not in out):
                out.append(stream)
    return out


def _finish(cfg: DemoConfig, result: DemoResult, history: list[tuple[str, dict[str, Any]]],
            truth_by_round: dict[str, dict[str, list[float]]], done: list[dict[str, Any]], t0: float,
            log: Callable[[str], None]) -> None:
    """Totals, the outputs (report.html, estimates.json) and the closing summary."""
    spent = [x for d in done for x in d["spent"]]
    hits = sum(int(d["memo_hits"]) for d in done)
    streams = len(history[-1][1]) if history else 0
    result.spent = {"mean": float(np.mean(spent)) if spent else float("nan"),
                    "min": float(np.min(spent)) if spent else float("nan"),
                    "max": float(np.max(spent)) if spent else float("nan"), "memo_hits": float(hits),
                    "reports_per_device": float(len(history) * streams)}
    result.repeated = repeated_streams(history)
    result.seconds = time.monotonic() - t0
    _write_outputs(cfg, result, history, truth_by_round)
    m = result.metrics
    log("")
    log(f"coordinator: accepted {m.get('accepted')} reports, duplicates {m.get('duplicates')}, rejected "
        f"{m.get('rejected_total')}; intervals covering the truth: {100 * result.coverage:.1f}% "
        f"(nominal {100 * cfg.level:.0f}%)")
    if spent:
        log(f"privacy spent per device (ledger, device unit: everything a device released, against any other "
            f"readings): mean ε = {result.spent['mean']:.2f}, max ε = {result.spent['max']:.2f} for "
            f"{int(result.spent['reports_per_device'])} reports ({hits} memo hits)")
    for note in bound_notes(result.rows):
        log(note)
    log(memo_note(hits, result.repeated, cfg.agents))
    log(f"report: {result.report_path}   dashboard snapshot: {result.dashboard_path}")
    log(f"done in {result.seconds:.1f} s ({cfg.agents} agents, {len(history)} of {cfg.rounds} rounds)")


def memo_note(memo_hits: int, repeated: list[str], agents: int) -> str:
    """Why estimates of unchanged quantities do (or do not) repeat across rounds, from what was measured: the
    devices' memo hits and the streams whose estimate equalled the previous round's."""
    if memo_hits:
        return (f"{memo_hits} reports were re-sent from the devices' memos (privacy unit 'value', RAPPOR-style): "
                "estimates of values that did not change repeat exactly"
                + (f" ({', '.join(repeated)})" if repeated else "") + ". That costs no new ε per value but reveals "
                "when a value changes (docs/agent.md, 'Privacy units').")
    note = ("no report was re-sent from a memo: every report is a fresh randomization (privacy unit 'device'), so "
            "estimates of quantities that did not change (age, sex, country) move by the noise their intervals show")
    if repeated:  # a line of its own: the sentence above reads the same in every run
        note += (f".\n{', '.join(repeated)} equalled the previous round's estimate only because as many of the "
                 f"{agents} devices reported each item (a frequency estimate is a count: small fleets repeat one "
                 "by chance)")
    return note + "."


def _write_outputs(cfg: DemoConfig, result: DemoResult, history: list[tuple[str, dict[str, Any]]],
                   truth: dict[str, dict[str, list[float]]]) -> None:
    from coordinator.api import render_report

    out = Path(cfg.out)
    hist = [(rid, {s: e.to_dict() for s, e in est.items()}) for rid, est in history]
    (out / "estimates.json").write_text(json.dumps({
        "config": {"agents": cfg.agents, "rounds": cfg.rounds, "seed": cfg.seed, "level": cfg.level},
        "broker": result.broker, "rounds": result.rounds, "estimates": dict(hist), "truth": truth,
        "rows": result.rows, "spent": result.spent, "seconds": result.seconds}, indent=1, default=str))
    rounds_html = "".join(
        f"<tr><td>{html.escape(r['round'])}</td><td class=num>{r['reports']}/{r['expected']}</td>"
        f"<td>{html.escape(', '.join(r['depends_on']))}</td>"
        f"<td>{html.escape(json.dumps(r['rounding']))}</td>"
        f"<td>{html.escape('' if r['heavy_hitters'] is None else json.dumps(r['heavy_hitters']))}</td></tr>"
        for r in result.rounds)
    note = memo_note(int(result.spent["memo_hits"]), result.repeated, cfg.agents)
    body = (f"<p>{cfg.agents} agents, {cfg.rounds} rounds, broker {html.escape(result.broker)}, "
            f"{result.seconds:.1f} s. Intervals covering the truth: {100 * result.coverage:.1f}% "
            f"(nominal {100 * cfg.level:.0f}%). Privacy spent per device: mean ε = {result.spent['mean']:.2f}, "
            f"max ε = {result.spent['max']:.2f}. {html.escape(note)}</p>"
            + "".join(f"<p>{html.escape(b)}.</p>" for b in bound_notes(result.rows)) +
            "<h2>Rounds</h2><table><tr><th>round</th><th>reports</th><th>planned from</th><th>rounding steps</th>"
            f"<th>heavy-hitter step</th></tr>{rounds_html}</table>"
            "<h2>True vs estimated</h2>" + _html_table(result.rows) + "<h2>Charts</h2>"
            f"<div class=charts>{''.join(_quantile_charts(result.rows))}</div>")
    result.report_path = out / "report.html"
    result.report_path.write_text(render_report("haarvest demo", hist, truth, body))


# ---------------------------------------------------------------------------------------------------- CLI


def register(subparsers: Any) -> None:
    """``haarvest demo [--quick] [--agents N] [--rounds R] [--out DIR]``."""
    p = subparsers.add_parser("demo", help="broker + coordinator + a fleet of agents replaying Adult, end to end",
                              description="A broker, the coordinator and a fleet of real agents replaying Adult, "
                                          "end to end on this machine (docs/demo.md).")
    p.add_argument("--quick", action="store_true", help=f"CI size: {QUICK['agents']} agents, {QUICK['rounds']} rounds")
    p.add_argument("--agents", type=int, default=None, help="number of agents (default 200)")
    p.add_argument("--rounds", type=int, default=None, help="number of rounds (default 4)")
    p.add_argument("--out", type=Path, default=Path("demo-output"), help="output directory (default %(default)s)")
    p.add_argument("--broker", choices=("auto", "mosquitto", "amqtt"), default="auto",
                   help="mosquitto if installed, else amqtt (default %(default)s)")
    p.add_argument("--seed", type=int, default=DemoConfig.seed,
                   help="seed of the data (the devices' noise always comes from OS entropy; default %(default)s)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals")
    p.add_argument("--serve", action="store_true", help="keep the dashboard up after the rounds (Ctrl-C to stop)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from simulations.broker import BrokerUnavailable

    agents = args.agents if args.agents is not None else (QUICK["agents"] if args.quick else 200)
    rounds = args.rounds if args.rounds is not None else (QUICK["rounds"] if args.quick else 4)
    if agents < 2 or rounds < 1:
        print("haarvest demo: need --agents >= 2 and --rounds >= 1")
        return 2
    if not 0 < args.level < 1:
        print("haarvest demo: --level must lie in (0, 1)")
        return 2
    cfg = DemoConfig(agents=agents, rounds=rounds, out=args.out, quick=args.quick, seed=args.seed,
                     broker=args.broker, level=args.level, serve=args.serve)

    def _terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up below must not be interrupted again
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminated)  # SIGTERM stops the demo as Ctrl-C does
    try:
        result = run_demo(cfg)
    except (BrokerUnavailable, FileNotFoundError, ValueError) as exc:  # no broker; Adult missing or malformed
        print(f"haarvest demo: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 130 if result.interrupted else 0
