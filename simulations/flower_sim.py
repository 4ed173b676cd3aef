"""Federated simulation of a large haarvest fleet on Flower's Simulation Runtime (``haarvest simulate flower``).

Every virtual SuperNode hosts a *shard* of devices (one node per device makes Flower's dispatcher quadratic in the
number of nodes) and answers each round with one report per device and stream. Each device is a real
:class:`edge_agent.agent.Agent` — pipeline, SQLite ledger, memo table, outbox, report key (Ed25519, or HMAC-SHA256
with ``signature="hmac-sha256"`` / ``--signature hmac-sha256``) — driven by
:class:`edge_agent.flower_app.DeviceShard`; the coordinator side is :class:`coordinator.flower_app.FlowerCoordinator`
(signed rounds, planners, validation, store, estimates). Nothing is re-implemented for the simulation: only the data
source and the simulated clock are.

**Data.** Device i holds row ``i mod 45,222`` of the Adult data (``adult-coarse.dat``: first line the row count,
then comma-separated coarse integer rows; SPEC §6) and Syn user ``i mod n_syn`` (SPEC §6: n = 10,000 users,
τ = 120 collections, k = 360 values; :mod:`simulations.syn`) as an evolving 16th column; round r reads Syn time
step r. Streams (ε each, one device answers all of them per round):

* ``age``  — Adult V1 (16 levels) as a numeric dimension in [0, 15], Hybrid mechanism (mean);
* ``edu``  — Adult V4 (16 categories), OUE (frequencies);
* ``syn``  — the evolving Syn value (360 categories), OLH (per-round frequencies).

The truth of every round (means and marginals of exactly the simulated devices) is returned with the estimates.
Device noise uses OS entropy (product code); the data are drawn from a seeded generator.

**Processes.** One :class:`ShardHost` per core (a Ray actor) owns the devices of the partitions ``p ≡ index (mod
hosts)`` for the whole run; Flower's actors run the ClientApp, whose host factory (:class:`HostedShards`) forwards
each node's message to the owning host — Flower's Simulation Runtime would otherwise serve a node from whichever of
its actors is idle, re-opening its devices in another process every time it moves. The coordinator (ServerApp) runs
in the driver process. Shards are built lazily in their host by :class:`SimHostFactory` (which also serves tests
in-process); device state lives in ``workdir`` (by default a fresh directory under /dev/shm when it exists: the
agents commit every report with ``synchronous=FULL``). A host keeps as many device databases open as fit half the
available memory (:func:`default_max_open`) and reattaches the others' databases for each round.

**Cost model** (the rounds are CPU-bound): a device round costs the agent's CPU (privatizations, ledger and memo
rows, more when every stream charges and on each database's first compilation of its SQL statements) and one SQLite
commit; the coordinator adds one report verification per stream (far cheaper with HMAC-SHA256 report keys,
``signature="hmac-sha256"``, than with Ed25519) plus validation and storage; a round takes at least their sum times
the devices over the cores. The CPU seconds of each round, the devices' and the coordinator's, are measured by
:func:`run_flower_simulation` (:attr:`FlowerSimResult.extra` and the round summaries) and reported in the "Flower
simulation" section of ``make bench``.

**Environment.** Importing this module changes nothing; :func:`configure_environment` (called by
:func:`run_flower_simulation` before Ray and Flower are imported) sets :data:`SIM_ENV` and :data:`THREAD_ENV`
where they are not already set.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulations.datasets import ADULT_DIR, read_dat

__all__ = [
    "ADULT_PATH",
    "SIM_ENV",
    "configure_environment",
    "STREAMS",
    "SimFleetSpec",
    "SimHostFactory",
    "ShardHost",
    "HostedShards",
    "THREAD_ENV",
    "OPEN_DEVICE_BYTES",
    "CLOSED_DEVICE_BYTES",
    "available_memory",
    "default_max_open",
    "memory_needed",
    "FlowerSimResult",
    "syn_values",
    "fleet_data",
    "device_config",
    "round_params",
    "truth",
    "run_flower_simulation",
    "add_arguments",
    "run_from_args",
]

ADULT_PATH = ADULT_DIR / "adult-coarse.dat"

#: stream name → (dimension kind, Adult column or None for Syn, domain, mechanism)
STREAMS: dict[str, tuple[str, int | None, int, str]] = {
    "age": ("numeric", 0, 16, "hybrid"),
    "edu": ("categorical", 3, 16, "oue"),
    "syn": ("categorical", None, 360, "olh"),
}


# --- data -----------------------------------------------------------------------------------------------------


def syn_values(n_users: int, steps: int, k: int, p_change: float, rng: np.random.Generator) -> np.ndarray:
    """Syn (SPEC §6) from :func:`simulations.syn.generate_syn`: ``(n_users, steps)`` values in [0, k)."""
    from simulations.syn import generate_syn

    return generate_syn(rng, n=n_users, tau=steps, k=k, change_prob=p_change)


@dataclass(frozen=True)
class SimFleetSpec:
    """Everything a simulation worker needs to build its shards (small: it is pickled with every message)."""

    run_id: str
    n_devices: int
    shard_size: int
    state_root: str
    coordinator_public_key: str
    seed: int = 0
    adult_path: str = str(ADULT_PATH)
    syn_users: int = 10_000
    syn_steps: int = 120
    syn_p_change: float = 0.25
    epsilon: float = 1.0
    streams: tuple[str, ...] = ("age", "edu", "syn")
    signature: str = "ed25519"
    unit: str = "device"  # the devices' privacy unit (edge_agent.config): device, or value (memoized reports)

    def __post_init__(self) -> None:
        from protocols import wire

        if self.signature not in wire.SIGNATURE_ALGORITHMS:
            raise ValueError(f"unknown signature algorithm {self.signature!r}; choose one of "
                             f"{', '.join(wire.SIGNATURE_ALGORITHMS)}")

    @property
    def n_shards(self) -> int:
        return math.ceil(self.n_devices / self.shard_size)

    def shard_devices(self, partition: int) -> range:
        if not 0 <= partition < self.n_shards:
            raise ValueError(f"partition {partition} outside [0, {self.n_shards})")
        return range(partition * self.shard_size, min((partition + 1) * self.shard_size, self.n_devices))

    @property
    def max_round_epsilon(self) -> float:
        return self.epsilon * len(self.streams)


_DATA: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def fleet_data(spec: SimFleetSpec) -> tuple[np.ndarray, np.ndarray]:
    """(Adult columns per device (n_devices, 15), Syn values per device (n_devices, syn_steps)); cached per process."""
    key = (spec.adult_path, spec.seed, spec.n_devices, spec.syn_users, spec.syn_steps, spec.syn_p_change)
    hit = _DATA.get(key)
    if hit is None:
        adult = read_dat(Path(spec.adult_path))
        rng = np.random.default_rng(spec.seed)
        syn = syn_values(spec.syn_users, spec.syn_steps, STREAMS["syn"][2], spec.syn_p_change, rng)
        ids = np.arange(spec.n_devices)
        hit = (adult[ids % adult.shape[0]], syn[ids % spec.syn_users])
        _DATA.clear()
        _DATA[key] = hit
    return hit


def truth(spec: SimFleetSpec, t: int) -> dict[str, np.ndarray]:
    """The population statistics the estimates target at time step t: the mean of ``age``, the marginals of
    ``edu`` and ``syn`` over the simulated devices."""
    adult, syn = fleet_data(spec)
    out: dict[str, np.ndarray] = {}
    for name in spec.streams:
        kind, col, k, _ = STREAMS[name]
        values = adult[:, col] if col is not None else syn[:, t % spec.syn_steps]
        out[name] = np.array([values.mean()]) if kind == "numeric" else np.bincount(values, minlength=k) / values.size
    return out


def device_config(spec: SimFleetSpec, device: int) -> Any:
    """Device ``device``'s agent configuration (the same schema as a device's TOML file)."""
    from edge_agent.embed import categorical, numeric, simple_config

    dims, streams = [], []
    for name in spec.streams:
        kind, _, k, mech = STREAMS[name]
        dims.append(numeric(name, 0, k - 1) if kind == "numeric" else categorical(name, k))
        streams.append({"name": name, "dimensions": [name], "mechanism": mech, "epsilon": spec.epsilon})
    return simple_config(
        f"sim-{device:06d}", Path(spec.state_root) / f"d{device // 1000:04d}" / f"{device:06d}", dims, streams,
        epsilon=spec.epsilon, total_cap=1e6, coordinator_public_key=spec.coordinator_public_key,
        privacy={"max_round_epsilon": spec.max_round_epsilon, "round_policy": "clamp", "unit": spec.unit},
    )


def round_params(spec: SimFleetSpec) -> dict[str, Any]:
    """The coordinator's base :class:`protocols.contract.RoundParams` matching :func:`device_config`."""
    streams: dict[str, Any] = {}
    for name in spec.streams:
        kind, _, k, mech = STREAMS[name]
        if kind == "numeric":
            streams[name] = {"kind": "numeric", "mechanism": mech, "params": {"epsilon": spec.epsilon},
                             "dims": [name], "bounds": [[0.0, float(k - 1)]], "unit": spec.unit}
        else:
            streams[name] = {"kind": "frequency", "mechanism": mech, "params": {"epsilon": spec.epsilon, "k": k},
                             "dims": [name], "unit": spec.unit}
    return {"streams": streams}


# --- simulation workers ---------------------------------------------------------------------------------------

_CLOCK: dict[str, int] = {}
_SHARDS: dict[tuple[str, int], Any] = {}


class _Reading:
    """Device i's reading at the worker's simulated time step (a zero-argument callable source)."""

    __slots__ = ("spec", "device")

    def __init__(self, spec: SimFleetSpec, device: int) -> None:
        self.spec, self.device = spec, device

    def __call__(self) -> dict[str, Any]:
        adult, syn = fleet_data(self.spec)
        t = _CLOCK.get(self.spec.run_id, 0)
        out: dict[str, Any] = {}
        for name in self.spec.streams:
            _, col, _, _ = STREAMS[name]
            out[name] = int(adult[self.device, col]) if col is not None else int(syn[self.device, t % self.spec.syn_steps])
        return out


@dataclass(frozen=True)
class SimHostFactory:
    """``host_factory`` for :func:`edge_agent.flower_app.make_client_app`: node config ``partition-id`` → shard."""

    spec: SimFleetSpec

    def __call__(self, node_config: dict[str, Any]) -> Any:
        from edge_agent.flower_app import DeviceShard, DeviceSpec
        from edge_agent.sources import CallableSource

        partition = int(node_config["partition-id"])
        key = (self.spec.run_id, partition)
        shard = _SHARDS.get(key)
        if shard is None:
            spec = self.spec
            run_id = spec.run_id

            def set_clock(t: int) -> None:
                _CLOCK[run_id] = t

            devices = [DeviceSpec(device_config(spec, i), source=lambda i=i: CallableSource(_Reading(spec, i)),
                                  create_identity=True, signature=spec.signature)
                       for i in spec.shard_devices(partition)]
            # a shard host keeps its agents for the whole run: a reply's sent marks go into the next round's commit
            shard = DeviceShard(devices, before_round=set_clock, defer_sent=True)
            _SHARDS[key] = shard
        return shard


# --- shard hosts: every device lives in one process for the whole run ------------------------------------------

#: thread pools of numeric libraries pinned to one thread per process (one process per core does the work)
THREAD_ENV = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}
#: Flower without telemetry, update check or runtime dependency installation; Ray without log deduplication and
#: without its warning about accelerator variables (read by Flower and Ray when they are imported)
SIM_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "RAY_DEDUP_LOGS": "0",
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def configure_environment() -> None:
    """Set :data:`SIM_ENV` and :data:`THREAD_ENV` in ``os.environ`` where not already set (a variable the user set
    wins). Call before Ray and Flower are imported: they read some of these at import time; the Ray workers started
    afterwards inherit them."""
    for name, value in {**SIM_ENV, **THREAD_ENV}.items():
        os.environ.setdefault(name, value)


def host_devices(spec: SimFleetSpec, index: int, hosts: int) -> int:
    """How many devices shard host ``index`` of ``hosts`` holds (partitions ``p`` with ``p mod hosts = index``)."""
    return sum(len(spec.shard_devices(p)) for p in range(index, spec.n_shards, hosts))


class ShardHost:
    """The shards of one simulation worker process (a Ray actor, one per core; see :func:`run_flower_simulation`).

    Flower's Simulation Runtime hands each message to whichever of its actors is idle, so a virtual SuperNode
    would be served by a different process from round to round — and every move re-opens its devices (boot,
    pipeline, state database) in the new process while the old one still holds them open. Here Flower's actors run
    the ClientApp, whose host factory (:class:`HostedShards`) forwards each message to the ShardHost owning the
    node's partition (``partition mod hosts``): a device lives in exactly one process for the whole run, as it
    lives on one gateway. ``max_open`` bounds the device databases kept open (memory; see
    :class:`edge_agent.flower_app._OpenAgents`).
    """

    def __init__(self, spec: SimFleetSpec, index: int, hosts: int, max_open: int | None = None,
                 phases: bool = False) -> None:
        from edge_agent.flower_app import OPEN_AGENTS

        from simulations.flower_phases import PhaseClock

        configure_environment()  # in this worker process too (a Ray started elsewhere does not pass them on)
        try:  # Ray starts its workers at nice 15: a host is the simulation's main work, give it the default priority
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except (OSError, AttributeError):
            pass
        self.spec, self.index = spec, index
        # this process is its devices' databases' only user: hosted databases (exclusive locking, short WAL)
        self.capacity = OPEN_AGENTS.configure(devices=host_devices(spec, index, hosts), max_open=max_open,
                                              hosted=True)
        self.factory = SimHostFactory(spec)
        self.busy: dict[str, list[float]] = {}
        #: ``phases``: CPU seconds per device-side phase and round (:class:`simulations.flower_phases.PhaseClock`)
        self.clock = PhaseClock().install() if phases else None
        self.phases: dict[str, dict[str, float]] = {}
        fleet_data(spec)

    def ready(self) -> int:
        return os.getpid()

    def _timed(self, what: str, fn: Any, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args)
        finally:
            acc = self.busy.setdefault(what, [0.0, 0.0])
            acc[0] += time.perf_counter() - wall
            acc[1] += time.process_time() - cpu
            # thousands of agents are long-lived objects: keep the cyclic collector from re-traversing them (a full
            # collection of a host's heap takes ~0.3-0.5 s); only objects created since are collected
            gc.freeze()

    def announce(self, partition: int) -> tuple[list[str], list[str]]:
        return self._timed("announce", self.factory({"partition-id": partition}).announce)

    def answer(self, partition: int, payload: bytes, t: int | None) -> Any:
        what = f"round t={t}"
        before = self.clock.snapshot() if self.clock is not None else None
        try:
            return self._timed(what, self.factory({"partition-id": partition}).answer, payload, t)
        finally:
            if self.clock is not None and before is not None:
                acc = self.phases.setdefault(what, {})
                for phase, seconds in self.clock.seconds.items():
                    acc[phase] = acc.get(phase, 0.0) + seconds - before[phase]

    def stats(self) -> dict[str, Any]:
        """Agents opened (boots), database reattachments, the open capacity and the peak RSS (MiB) of this host."""
        import resource

        from edge_agent.flower_app import OPEN_AGENTS

        return {"pid": os.getpid(), "agents": len(OPEN_AGENTS.agents), "opened": OPEN_AGENTS.opened,
                "reattached": OPEN_AGENTS.reattached, "capacity": OPEN_AGENTS.capacity,
                "busy_seconds": {k: {"wall": round(w, 3), "cpu": round(c, 3)} for k, (w, c) in self.busy.items()},
                "phase_seconds": {k: {p: round(c, 3) for p, c in v.items()} for k, v in self.phases.items()},
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


#: the memory budgeted (a planning parameter, not a measurement) per device whose database stays open on a shard host
#: (``State(hosted=True)``): its SQLite connection (schema, prepared statements, page cache) and the agent, plus on
#: tmpfs its database and its WAL (at most ``HOSTED_WAL_PAGES`` pages); the bench (`make bench`, section *flower*)
#: reports the hosts' measured peak RSS against it
OPEN_DEVICE_BYTES = 700 * 1024
#: the memory budgeted per device whose database is closed between rounds: the agent (pipeline, plans, volatility
#: windows) plus its checkpointed database file on tmpfs (a planning parameter, as :data:`OPEN_DEVICE_BYTES`)
CLOSED_DEVICE_BYTES = 136 * 1024
#: Ray, Flower's actors, the coordinator and its store
SIM_OVERHEAD_BYTES = 3 << 30


def available_memory() -> int:
    """``MemAvailable`` of /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def default_max_open(devices: int, workers: int, memory: int | None = None) -> int:
    """Open device databases per host for ``devices`` devices on ``workers`` hosts: all of them while every device
    open fits half of the available memory (:data:`OPEN_DEVICE_BYTES` each); else as many as fit that half next to
    the closed ones (:data:`CLOSED_DEVICE_BYTES`), at least 100 per host."""
    memory = available_memory() if memory is None else memory
    per_host = math.ceil(devices / max(1, workers))
    budget = 0.5 * memory
    if memory <= 0 or devices * OPEN_DEVICE_BYTES <= budget:
        return max(1, per_host)
    fit = (budget - devices * CLOSED_DEVICE_BYTES) / (OPEN_DEVICE_BYTES - CLOSED_DEVICE_BYTES) / max(1, workers)
    return max(1, min(per_host, max(100, int(fit))))


def memory_needed(devices: int, workers: int, max_open: int) -> int:
    """Estimated memory (RAM plus tmpfs) of a simulation: open and closed devices plus the fixed overhead."""
    open_devices = min(devices, workers * max_open)
    return open_devices * OPEN_DEVICE_BYTES + (devices - open_devices) * CLOSED_DEVICE_BYTES + SIM_OVERHEAD_BYTES


def _host_name(run_id: str, index: int) -> str:
    return f"haarvest-shard-host-{run_id}-{index}"


_HOST_HANDLES: dict[str, Any] = {}


class _RemoteShard:
    """A node's shard as seen from a Flower actor: calls go to the owning :class:`ShardHost`."""

    __slots__ = ("host", "partition")

    def __init__(self, host: Any, partition: int) -> None:
        self.host, self.partition = host, partition

    def announce(self) -> tuple[list[str], list[str]]:
        import ray

        return ray.get(self.host.announce.remote(self.partition))

    def answer(self, payload: bytes, t: int | None = None) -> Any:
        import ray

        return ray.get(self.host.answer.remote(self.partition, payload, t))


@dataclass(frozen=True)
class HostedShards:
    """``host_factory`` for the Ray simulation: node config ``partition-id`` → the shard on its :class:`ShardHost`."""

    spec: SimFleetSpec
    hosts: int

    def __call__(self, node_config: dict[str, Any]) -> Any:
        partition = int(node_config["partition-id"])
        name = _host_name(self.spec.run_id, partition % self.hosts)
        handle = _HOST_HANDLES.get(name)
        if handle is None:
            import ray

            handle = ray.get_actor(name)
            _HOST_HANDLES[name] = handle
        return _RemoteShard(handle, partition)


# --- the driver -----------------------------------------------------------------------------------------------


@dataclass
class FlowerSimResult:
    """Round summaries (:class:`coordinator.flower_app.RoundSummary`), the truth of every round, timings."""

    spec: SimFleetSpec
    summaries: list[Any]
    truths: list[dict[str, np.ndarray]]
    startup_seconds: float
    round_seconds: list[float]
    total_seconds: float
    n_nodes: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.spec.n_devices,
            "signature": self.spec.signature,
            "nodes": self.n_nodes,
            "shard_size": self.spec.shard_size,
            "startup_seconds": self.startup_seconds,
            "round_seconds": self.round_seconds,
            "total_seconds": self.total_seconds,
            "rounds": [
                {**s.to_dict(), "truth": {k: v.tolist() for k, v in t.items()}}
                for s, t in zip(self.summaries, self.truths)
            ],
        }


def _default_workdir() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="haarvest-flower-", dir=base))


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_flower_simulation(
    devices: int = 1000,
    *,
    shard_size: int | None = None,
    nodes: int | None = None,
    rounds: int = 2,
    seed: int = 0,
    epsilon: float = 1.0,
    streams: tuple[str, ...] = ("age", "edu", "syn"),
    workdir: str | Path | None = None,
    keep_workdir: bool = False,
    timeout: float = 600.0,
    level: float = 0.95,
    workers: int | None = None,
    forwarders: int | None = None,
    max_open: int | None = None,
    planner: dict[str, Any] | None = None,
    adult_path: str | Path = ADULT_PATH,
    verbose: bool = False,
    signature: str = "ed25519",
    unit: str = "device",
    phases: bool = False,
) -> FlowerSimResult:
    """Simulate ``devices`` devices in ``nodes`` virtual SuperNodes (or shards of ``shard_size``) for ``rounds``
    rounds on Flower's Simulation Runtime (Ray). Round 1 uses the base parameters, later rounds are planned from the
    earlier rounds' estimates. Needs ``flwr[simulation]==1.41.0``.

    Processes: ``workers`` shard hosts (:class:`ShardHost`, default one per core) own the devices, partition p on
    host ``p mod workers``; ``forwarders`` Flower actors (default 2 per worker) run the ClientApp and forward each
    node's messages to its host (several in flight, so every host always has a node's round queued); the ServerApp
    (coordinator) runs in this process. ``max_open``: device databases each host keeps open (default:
    :func:`default_max_open`, all of them while they fit half the available memory; the descriptor limit is
    raised where permitted); the others are closed after each round and reattached for the next. ``phases``: the
    hosts time the device-side phases (:class:`simulations.flower_phases.PhaseClock`; ``extra["hosts"]``); the CPU
    of every process of the simulation in each round is ``extra["tree_cpu"]`` (:func:`simulations.proc_stats.tree_cpu`).
    """
    if devices < 1 or rounds < 1:
        raise ValueError("need devices >= 1 and rounds >= 1")
    unknown = sorted(set(streams) - set(STREAMS))
    if unknown or not streams:
        raise ValueError(f"unknown streams {unknown}; choose from {sorted(STREAMS)}")
    if shard_size is None:
        n_nodes = nodes if nodes is not None else max(1, min(devices, math.ceil(devices / 500)))
        shard_size = math.ceil(devices / n_nodes)
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")
    workers = _cores() if workers is None else int(workers)
    forwarders = 2 * workers if forwarders is None else int(forwarders)
    if workers < 1 or forwarders < 1:
        raise ValueError("need workers >= 1 and forwarders >= 1")

    configure_environment()
    import ray
    from flwr.simulation import run_simulation

    from coordinator.flower_app import FlowerCoordinator, FlowerSettings, make_server_app
    from coordinator.store import open_store
    from edge_agent.flower_app import make_client_app
    from protocols import wire
    from simulations.proc_stats import tree_cpu

    t_start = time.perf_counter()
    root = Path(workdir) if workdir is not None else _default_workdir()
    root.mkdir(parents=True, exist_ok=True)
    key = wire.generate_signing_key()
    spec = SimFleetSpec(
        run_id=f"{os.getpid()}-{time.time_ns()}", n_devices=devices, shard_size=shard_size,
        state_root=str(root / "devices"), coordinator_public_key=wire.public_key_b64(key), seed=seed,
        adult_path=str(adult_path), epsilon=epsilon, streams=tuple(streams), signature=signature, unit=unit,
    )
    n_nodes = spec.n_shards
    workers = min(workers, n_nodes)
    if max_open is None:
        max_open = default_max_open(devices, workers)
    store = open_store(root / "coordinator.sqlite3")
    settings = FlowerSettings(
        base_params=round_params(spec), rounds=rounds, epsilon=spec.max_round_epsilon, round_prefix="sim",
        timeout=timeout, min_nodes=n_nodes, node_wait=timeout, enroll="announce", level=level, send_time=True,
        planner=dict(planner or {}),
    )
    coordinator = FlowerCoordinator(store, key, settings)
    marks: dict[str, float] = {}
    original_run_round = coordinator.run_round

    def timed_run_round(grid: Any, index: int, nodes_: Any = None) -> Any:
        marks.setdefault("first_round", time.perf_counter())
        gc.freeze()  # the coordinator's long-lived state (devices, Flower, stores) out of the cyclic collector's way
        before = tree_cpu()
        try:
            return original_run_round(grid, index, nodes_)
        finally:  # every process of the simulation (driver, Ray, Flower's actors, shard hosts) in this round
            extra.setdefault("tree_cpu", []).append(tree_cpu() - before)

    coordinator.run_round = timed_run_round  # type: ignore[method-assign]
    done: list[Any] = []
    hosts: list[Any] = []
    extra: dict[str, Any] = {"workers": workers, "forwarders": forwarders, "max_open": max_open}

    def on_done(summaries: list[Any]) -> None:
        done.append(summaries)
        try:  # Flower shuts Ray down when the ServerApp returns: ask the hosts now
            extra["hosts"] = ray.get([h.stats.remote() for h in hosts], timeout=60)
        except Exception as exc:  # noqa: BLE001 - statistics only
            extra["hosts_error"] = repr(exc)

    server_app = make_server_app(coordinator, on_done=on_done)
    client_app = make_client_app(HostedShards(spec, workers))
    own_ray = not ray.is_initialized()
    if own_ray:  # initialised here (Flower then uses it as it is): the workers get the thread pinning too
        pythonpath = os.pathsep.join([p for p in sys.path if p] + ([os.environ["PYTHONPATH"]]
                                                                   if os.environ.get("PYTHONPATH") else []))
        ray.init(num_cpus=workers, include_dashboard=False, object_store_memory=256 * 1024 * 1024,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, **THREAD_ENV}},
                 logging_level=logging.INFO if verbose else logging.WARNING, log_to_driver=verbose)
    try:
        host_cls = ray.remote(ShardHost)
        hosts = [host_cls.options(name=_host_name(spec.run_id, h), num_cpus=0, max_concurrency=1)
                 .remote(spec, h, workers, max_open, phases) for h in range(workers)]
        ray.get([h.ready.remote() for h in hosts])
        cpus = float(ray.cluster_resources().get("CPU", workers))
        backend_config = {"client_resources": {"num_cpus": cpus / forwarders, "num_gpus": 0.0}}
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n_nodes,
                       backend_config=backend_config, verbose_logging=verbose)
        if not done:
            raise RuntimeError("the Flower simulation ended before the rounds completed")
        summaries = done[0]
        truths = [truth(spec, t) for t in range(len(summaries))]
        total = time.perf_counter() - t_start
        startup = marks.get("first_round", time.perf_counter()) - t_start
        return FlowerSimResult(spec=spec, summaries=summaries, truths=truths, startup_seconds=startup,
                               round_seconds=[s.seconds for s in summaries], total_seconds=total, n_nodes=n_nodes,
                               extra=extra)
    finally:
        _HOST_HANDLES.clear()
        if ray.is_initialized():  # Flower's backend shuts Ray down at the end of a run; after a failure, we do
            for h in hosts:
                try:
                    ray.kill(h)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            if own_ray:
                ray.shutdown()
        store.close()
        if workdir is None and not keep_workdir:
            shutil.rmtree(root, ignore_errors=True)


# --- command line (registered by simulations/cli.py) ----------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``haarvest simulate flower``."""
    parser.add_argument("--devices", type=int, default=1000, help="simulated devices (default 1000)")
    parser.add_argument("--shard-size", type=int, default=None, help="devices per virtual SuperNode (default: 500)")
    parser.add_argument("--nodes", type=int, default=None, help="virtual SuperNodes (alternative to --shard-size)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="data seed (device noise always uses OS entropy)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε per stream and report")
    parser.add_argument("--streams", default="age,edu,syn", help="comma-separated subset of age,edu,syn")
    parser.add_argument("--workdir", default=None, help="device and coordinator state (default: a temp dir, removed)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-round straggler timeout (s)")
    parser.add_argument("--workers", type=int, default=None, help="shard host processes (default: one per core)")
    parser.add_argument("--max-open", type=int, default=None,
                        help="device databases each host keeps open (default: as many as fit a quarter of the memory)")
    parser.add_argument("--signature", choices=("ed25519", "hmac-sha256"), default="ed25519",
                        help="the devices' report keys (default ed25519; hmac-sha256: far cheaper to verify, the "
                             "coordinator's registry holds the secrets)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")


def run_from_args(args: argparse.Namespace) -> int:
    """``haarvest simulate flower``: run and print a summary (or JSON with ``--json``)."""
    result = run_flower_simulation(
        args.devices, shard_size=args.shard_size, nodes=args.nodes, rounds=args.rounds, seed=args.seed,
        epsilon=args.epsilon, streams=tuple(s.strip() for s in args.streams.split(",") if s.strip()),
        workdir=args.workdir, timeout=args.timeout, workers=args.workers, max_open=args.max_open,
        signature=args.signature,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0
    print(f"{result.spec.n_devices} devices ({result.spec.signature} report keys) in {result.n_nodes} nodes; "
          f"start-up {result.startup_seconds:.1f} s")
    for s, t in zip(result.summaries, result.truths):
        print(f"{s.round_id}: {s.accepted} reports accepted, rejected {dict(s.rejected)}, {s.seconds:.2f} s")
        for name, est in s.estimates.items():
            if est.error:
                print(f"  {name}: error {est.error}")
                continue
            err = np.abs(np.asarray(est.raw) - t[name])
            print(f"  {name}: n={est.n} max|est-truth|={err.max():.4f} max se={max(est.stderr):.4f}")
    return 0
