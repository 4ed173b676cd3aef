"""Phase clocks of the Flower simulation's shard hosts: exclusive accounting, restoring what they wrapped."""

from __future__ import annotations

import itertools
import os

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


def test_state_floor_measures_a_committed_round_and_cleans_up(monkeypatch):
    """state_floor times real hosted databases through State: every round commits (three reports, their ledger rows,
    the previous round's sent marks), and its files are gone afterwards."""
    from simulations import flower_phases

    committed, roots = [], []
    real_commit = State.commit_reports
    from simulations import flower_sim

    real_mkdtemp = flower_sim.tempfile.mkdtemp

    def commit(self, requests, **kw):
        out = real_commit(self, requests, **kw)
        committed.append((len([c for c in out if not isinstance(c, Exception)]), len(kw["sent"]),
                          self.check_invariants()["ok"]))
        return out

    def mkdtemp(**kw):
        roots.append(real_mkdtemp(**kw))
        return roots[-1]

    monkeypatch.setattr(State, "commit_reports", commit)
    monkeypatch.setattr(flower_sim.tempfile, "mkdtemp", mkdtemp)  # state_floor's directory: tmpfs_workdir
    out = flower_phases.state_floor(devices=5, rounds=2)
    assert out["devices"] == 5 and out["rounds"] == 2
    assert out["open/close"] > 0 and out["transaction"] > 0
    assert len(committed) == 5 * 4  # 2 rounds to fill, 2 measured
    assert all(n == 3 and ok for n, _, ok in committed)
    assert [s for _, s, _ in committed[:5]] == [0] * 5 and all(s == 3 for _, s, _ in committed[5:])
    assert len(roots) == 1 and not os.path.exists(roots[0])


def test_host_rounds_runs_as_a_process_of_its_own():
    """``python -m simulations.flower_phases`` hosts and answers rounds (what the instruction counts of docs/flower.md
    run under callgrind); a bad argument is one line on stderr and exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    ok = subprocess.run([sys.executable, "-m", "simulations.flower_phases", "--devices", "3", "--rounds", "2"],
                        capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "simulations.flower_phases", "--devices", "0"],
                         capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert bad.returncode == 2 and "--devices must be >= 1" in bad.stderr.strip().splitlines()[-1]
