"""Bench section: rounds of a Flower simulation of a large fleet (simulations/flower_sim.py).

Every simulated device is a full haarvest agent (pipeline, SQLite ledger/memo/outbox with ONE fsync'ed commit per
device round, signed reports); virtual SuperNodes host shards of devices (the "nodes" column); the shards live in one
host process per core for the whole run (Flower's actors forward each node's messages to the host owning it); the coordinator
(ServerApp) checks every report with the coordinator's Validator (signature; body support checks batched per reply)
and commits each reply in one transaction, then estimates the round. The devices' report keys are HMAC-SHA256
(``--signature hmac-sha256``: cheaper to sign and far cheaper to verify; the coordinator's registry holds the keys)
unless the row says Ed25519 (both costs measured below). Reported: start-up (Ray, host and actor start,
device enrolment = identity creation and first open of every device's state) and the wall time of each round after
start-up (round 1 charges every stream; round 2 reports age on the planner's first α-rounding grid — one new memo
entry per device — and the evolving Syn value; round 3 is the steady state), plus the CPU seconds each round took:
the devices' (sum over the hosts) and the coordinator's ingest, and where all of a round's CPU went (every process
of the simulation, device-side phases timed on the hosts). The rounds are CPU-bound: a round takes at least its
total CPU / cores. The hosts open their devices' databases as *hosted* (``State(hosted=True)``: exclusive locking,
so the WAL index lives in the host's memory and a database holds 2 descriptors; a small page cache; the WAL
checkpointed every 64 pages) — still WAL with ``synchronous=FULL`` and one commit per device round.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

__all__ = ["run"]

TARGET_DEVICES, TARGET_SECONDS = 10_000, 10.0
#: issue 18: a round of 100,000 devices in at most a minute on this machine
LARGE_DEVICES, LARGE_SECONDS = 100_000, 60.0


def _host_cpu(res: Any, t: int) -> float:
    return sum(h.get("busy_seconds", {}).get(f"round t={t}", {}).get("cpu", 0.0) for h in res.extra.get("hosts", []))


_KEYS = {"hmac-sha256": "HMAC-SHA256", "ed25519": "Ed25519"}


def _row(n: int, res: Any, rounds: int) -> str:
    secs = [f"{s:.2f}" for s in res.round_seconds] + [""] * (rounds - len(res.round_seconds))
    cpu = " / ".join(f"{_host_cpu(res, t):.1f} + {s.cpu_ingest:.1f}" for t, s in enumerate(res.summaries))
    last = res.summaries[-1]
    return (f"| {n:,} | {_KEYS[res.spec.signature]} | {res.n_nodes} | {res.extra.get('max_open', 0):,} | "
            f"{res.startup_seconds:.1f} | {' | '.join(secs)} | {cpu} | {n / res.round_seconds[-1]:,.0f} | "
            f"{last.accepted:,} |")


def run(quick: bool = False) -> str:
    """Markdown section: start-up and per-round times for 10,000 devices (HMAC-SHA256 report keys, then Ed25519 for
    comparison) and 100,000 devices (HMAC-SHA256); ``quick``: 1,000 devices (HMAC-SHA256)."""
    lines = ["## Flower simulation (sharded virtual SuperNodes)", ""]
    if importlib.util.find_spec("flwr") is None or importlib.util.find_spec("ray") is None:
        return "\n".join(lines + ["Skipped: needs `flwr[simulation]==1.41.0`.", ""])
    from simulations.bench._keys import key_costs, key_costs_text
    from simulations.flower_phases import state_floor
    from simulations.flower_sim import (MEMORY_SHARE, SMALL_FLEET, available_memory, default_max_open,
                                        measure_footprint, memory_needed, run_flower_simulation)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    runs = ((1_000, "hmac-sha256"),) if quick else ((TARGET_DEVICES, "hmac-sha256"), (TARGET_DEVICES, "ed25519"),
                                                    (100_000, "hmac-sha256"))
    rounds = 3
    lines += [
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"Streams age (Hybrid), edu (OUE, k=16), syn (OLH, k=360), ε = 1 each; {cores} cores, one shard host per "
        f"core; state on tmpfs. Hosts keep every device database open when all fit {MEMORY_SHARE:.0%} of the "
        "available memory (less an allowance for Ray, Flower and the coordinator) by each device's footprint "
        "measured before the run (below); else they reattach each database every round.",
        "",
        key_costs_text(key_costs()),
        "",
        "| devices | report keys | nodes | open per host | start-up s | round 1 s | round 2 s | round 3 s | "
        "CPU s per round (devices + coordinator) | devices/s (last round) | reports (last round) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    results: dict[tuple[int, str], Any] = {}
    footprints: dict[tuple[int, str], Any] = {}
    # the SQLite work of a device round with no agent around it, before the runs (a quiet process of its own)
    floor = state_floor(devices=100 if quick else 2_000, rounds=2 if quick else 3)
    for n, signature in runs:
        n_rounds = rounds if n <= TARGET_DEVICES else 2
        memory = available_memory()
        max_open = None
        if n > SMALL_FLEET:
            fp = footprints[(n, signature)] = measure_footprint(rounds=n_rounds, signature=signature)
            max_open = default_max_open(n, cores, fp, memory)
            need = memory_needed(n, cores, max_open, fp)
            shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
            open_devices = min(n, cores * max_open)
            disk = open_devices * fp.open_files + (n - open_devices) * fp.closed_files
            if memory and need > 0.9 * memory or shm and disk > 0.8 * shm:
                lines.append(f"| {n:,} | {_KEYS[signature]} | skipped: needs ~{need / 2**30:.1f} GiB (devices "
                             f"{fp.open_bytes / 2**10:.0f} KiB open / {fp.closed_bytes / 2**10:.0f} KiB closed, "
                             f"tmpfs part ~{disk / 2**30:.1f} GiB), {memory / 2**30:.1f} GiB available, "
                             f"{shm / 2**30:.1f} GiB tmpfs free | | | | | | | | |")
                continue
        try:
            res = run_flower_simulation(n, rounds=n_rounds, timeout=3600.0, max_open=max_open, signature=signature,
                                        phases=True)
        except Exception as exc:  # noqa: BLE001 - a section reports its failure instead of aborting the bench
            lines.append(f"| {n:,} | {_KEYS[signature]} | failed: {type(exc).__name__}: {exc} | | | | | | | | |")
            continue
        res.extra["memory"] = memory
        results[(n, signature)] = res
        lines.append(_row(n, res, rounds))
    lines.append("")
    res = results.get((TARGET_DEVICES, "hmac-sha256"))
    if res is not None:
        worst = max(res.round_seconds)
        steady = res.round_seconds[-1]
        cpu = _host_cpu(res, len(res.summaries) - 1) + res.summaries[-1].cpu_ingest
        lines.append(
            f"Target: {TARGET_DEVICES:,} devices per round in ≤ {TARGET_SECONDS:.0f} s after start-up on 2 cores "
            f"(HMAC-SHA256 report keys) — "
            f"{'met' if worst <= TARGET_SECONDS else 'not met'} (slowest round {worst:.1f} s, last {steady:.1f} s; "
            f"the last round used {cpu:.1f} CPU s, so on {cores} cores it cannot take less than "
            f"{cpu / cores:.1f} s).")
    else:
        lines.append(f"Target: {TARGET_DEVICES:,} devices per round in ≤ {TARGET_SECONDS:.0f} s after start-up on "
                     "2 cores.")
    large = results.get((LARGE_DEVICES, "hmac-sha256"))
    if large is not None:
        worst = max(large.round_seconds)
        lines.append(
            f"Target: {LARGE_DEVICES:,} devices per round in ≤ {LARGE_SECONDS:.0f} s after start-up on this machine "
            f"(HMAC-SHA256 report keys) — {'met' if worst <= LARGE_SECONDS else 'not met'} (slowest round "
            f"{worst:.1f} s; rounds {', '.join(f'{s:.1f}' for s in large.round_seconds)} s).")
    lines += ["", *_footprint(footprints, results), "", *_breakdown(results, footprints, cores, floor), ""]
    return "\n".join(lines)


def _footprint(footprints: dict[tuple[int, str], Any], results: dict[tuple[int, str], Any]) -> list[str]:
    """The measured footprint per device and the open databases it allowed, with the hosts' measured peak RSS."""
    rows = []
    for (n, signature), fp in footprints.items():
        res = results.get((n, signature))
        hosts = res.extra.get("hosts", []) if res is not None else []
        peak = " / ".join(f"{h.get('max_rss_mib', 0) / 1024:.1f}" for h in hosts) or "–"
        opened = f"{res.extra.get('max_open', 0):,}" if res is not None else "–"
        rows.append(f"| {n:,} | {_KEYS[signature]} | {fp.open_rss / 2**10:.0f} + {fp.open_files / 2**10:.0f} | "
                    f"{fp.closed_rss / 2**10:.0f} + {fp.closed_files / 2**10:.0f} | {opened} | {peak} |")
    if not rows:
        return []
    return [
        "Memory per device, measured before each run (KiB, resident memory of the shard host + state files on tmpfs, "
        "after the run's rounds; two fresh processes hosting the same devices with every database open, then with "
        "every database closed after each round), the open databases per host it allowed and the hosts' peak RSS "
        "in the run (GiB):",
        "",
        "| devices | report keys | open device KiB | closed device KiB | open per host | hosts' peak RSS GiB |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def _phases(res: Any, t: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for h in res.extra.get("hosts", []):
        for phase, sec in h.get("phase_seconds", {}).get(f"round t={t}", {}).items():
            out[phase] = out.get(phase, 0.0) + sec
    return out


#: the columns of :func:`_split` after the device-side phases
_REST = ("host rest", "coordinator ingest", "Flower/Ray + driver")


def _split(res: Any, t: int, n: int) -> dict[str, float] | None:
    """µs per device-round of round ``t`` (None without phase timings): the device-side phases on the shard hosts
    (:class:`simulations.flower_phases.PhaseClock`), the rest of the hosts' busy CPU, the coordinator's ingest
    (verification and store commits) and everything else — the CPU of every process of the simulation in the round
    (:func:`simulations.proc_stats.tree_cpu`: Ray, Flower's actors forwarding the messages, the driver's Grid
    polling, the estimates) less the former — and their sum ``total``."""
    from simulations.flower_phases import PHASES

    tree = res.extra.get("tree_cpu", [])
    phases = _phases(res, t)
    if not phases or t >= len(tree):
        return None
    host = _host_cpu(res, t)
    ingest = res.summaries[t].cpu_ingest
    out = {p: 1e6 * phases.get(p, 0.0) / n for p in PHASES}
    out.update(zip(_REST, (1e6 * (host - sum(phases.values())) / n, 1e6 * ingest / n,
                           1e6 * (tree[t] - host - ingest) / n)))
    out["total"] = 1e6 * tree[t] / n
    return out


def _remaining(results: dict[tuple[int, str], Any], footprints: dict[tuple[int, str], Any], cores: int,
               floor: dict[str, float] | None = None) -> list[str]:
    """What a device round of the largest run's last round is made of, grouped, against the round target; with
    ``floor`` (:func:`simulations.flower_phases.state_floor`), what the budget holds before any agent work."""
    from simulations.flower_sim import MEMORY_SHARE, SIM_OVERHEAD_BYTES

    large = results.get((LARGE_DEVICES, "hmac-sha256"))
    last = len(large.summaries) - 1 if large is not None else -1
    cost = _split(large, last, LARGE_DEVICES) if large is not None else None
    if cost is None:
        return []
    n = LARGE_DEVICES
    opened = min(n, large.extra.get("workers", cores) * large.extra.get("max_open", 0))
    fp = footprints.get((n, "hmac-sha256"))
    memory = large.extra.get("memory", 0)
    why = (f" — all {n:,} open would need {(SIM_OVERHEAD_BYTES + n * fp.open_bytes) / 2**30:.1f} GiB by the "
           f"footprint above, more than {MEMORY_SHARE:.0%} of the {memory / 2**30:.1f} GiB available, and keeping "
           "only part of them open would slow every reattachment: SQLite looks each file it opens up in a list of "
           "all the files the process holds open" if fp is not None and memory else "")
    sql = cost["open/close"] + cost["ledger transaction"]
    agent = cost["reading+plan"] + cost["privatize"] + cost["sign"] + cost["ledger mark"]
    small = results.get((TARGET_DEVICES, "hmac-sha256"))
    small_cost = _split(small, len(small.summaries) - 1, TARGET_DEVICES) if small is not None else None
    versus = (f", against {small_cost['ledger transaction']:,.0f} µs at {TARGET_DEVICES:,} devices where every "
              "database stays open" if small_cost is not None else "")
    allowed = 1e6 * LARGE_SECONDS * cores / n
    verdict = ("within it" if cost["total"] <= allowed
               else f"{cost['total'] - allowed:,.0f} µs ({cost['total'] / allowed - 1:.0%}) over it")
    return [
        f"What a device round costs at {n:,} devices (round {last + 1}, CPU of all processes): "
        f"{cost['total']:,.0f} µs. SQLite {sql:,.0f} µs: {cost['open/close']:,.0f} µs reattaching and closing the "
        f"databases that do not stay open ({n - opened:,} of the {n:,} devices{why}) and "
        f"{cost['ledger transaction']:,.0f} µs for the "
        f"round's transaction (compiling its statements again on a reattached connection{versus}); the agent's own "
        f"work {agent:,.0f} µs (reading and plans {cost['reading+plan']:,.0f}, privatization "
        f"{cost['privatize']:,.0f}, signing {cost['sign']:,.0f}, ledger mark {cost['ledger mark']:,.0f}); the "
        f"hosts' other work {cost['host rest']:,.0f} µs; the coordinator's ingest {cost['coordinator ingest']:,.0f} "
        f"µs; Flower/Ray and the driver {cost['Flower/Ray + driver']:,.0f} µs. A round of ≤ {LARGE_SECONDS:.0f} s on "
        f"{cores} cores allows {allowed:,.0f} µs per device round: this is {verdict}.",
        *([] if floor is None else ["", _floor_text(floor, cost, allowed)]),
        "",
        _capacity_text([n / s for s in large.round_seconds], _open_costs(results), cores, reattached=opened < n),
    ]


def _open_costs(results: dict[tuple[int, str], Any]) -> list[float]:
    """µs per device round (:func:`_split` ``total``) of every round of the HMAC-key runs in which no host
    reattached a database (every database stayed open: the hosts' own count, not the plan, which a descriptor limit
    or uneven shards can overrule)."""
    out = []
    for (n, signature), res in results.items():
        hosts = res.extra.get("hosts") or []
        if signature != "hmac-sha256" or not hosts or any(h.get("reattached", 1) for h in hosts):
            continue
        out += [c["total"] for t in range(len(res.summaries)) if (c := _split(res, t, n)) is not None]
    return out


def _capacity_text(large_rates: list[float], open_costs: list[float], cores: int, *, reattached: bool) -> str:
    """What this run says a round of :data:`LARGE_SECONDS` holds: at the rates of the :data:`LARGE_DEVICES`-device
    rounds (devices per wall second), and what :data:`LARGE_DEVICES` devices would take at the cost of a device round
    with no reattachment at all (``open_costs``, µs of CPU per device round of the runs that kept every database
    open), ``total CPU / cores`` being a round's least wall time; ``reattached``: the large run reattached
    databases."""
    lo, hi = min(large_rates), max(large_rates)
    text = (f"At the rates of this run's {LARGE_DEVICES:,}-device rounds ({lo:,.0f}–{hi:,.0f} devices/s), a "
            f"{LARGE_SECONDS:.0f} s round holds about {LARGE_SECONDS * lo:,.0f}–{LARGE_SECONDS * hi:,.0f} devices"
            + (" whose databases are reattached every round." if reattached else "."))
    if not open_costs:
        return text
    least = [LARGE_DEVICES * c / cores / 1e6 for c in (min(open_costs), max(open_costs))]
    verdict = ("over the target even then" if least[0] > LARGE_SECONDS
               else "within the target only at the cheapest" if least[1] > LARGE_SECONDS else "within the target")
    return (f"{text} With no reattachment at all (the runs above that kept every database open) a device round cost "
            f"{min(open_costs):,.0f}–{max(open_costs):,.0f} µs of CPU: {LARGE_DEVICES:,} devices at that cost take "
            f"at least {least[0]:.1f}–{least[1]:.1f} s per round on {cores} cores — {verdict}.")


def _floor_text(floor: dict[str, float], cost: dict[str, float], allowed: float) -> str:
    """The budget against what is spent before any agent work: the device database's own work measured with no
    agent (:func:`simulations.flower_phases.state_floor`), the coordinator's ingest and Flower/Ray of the round."""
    sql = floor["open/close"] + floor["transaction"]
    before = sql + cost["coordinator ingest"] + cost["Flower/Ray + driver"]
    left = allowed - before
    agent = cost["reading+plan"] + cost["privatize"] + cost["sign"] + cost["ledger mark"] + cost["host rest"]
    room = (f"leaving {left:,.0f} µs for the agent's own work and the hosts' (reading, plans, three privatizations "
            f"and signatures, the ledger mark, the round check and the reply: {agent:,.0f} µs in this round)"
            if left > 0 else "before any of the agent's own work or the hosts'")
    return (f"The device database's work alone, with no agent around it (this process, before the runs: "
            f"`State` on {int(floor['devices']):,} hosted databases, each reattached for a round that checks the round "
            f"was not answered and commits three ready reports with the round's record, a counter and the previous "
            f"round's sent marks): {floor['open/close']:,.0f} µs to reattach and close, {floor['transaction']:,.0f} "
            f"µs for the check and the transaction. With the coordinator's ingest and Flower/Ray of the round above, "
            f"{before:,.0f} µs of the {allowed:,.0f} µs a device round may cost are spent, {room}.")


def _breakdown(results: dict[tuple[int, str], Any], footprints: dict[tuple[int, str], Any], cores: int,
               floor: dict[str, float] | None = None) -> list[str]:
    """Where each round's CPU went, in µs per device-round (:func:`_split`), and what the round target leaves
    (:func:`_remaining`)."""
    from simulations.flower_phases import PHASES

    rows = []
    for (n, signature), res in results.items():
        for t in range(len(res.summaries)):
            cost = _split(res, t, n)
            if cost is None:
                continue
            tree = res.extra["tree_cpu"][t]
            rows.append(f"| {n:,} | {_KEYS[signature]} | {t + 1} | {res.round_seconds[t]:.1f} | {tree:.1f} | "
                        f"{cost['total']:,.0f} | " + " | ".join(f"{cost[c]:,.0f}" for c in (*PHASES, *_REST)) + " |")
    if not rows:
        return []
    return [
        "Where a round's CPU goes, in µs per device-round (measured in the runs above): the device-side phases on "
        "the shard hosts — reattaching and closing a suspended device's database (open/close), the reading and its "
        "pipeline and the round's plans, privatization, signing, the device round's SQLite transaction (caps, "
        "ledger debit, memo, outbox, commit; on a reattached database this includes compiling its statements), "
        "the ledger mark file — then the rest of the hosts' busy CPU (round check, reply assembly, Ray's threads), "
        "the coordinator's ingest (report verification, validation, store commits) and everything else: the CPU "
        "of all the simulation's processes in the round (Ray, Flower's actors forwarding the messages, the "
        f"driver's Grid polling, the estimates) less the former. On {cores} cores a round cannot take less than "
        "its total CPU over the cores.",
        "",
        "| devices | report keys | round | wall s | CPU s (all processes) | µs per device | "
        + " | ".join(PHASES) + " | " + " | ".join(_REST) + " |",
        "| ---: | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in PHASES) + " | ---: | ---: | ---: |",
        *rows,
        "",
        *_remaining(results, footprints, cores, floor),
    ]
