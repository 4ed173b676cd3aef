"""Where a Flower simulation's device rounds spend their CPU: phase clocks in a shard host, process-tree CPU.

:class:`PhaseClock` wraps a few functions of the device side (in the process that calls :meth:`PhaseClock.install`:
a simulation's shard host) with thread-CPU timers and charges each call to a phase, *exclusive* of the phases
nested in it (the ledger transaction calls the privatizer and the signer; those seconds are theirs):

* ``open/close`` — a suspended device's database reattached and closed again (:class:`edge_agent.state.State`);
* ``reading+plan`` — the reading, its pipeline (validation, α-rounding, volatility windows) and the round's plans
  (:meth:`edge_agent.agent.Agent.sample`, :meth:`edge_agent.pipeline.Pipeline.prepare`);
* ``privatize`` — the mechanisms' noise and the report body (the body makers of the pipeline);
* ``sign`` — the signed report (:class:`protocols.wire.Report`, canonical JSON, HMAC or Ed25519);
* ``ledger transaction`` — the device round's SQLite transaction (caps, ledger debit, memo, outbox, commit);
* ``ledger mark`` — the ledger mark file written after each commit (:mod:`edge_agent.ledger_guard`).

The rest of a host's busy CPU (round check, reply assembly, Ray's threads in that process) is what the caller
reports as the remainder. The timers cost ~1 µs per wrapped call (a few per device round).

:func:`simulations.proc_stats.tree_cpu` sums the CPU seconds of a process and all its descendants from ``/proc`` (Ray's raylet, GCS, the
Flower actors and the shard hosts are descendants of the driver): the whole simulation's CPU in a round.

:func:`state_floor` measures the device database's work of a device round with no agent around it — what a round
costs a reattached device database as :class:`edge_agent.state.State` does it today, however cheap the rest of the
agent's work were. :func:`main` (``python -m simulations.flower_phases``) hosts a shard of devices in one process
(:func:`simulations.flower_sim.host_rounds`) for counting a device round's instructions, which do not move with the
machine's speed::

    valgrind --tool=callgrind python -m simulations.flower_phases --devices 200 --rounds 1
    valgrind --tool=callgrind python -m simulations.flower_phases --devices 200 --rounds 3

The difference of the two runs' totals over 2 × 200 is one device round (imports, enrolment and the first round
cancel out).
"""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PHASES", "PhaseClock", "state_floor", "main"]

#: the phases in report order
PHASES = ("open/close", "reading+plan", "privatize", "sign", "ledger transaction", "ledger mark")


class PhaseClock:
    """Exclusive seconds per phase (see the module docstring) by ``clock`` (thread CPU time); ``seconds`` maps
    phase → seconds."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._stack: list[list[Any]] = []  # [phase, start, nested seconds]
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) of what install() wrapped

    def _timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock, stack, seconds = self.clock, self._stack, self.seconds

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            frame = [phase, clock(), 0.0]
            stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()
                spent = clock() - frame[1]
                seconds[phase] += spent - frame[2]
                if stack:
                    stack[-1][2] += spent

        return wrapper

    def _maker(self, phase: str, factory: Callable[..., Callable[..., Any]]) -> Callable[..., Callable[..., Any]]:
        """``factory`` returns a closure; the closure's calls are timed as ``phase``."""

        @functools.wraps(factory)
        def wrapper(*args: Any, **kwargs: Any) -> Callable[..., Any]:
            return self._timed(phase, factory(*args, **kwargs))

        return wrapper

    def install(self) -> "PhaseClock":
        """Wrap the device-side functions of this process (once; :meth:`uninstall` restores them)."""
        if self._saved:
            return self
        from edge_agent import agent as agent_mod
        from edge_agent import pipeline as pipeline_mod
        from edge_agent import state as state_mod

        State, Agent, Pipeline = state_mod.State, agent_mod.Agent, pipeline_mod.Pipeline
        for owner, name, phase, wrap in (
            (State, "__init__", "open/close", self._timed), (State, "close", "open/close", self._timed),
            (State, "commit_reports", "ledger transaction", self._timed),
            (Agent, "sample", "reading+plan", self._timed), (Pipeline, "prepare", "reading+plan", self._timed),
            (Pipeline, "_body_maker", "privatize", self._maker), (Agent, "_payload", "sign", self._maker),
            (agent_mod, "write_mark", "ledger mark", self._timed),
        ):
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, wrap(phase, original))
        return self

    def uninstall(self) -> None:
        """Restore the functions :meth:`install` wrapped."""
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


#: the streams of a :func:`state_floor` round (a simulated device answers three per round)
_FLOOR_STREAMS = ("age", "edu", "syn")


def state_floor(devices: int = 1000, rounds: int = 3, payload_bytes: int = 420) -> dict[str, float]:
    """The SQLite work of a device round alone: thread-CPU µs per device round of :class:`edge_agent.state.State` on
    a *hosted* database reattached for the round (a one-round connection, ``transient``), as a 100,000-device
    simulation's shard host does it, with no agent around it (no reading, privatization or signing: the reports are
    ready bytes).

    A round is what an answered round writes: the answered-once check (:meth:`State.round_seen`), then ONE
    :meth:`State.commit_reports` transaction with the round's record, a counter, the ``sent`` marks of the reports
    of the device's previous round and three ready reports (ledger debit, outbox row, ``next_seq``). Returns
    ``open/close`` (reattaching and closing the database) and ``transaction`` (the check and the commit), the means
    over ``rounds`` passes over ``devices`` databases on tmpfs, each pass after as many passes that fill the
    databases first; ``devices`` and ``rounds`` are returned too."""
    from edge_agent.state import ReportRequest, State
    from simulations.flower_sim import tmpfs_workdir

    root = tmpfs_workdir("haarvest-state-floor-")
    body = {"report": [0]}
    payload = b"x" * payload_bytes
    topic = "haarvest/reports/floor"
    try:
        paths = [root / f"{i:06d}" / "agent.sqlite3" for i in range(devices)]
        for path in paths:
            State(path, hosted=True).close()
        sent: dict[Path, list[int]] = {path: [] for path in paths}
        spent = {"open/close": 0.0, "transaction": 0.0}
        for r in range(2 * rounds):
            round_id = f"floor-{r}"
            requests = [ReportRequest(stream=name, round_id=round_id, memo_key=f"{r:02d}{j:062d}", spec=name,
                                      mechanism="olh", epsilon=1.0, stream_cap=1e9, round_cap=3.0, memoize=False,
                                      make_body=lambda: body, make_payload=lambda seq, b: (topic, payload))
                        for j, name in enumerate(_FLOOR_STREAMS)]
            reattached = checked = 0.0
            for path in paths:
                t0 = time.thread_time()
                state = State(path, hosted=True, reattach=True, transient=True)
                t1 = time.thread_time()
                state.round_seen(round_id)
                done = state.commit_reports(requests, total_cap=1e9, renewal_period_s=None, max_pending=1000,
                                            counters={"rounds.answered": 1}, round_record=(round_id, "answered", ""),
                                            sent=sent[path])
                t2 = time.thread_time()
                state.close()
                t3 = time.thread_time()
                sent[path] = [c.seq for c in done]  # type: ignore[union-attr]
                reattached, checked = reattached + (t1 - t0) + (t3 - t2), checked + t2 - t1
            if r >= rounds:
                spent["open/close"] += reattached
                spent["transaction"] += checked
        scale = 1e6 / (rounds * devices)
        return {"open/close": spent["open/close"] * scale, "transaction": spent["transaction"] * scale,
                "devices": devices, "rounds": rounds}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m simulations.flower_phases --devices N --rounds R``: :func:`simulations.flower_sim.host_rounds`."""
    import argparse

    from simulations.flower_sim import host_rounds

    parser = argparse.ArgumentParser(prog="python -m simulations.flower_phases", description=host_rounds.__doc__)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--signature", default="hmac-sha256", choices=("hmac-sha256", "ed25519"))
    args = parser.parse_args(argv)
    if args.devices < 1 or args.rounds < 0:
        parser.error("--devices must be >= 1 and --rounds >= 0")
    host_rounds(args.devices, args.rounds, args.signature)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
