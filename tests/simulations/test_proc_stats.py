"""The benchmarks' one /proc reader: a process's CPU and peak memory, its children, its tree."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from simulations.proc_stats import children, peak_rss, process_cpu, rss, tree_cpu

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"


def test_a_child_is_found_and_counted_in_the_tree_then_in_the_reaped_time():
    me = os.getpid()
    child = subprocess.Popen([sys.executable, "-c", BUSY + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline_cpu = 0.0
        while deadline_cpu < 0.15:  # the child's busy loop has run
            deadline_cpu = process_cpu(child.pid)
        assert child.pid in children(me)
        assert tree_cpu(me) >= process_cpu(me) + 0.15
        assert peak_rss(child.pid) >= rss(child.pid) > 0
    finally:
        child.communicate(b"", timeout=30)
    assert child.pid not in children(me)
    assert process_cpu(me, reaped=True) >= process_cpu(me) + 0.15  # the reaped child's time is the parent's cutime


def test_a_gone_process_raises_and_the_tree_of_nothing_is_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(OSError):
        process_cpu(proc.pid)
    assert tree_cpu(proc.pid) == 0.0


def test_python_speed_is_a_positive_time_per_step():
    """The machine-speed reading the fleet-scale bench prints beside its rates."""
    from simulations.proc_stats import python_speed

    assert 0 < python_speed(steps=10_000, repeat=2) < 1e6
