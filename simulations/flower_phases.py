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
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PHASES", "PhaseClock"]

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
