"""SIGKILL the reporting agent at random points ≥ 200 times: ledger, outbox and database stay consistent."""

from __future__ import annotations

import hashlib

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_agent.state import State
from protocols import wire

pytestmark = pytest.mark.fault

ITERATIONS = 220


def _check(db_path: Path, published: Path) -> dict:
    with State(db_path) as st:
        assert st.integrity_check() == ["ok"]
        inv = st.check_invariants()
        assert inv["ok"], inv
        con = st._db
        outbox = {s: (status, eps) for s, status, eps in con.execute("SELECT seq, status, epsilon FROM outbox")}
        charges = {s: e for s, e in con.execute("SELECT seq, epsilon FROM ledger")}
        # every charge belongs to exactly one enqueued report and matches its ε
        for seq, eps in charges.items():
            assert seq in outbox and abs(outbox[seq][1] - eps) < 1e-12, (seq, eps)
        for seq, (_, eps) in outbox.items():
            assert (eps == 0 and seq not in charges) or abs(charges.get(seq, -1) - eps) < 1e-12
        # the ledger id order follows seq order (append-only, one transaction per report)
        seqs = [s for (s,) in con.execute("SELECT seq FROM ledger ORDER BY id")]
        assert seqs == sorted(seqs)
        # nothing was ever "published" without its committed, charged outbox row
        lines = published.read_text().split("\n")[:-1] if published.exists() else []
        torn = 0
        for line in lines:
            seq_s, digest, payload = line.split(" ", 2)
            if hashlib.sha256(payload.encode()).hexdigest() != digest:
                torn += 1  # SIGKILL in the middle of the harness's own os.write: the next child appended to it
                continue
            seq = int(seq_s)
            assert seq in outbox, f"published seq {seq} has no outbox row"
            rep = wire.decode_report(payload.encode())
            assert rep.seq == seq
            assert outbox[seq][1] == 0 or seq in charges
        counters = st.counters()
        assert torn <= max(1, len(lines) // 20), f"{torn} torn lines of {len(lines)}"
        return {"published": len(lines), "outbox": len(outbox), "charges": len(charges), "boot": st.boot,
                "counters": counters, "spent": st.spent()}


def test_sigkill_loop_keeps_ledger_consistent(tmp_path):
    rng = np.random.default_rng(7)
    key = wire.generate_signing_key()
    state_dir, published = tmp_path / "state", tmp_path / "published.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.edge_agent.crash_worker", str(state_dir), str(published),
         wire.private_key_b64(key), "ab" * 32],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert worker.stdout.readline().strip() == "ready"
        killed = 0
        for i in range(ITERATIONS):
            delay = float(rng.uniform(2.0, 100.0))
            worker.stdin.write(f"go {delay:.3f}\n")
            worker.stdin.flush()
            answer = worker.stdout.readline().split()
            assert answer and answer[0] == "killed", answer
            killed += 1
            if i % 10 == 9 or i == ITERATIONS - 1:
                summary = _check(state_dir / "agent.sqlite3", published)
        worker.stdin.write("quit\n")
        worker.stdin.flush()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert killed >= 200
    # the loop did real work (loose bounds: a loaded machine starts the children slower)
    assert summary["boot"] >= 20, summary
    assert summary["charges"] >= 10 and summary["published"] >= 10, summary
    print(json.dumps(summary))


def test_check_after_every_kill_for_a_few(tmp_path):
    """Same loop, shorter, checking after every single kill (covers states the 1-in-10 sampling might skip)."""
    key = wire.generate_signing_key()
    state_dir, published = tmp_path / "state", tmp_path / "published.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.edge_agent.crash_worker", str(state_dir), str(published),
         wire.private_key_b64(key), "cd" * 32],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )
    rng = np.random.default_rng(11)
    try:
        assert worker.stdout.readline().strip() == "ready"
        for _ in range(30):
            worker.stdin.write(f"go {rng.uniform(1.0, 40.0):.3f}\n")
            worker.stdin.flush()
            assert worker.stdout.readline().startswith("killed")
            _check(state_dir / "agent.sqlite3", published)
        worker.stdin.write("quit\n")
        worker.stdin.flush()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
    _ = sqlite3  # the checks above open the database read-write like the agent would
