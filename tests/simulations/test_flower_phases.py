"""Phase clocks of the Flower simulation's shard hosts: exclusive accounting, restoring what they wrapped."""

from __future__ import annotations

import itertools

from edge_agent.agent import Agent
from edge_agent.state import State
from simulations.flower_phases import PHASES, PhaseClock
from simulations.proc_stats import tree_cpu


def test_nested_phases_are_charged_exclusively():
    ticks = itertools.count()
    clock = PhaseClock(clock=lambda: float(next(ticks)))
    inner = clock._timed("sign", lambda: None)  # start 1, end 2: 1 s

    def outer_fn() -> None:
        inner()

    outer = clock._timed("ledger transaction", outer_fn)  # start 0, end 3: 3 s, 1 of them the signer's
    outer()
    assert clock.seconds["sign"] == 1.0 and clock.seconds["ledger transaction"] == 2.0
    made = clock._maker("privatize", lambda: (lambda: 7))()
    assert made() == 7 and clock.seconds["privatize"] == 1.0
    assert set(clock.seconds) == set(PHASES)


def test_install_wraps_and_uninstall_restores():
    originals = (State.__init__, State.commit_reports, Agent.sample, Agent._payload)
    clock = PhaseClock().install()
    try:
        assert State.__init__ is not originals[0] and Agent._payload is not originals[3]
        assert clock.install() is clock  # once
    finally:
        clock.uninstall()
    assert (State.__init__, State.commit_reports, Agent.sample, Agent._payload) == originals


def test_tree_cpu_counts_this_process():
    first = tree_cpu()
    sum(i * i for i in range(200_000))
    assert 0.0 <= first <= tree_cpu()
