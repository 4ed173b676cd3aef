"""CPU and memory of processes from Linux's ``/proc``, for the benchmarks: one process, its children, its tree;
and how fast this machine runs Python at the moment (:func:`python_speed`).

``/proc/<pid>/stat`` fields after the command name: utime, stime, cutime, cstime are the 12th–15th (clock ticks;
cutime/cstime hold the children the process has reaped). Functions raise OSError for a process that is gone, except
:func:`tree_cpu`, which skips processes that exit while it reads.
"""

from __future__ import annotations

import os
import time

__all__ = ["process_cpu", "children", "tree_cpu", "peak_rss", "rss", "python_speed"]


def _stat(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()


def process_cpu(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of process ``pid``; with ``reaped``, plus those of the children it has reaped."""
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def _parents() -> dict[int, list[int]]:
    """Parent pid → the pids of its living children, for every process."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(_stat(int(name))[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def children(pid: int) -> list[int]:
    """The living children of process ``pid``."""
    return _parents().get(pid, [])


def tree_cpu(pid: int | None = None, *, reaped: bool = False) -> float:
    """CPU seconds of process ``pid`` (default this one) and all its living descendants (with ``reaped``, plus
    what the root process's reaped children spent); 0.0 where ``/proc`` is not available."""
    if not os.path.isdir("/proc"):
        return 0.0
    root = os.getpid() if pid is None else pid
    kids = _parents()
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, ()))
        try:
            total += process_cpu(p, reaped=reaped and p == root)
        except (OSError, IndexError, ValueError):  # exited while read
            continue
    return total


def _status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` in bytes (0 when absent)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss(pid: int) -> int:
    """VmHWM (peak resident set) of a live process, bytes."""
    return _status_bytes(pid, "VmHWM")


def rss(pid: int) -> int:
    """VmRSS (resident set now) of a live process, bytes."""
    return _status_bytes(pid, "VmRSS")


def python_speed(steps: int = 1_000_000, repeat: int = 3) -> float:
    """Nanoseconds per step of a fixed pure-Python loop (the best of ``repeat`` runs): how fast this machine runs
    Python at the moment, to read a benchmark's rates beside. On a shared virtual machine it changes between runs
    of the same code — the rates of CPU-bound Python with it, those of a latency-bound C client far less."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i ^ (i >> 3)
        best = min(best, time.perf_counter() - t0)
    return 1e9 * best / steps
