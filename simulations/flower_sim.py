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
agents commit every report with ``synchronous=FULL``). A host keeps every device database open when all of them fit
:data:`MEMORY_SHARE` of the available memory by a footprint measured on this machine (:func:`measure_footprint`,
:func:`default_max_open`); else it reattaches each device's database for each round (keeping part of them open
would slow every reattachment: see :func:`default_max_open`).

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
    "MEMORY_SHARE",
    "SMALL_FLEET",
    "DeviceFootprint",
    "measure_footprint",
    "host_rounds",
    "tmpfs_workdir",
    "available_memory",
    "default_max_open",
    "NODE_DEVICES",
    "default_nodes",
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


# --- memory planning from a measured footprint --------------------------------------------------------------

#: Ray, Flower's actors, the coordinator and its store (an allowance: the bench reports the hosts' peak RSS)
SIM_OVERHEAD_BYTES = 3 << 30
#: the share of the available memory a simulation plans to fill (devices plus :data:`SIM_OVERHEAD_BYTES`)
MEMORY_SHARE = 0.7
#: devices :func:`measure_footprint` runs
FOOTPRINT_DEVICES = 400
#: a fleet of at most this many devices keeps every database open without measuring (well under 1 GiB by the
#: footprint the bench measures)
SMALL_FLEET = 2_000
#: devices run first and left out of the measurement (imports, caches and tables built on first use)
_WARM_DEVICES = 20


@dataclass(frozen=True)
class DeviceFootprint:
    """Bytes per simulated device, measured by :func:`measure_footprint` on this machine: the shard host's
    resident memory (agent, pipeline and — open — the SQLite connection: schema, page cache, WAL index, prepared
    statements) and its state files on tmpfs (keys, ledger mark, database and — open — the WAL), for a device whose
    database stays open across rounds and for one whose database is closed after each round."""

    open_rss: float
    open_files: float
    closed_rss: float
    closed_files: float
    devices: int
    rounds: int

    @property
    def open_bytes(self) -> float:
        return self.open_rss + self.open_files

    @property
    def closed_bytes(self) -> float:
        return self.closed_rss + self.closed_files

    def to_dict(self) -> dict[str, float]:
        return {"open_rss": self.open_rss, "open_files": self.open_files, "closed_rss": self.closed_rss,
                "closed_files": self.closed_files, "devices": self.devices, "rounds": self.rounds}


def _files_bytes(root: Path) -> int:
    """Bytes the files under ``root`` occupy (allocated blocks: what tmpfs takes from memory)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _signed_rounds(spec: SimFleetSpec, key: Any, rounds: int, prefix: str) -> list[bytes]:
    """``rounds`` signed round configurations of the simulation's base parameters (ids ``<prefix>-<r>``)."""
    from protocols import wire

    return [wire.sign_round(wire.RoundConfig(round_id=f"{prefix}-{r}", protocol="flower",
                                             epsilon=spec.max_round_epsilon, params=round_params(spec)),
                            key).to_bytes() for r in range(rounds)]


def _host_in_process(spec: SimFleetSpec, partitions: range, payloads: list[bytes]) -> None:
    """The shards ``partitions`` of ``spec`` hosted in this process as a shard host hosts them (no Ray, no Flower):
    enrolment, then every round of ``payloads`` answered by every shard in turn."""
    factory = SimHostFactory(spec)
    for p in partitions:
        factory({"partition-id": p}).announce()
    for t, payload in enumerate(payloads):
        for p in partitions:
            factory({"partition-id": p}).answer(payload, t)


def _footprint_child(devices: int, rounds: int, signature: str, streams: list[str], max_open: int) -> dict[str, float]:
    """In a fresh process (a shard host's situation): ``devices`` hosted devices, at most ``max_open`` of them open,
    announce and answer ``rounds`` rounds; resident memory and state files per device, from after a warm-up shard."""
    from edge_agent.flower_app import OPEN_AGENTS
    from protocols import wire
    from simulations.proc_stats import rss

    configure_environment()
    root = tmpfs_workdir()
    try:
        key = wire.generate_signing_key()
        spec = SimFleetSpec(run_id="footprint", n_devices=_WARM_DEVICES + devices, shard_size=_WARM_DEVICES,
                            state_root=str(root / "devices"), coordinator_public_key=wire.public_key_b64(key),
                            signature=signature, streams=tuple(streams))
        OPEN_AGENTS.configure(devices=spec.n_devices, max_open=max_open, hosted=True)
        payloads = _signed_rounds(spec, key, rounds, "footprint")
        _host_in_process(spec, range(1), payloads)
        gc.collect()
        rss0, files0 = rss(os.getpid()), _files_bytes(root)
        _host_in_process(spec, range(1, spec.n_shards), payloads)
        gc.collect()
        return {"rss": (rss(os.getpid()) - rss0) / devices, "files": (_files_bytes(root) - files0) / devices}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def host_rounds(devices: int, rounds: int, signature: str = "hmac-sha256", shard_size: int = 100) -> None:
    """Host ``devices`` simulated devices in this process as a 100,000-device simulation's shard host does — full
    agents, every database reattached for each round — enrol them and answer ``rounds`` rounds of the simulation's
    streams (``python -m simulations.flower_phases``: a device round's instructions under callgrind). For a process
    of its own: it configures the process-wide :data:`edge_agent.flower_app.OPEN_AGENTS`."""
    from edge_agent.flower_app import OPEN_AGENTS
    from protocols import wire

    configure_environment()
    root = tmpfs_workdir("haarvest-host-rounds-")
    try:
        key = wire.generate_signing_key()
        spec = SimFleetSpec(run_id="host-rounds", n_devices=devices, shard_size=shard_size, state_root=str(root),
                            coordinator_public_key=wire.public_key_b64(key), signature=signature)
        OPEN_AGENTS.configure(devices=devices, max_open=1, hosted=True)
        _host_in_process(spec, range(spec.n_shards), _signed_rounds(spec, key, rounds, "host-rounds"))
    finally:
        OPEN_AGENTS.close_all()
        shutil.rmtree(root, ignore_errors=True)


def _pythonpath() -> str:
    """This process's import path as a ``PYTHONPATH`` (child processes import the same tree)."""
    return os.pathsep.join([p for p in sys.path if p] + ([os.environ["PYTHONPATH"]]
                                                         if os.environ.get("PYTHONPATH") else []))


def measure_footprint(devices: int = FOOTPRINT_DEVICES, rounds: int = 2, signature: str = "hmac-sha256",
                      streams: tuple[str, ...] = ("age", "edu", "syn")) -> DeviceFootprint:
    """Measure :class:`DeviceFootprint` in two fresh processes (every database open; every database closed after
    each round), each hosting ``devices`` devices for ``rounds`` rounds (the WAL of an open database grows with the
    rounds until its checkpoint). Takes a few seconds."""
    import subprocess

    out = {}
    for mode, max_open in (("open", _WARM_DEVICES + devices), ("closed", 1)):
        code = ("import json, sys; from simulations.flower_sim import _footprint_child; "
                "print(json.dumps(_footprint_child(*json.loads(sys.argv[1]))))")
        args = json.dumps([devices, rounds, signature, list(streams), max_open])
        proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": _pythonpath()}, timeout=600)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return DeviceFootprint(open_rss=out["open"]["rss"], open_files=out["open"]["files"],
                           closed_rss=out["closed"]["rss"], closed_files=out["closed"]["files"], devices=devices,
                           rounds=rounds)


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


def default_max_open(devices: int, workers: int, footprint: DeviceFootprint, memory: int | None = None) -> int:
    """Open device databases per host for ``devices`` devices on ``workers`` hosts: all of them when every device
    open (``footprint.open_bytes`` each) fits :data:`MEMORY_SHARE` of the available memory less
    :data:`SIM_OVERHEAD_BYTES`; else one — the others reattach their database each round.

    Not "as many as fit": SQLite's unix VFS finds a file it opens in a list of every file the process holds open
    (one entry per database and one per WAL), so each reattachment costs time proportional to the databases kept open
    (measured: 0.24 ms to reattach, write and close a database with none other open, 2.6 ms with 9,000 open). With
    R the reattachment's own cost and k that cost per open fraction, a host's rounds cost (1 − f)·(R + k·f) per device
    at an open fraction f: concave, so least at f = 1 (all open) or f ≈ 0, never in between unless nearly all fit."""
    memory = available_memory() if memory is None else memory
    per_host = math.ceil(devices / max(1, workers))
    budget = MEMORY_SHARE * memory - SIM_OVERHEAD_BYTES
    if memory <= 0 or devices * footprint.open_bytes <= budget:
        return max(1, per_host)
    return 1


def memory_needed(devices: int, workers: int, max_open: int, footprint: DeviceFootprint) -> int:
    """Memory (RAM plus tmpfs) a simulation needs by ``footprint``: open and closed devices plus the fixed
    overhead."""
    open_devices = min(devices, workers * max_open)
    return int(open_devices * footprint.open_bytes + (devices - open_devices) * footprint.closed_bytes
               + SIM_OVERHEAD_BYTES)


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


def tmpfs_workdir(prefix: str = "haarvest-flower-") -> Path:
    """A fresh directory on tmpfs (/dev/shm) where it is writable, else in the default temporary directory: where
    simulated devices keep their state (every device round commits with ``synchronous=FULL``)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


#: devices per virtual SuperNode by default (:func:`default_nodes`): Flower's in-memory link state walks its stored
#: messages on every node's poll, so its cost grows with the node count; a shard host answers a node's devices in turn
NODE_DEVICES = 2500


def default_nodes(devices: int, workers: int) -> int:
    """Virtual SuperNodes for ``devices`` devices on ``workers`` shard hosts: shards of about :data:`NODE_DEVICES`,
    but at least 10 per host (while there are devices): Flower's actors hand the nodes' messages to the hosts in no
    particular order, so with few large shards one host can sit idle while the other works through its queue (a
    10,000-device round on 8 nodes left the hosts idle a third of the time)."""
    return max(1, min(devices, max(10 * workers, math.ceil(devices / NODE_DEVICES))))


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
    workers = _cores() if workers is None else int(workers)
    forwarders = 2 * workers if forwarders is None else int(forwarders)
    if workers < 1 or forwarders < 1:
        raise ValueError("need workers >= 1 and forwarders >= 1")
    if shard_size is None:
        n_nodes = nodes if nodes is not None else default_nodes(devices, workers)
        shard_size = math.ceil(devices / n_nodes)
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")

    configure_environment()
    import ray
    from flwr.simulation import run_simulation

    from coordinator.flower_app import FlowerCoordinator, FlowerSettings, make_server_app
    from coordinator.store import open_store
    from edge_agent.flower_app import make_client_app
    from protocols import wire
    from simulations.proc_stats import tree_cpu

    t_start = time.perf_counter()
    root = Path(workdir) if workdir is not None else tmpfs_workdir()
    root.mkdir(parents=True, exist_ok=True)
    key = wire.generate_signing_key()
    spec = SimFleetSpec(
        run_id=f"{os.getpid()}-{time.time_ns()}", n_devices=devices, shard_size=shard_size,
        state_root=str(root / "devices"), coordinator_public_key=wire.public_key_b64(key), seed=seed,
        adult_path=str(adult_path), epsilon=epsilon, streams=tuple(streams), signature=signature, unit=unit,
    )
    n_nodes = spec.n_shards
    workers = min(workers, n_nodes)
    extra: dict[str, Any] = {}
    if max_open is None:
        if devices <= SMALL_FLEET:
            max_open = math.ceil(devices / workers)
        else:
            footprint = measure_footprint(rounds=min(rounds, 3), signature=signature, streams=tuple(streams))
            extra["footprint"] = footprint.to_dict()
            max_open = default_max_open(devices, workers, footprint)
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
    extra.update({"workers": workers, "forwarders": forwarders, "max_open": max_open})

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
        pythonpath = _pythonpath()
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
    parser.add_argument("--shard-size", type=int, default=None,
                        help="devices per virtual SuperNode (default: about 2,500, at least 10 nodes per worker)")
    parser.add_argument("--nodes", type=int, default=None, help="virtual SuperNodes (alternative to --shard-size)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="data seed (device noise always uses OS entropy)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε per stream and report")
    parser.add_argument("--streams", default="age,edu,syn", help="comma-separated subset of age,edu,syn")
    parser.add_argument("--workdir", default=None, help="device and coordinator state (default: a temp dir, removed)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-round straggler timeout (s)")
    parser.add_argument("--workers", type=int, default=None, help="shard host processes (default: one per core)")
    parser.add_argument("--max-open", type=int, default=None,
                        help="device databases each host keeps open (default: as many as fit the memory by a measured "
                             "footprint)")
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
