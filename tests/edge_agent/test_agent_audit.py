"""Audits through the real agent: fresh devices (each its own identity, SQLite ledger, memo and outbox), the
default configuration (an ``auto`` stream per dimension, the ``device`` unit), whole transcripts of τ = 2 readings
that differ in *when* the value changes — (x, x) against (x, y) — audited (LDP-Auditor style, Clopper–Pearson,
Bonferroni over events and orderings) against the ε the ledgers charged.

The negative control is the configuration this project shipped before privacy units: memoized reports re-sent
verbatim under the ``value`` unit. Its transcripts are told apart far beyond what its ledger charged.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.sources import IterableSource
from protocols.audit import audit
from tests.conftest import AUDIT_TRIALS

pytestmark = pytest.mark.audit

#: agents are real processes' worth of state: the regular run uses fewer trials than the mechanism audits
TRIALS = min(AUDIT_TRIALS, 1500)


class AgentTranscripts:
    """``privatize((N, τ) readings, rng) -> (N, τ) report values``: one fresh real agent per row."""

    delta = 0.0

    def __init__(self, root: Path, dimension: dict, unit: str, streams: list | None = None) -> None:
        self.root, self.dimension, self.unit, self.streams = root, dimension, unit, streams
        self.count = 0
        self.charged: list[float] = []

    def privatize(self, readings: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(readings.shape, dtype=float)
        name = self.dimension["name"]
        for i, row in enumerate(readings):
            self.count += 1
            cfg = simple_config(f"a{self.count}", self.root / f"a{self.count}", [self.dimension], self.streams,
                                total_cap=1e6, privacy={"unit": self.unit})
            values = [{name: (int(v) if self.dimension["kind"] == "categorical" else float(v))} for v in row]
            agent = Agent(cfg, IterableSource(values), secrets=new_identity(), transport=False).open()
            for t in range(len(row)):
                (commit,) = agent.report(f"r{t}").commits
                rep = commit.body["report"]
                out[i, t] = rep if np.isscalar(rep) else float(np.ravel(rep)[0])
            self.charged.append(agent.state.spent())
            agent.close()
        return out


def _events():
    return [lambda r: r[:, 0] == r[:, 1], lambda r: r[:, 0] != r[:, 1]]


@pytest.fixture
def shm_root():
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield Path(d)


CASES = {
    "categorical": (categorical("mode", 3), np.array([0, 0]), np.array([0, 1])),
    "numeric": (numeric("cpu", 0, 100), np.array([40.0, 40.0]), np.array([40.0, 90.0])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_default_agent_transcripts_audit_within_the_device_ledger(shm_root, case, rng):
    dim, a, b = CASES[case]
    mech = AgentTranscripts(shm_root, dim, "device")
    mech.epsilon = 2.0  # what every device's ledger charged for the two reports (checked below)
    result = audit(mech, a, b, _events(), TRIALS, rng)
    assert set(np.round(mech.charged, 9)) == {2.0}
    assert result.passed, result


@pytest.mark.parametrize("case", sorted(CASES))
def test_negative_control_memoized_default_is_caught(shm_root, case, rng):
    """Memo hits re-sent verbatim (the old default): the value unit's ledger says 1 for (x, x), 2 for (x, y)."""
    dim, a, b = CASES[case]
    mech = AgentTranscripts(shm_root, dim, "value")
    mech.epsilon = 2.0  # the larger of the two ledgers
    result = audit(mech, a, b, _events(), TRIALS, rng)
    assert sorted(set(np.round(mech.charged, 9))) == [1.0, 2.0]
    assert not result.passed and result.epsilon_emp > 4.0, result
