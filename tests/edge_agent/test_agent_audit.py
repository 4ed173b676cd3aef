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
import zlib
from pathlib import Path

import numpy as np
import pytest

from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, numeric, simple_config
from edge_agent.sources import IterableSource
from protocols import catalogue
from protocols.audit import audit, grid_reachable, release_audit
from protocols.wire import canonical_json
from tests.conftest import AUDIT_TRIALS

pytestmark = pytest.mark.audit

#: agents are real processes' worth of state: the regular run uses fewer trials than the mechanism audits
TRIALS = min(AUDIT_TRIALS, 1500)


class AgentTranscripts:
    """``privatize((N, τ) readings, rng) -> (N, τ) report values``: one fresh real agent per row."""

    delta = 0.0

    def __init__(self, root: Path, dimension: dict, unit: str, streams: list | None = None,
                 dimensions: list | None = None, **config) -> None:
        self.root, self.dimension, self.unit, self.streams = root, dimension, unit, streams
        self.dimensions = dimensions or [dimension]
        self.config = config
        self.count = 0
        self.charged: list[float] = []
        self.released: list = []  # every report row, as sent

    def privatize(self, readings: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty(readings.shape, dtype=float)
        name = self.dimension["name"]
        for i, row in enumerate(readings):
            self.count += 1
            cfg = simple_config(f"a{self.count}", self.root / f"a{self.count}", self.dimensions, self.streams,
                                total_cap=1e6, privacy={"unit": self.unit}, **self.config)
            cast = int if self.dimension["kind"] == "categorical" else float
            values = [{d["name"]: cast(v) if d["name"] == name else 0.5 * (d["lo"] + d["hi"]) for d in self.dimensions}
                      for v in row]
            agent = Agent(cfg, IterableSource(values), secrets=new_identity(), transport=False).open()
            for t in range(len(row)):
                (commit,) = agent.report(f"r{t}").commits
                rep = commit.body["report"]
                self.released.append(rep)
                out[i, t] = zlib.crc32(canonical_json(rep))  # transcripts compared report by report, exactly
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


#: Every numeric and distribution stream mechanism (SPEC §3.0: each releases grid indices), with the extra config
#: it needs: vector and record mechanisms report two dimensions, the Gaussian a δ (and its ledger a δ cap).
GRID_STREAMS = {
    "laplace": {}, "pdp": {}, "piecewise": {}, "hybrid": {}, "duchi": {},
    "gaussian": {"stream": {"params": {"delta": 1e-6}}, "epsilon": 0.5,
                 "config": {"ledger": {"total_cap": 1e6, "delta_cap": 1e-3}}},
    "ksampling": {"dims": 2}, "duchi_md": {"dims": 2}, "haar": {"dims": 2},
    "distribution_flat": {}, "distribution_hierarchical": {}, "distribution_haar": {}, "distribution_square_wave": {},
}


def _grid_transcripts(root: Path, name: str) -> AgentTranscripts:
    extra = GRID_STREAMS[name]
    dims = [numeric("cpu", 0, 100)] + ([numeric("mem", 0, 100)] if extra.get("dims") else [])
    stream = {"name": "s", "dimensions": [d["name"] for d in dims], "mechanism": name,
              "epsilon": extra.get("epsilon", 1.0), **extra.get("stream", {})}
    return AgentTranscripts(root, dims[0], "device", [stream], dims, **extra.get("config", {}))


@pytest.mark.parametrize("name", sorted(GRID_STREAMS))
def test_every_numeric_and_distribution_stream_audits_within_its_ledger(shm_root, name, rng):
    """Whole transcripts of real agents for every numeric and distribution mechanism: each report an integer row
    (never a double), the scalar ones on their grid and reachable from the other input (the float-structure audit
    of protocols.audit), and the transcripts within the ledger's ε under the exact-equality events."""
    mech = _grid_transcripts(shm_root, name)
    eps = GRID_STREAMS[name].get("epsilon", 1.0)
    mech.epsilon = 2 * eps
    trials = min(TRIALS, 150)
    result = audit(mech, np.array([40.0, 40.0]), np.array([40.0, 90.0]), _events(), trials, rng)
    assert set(np.round(mech.charged, 9)) == {2 * eps}
    assert result.passed, result

    def integers(row) -> bool:
        if isinstance(row, dict):
            return integers(row["mean"]) and integers(row["detail"])
        if isinstance(row, list):
            return all(integers(v) for v in row)
        return type(row) is int

    assert all(integers(r) for r in mech.released)
    if catalogue.entry(name).family is catalogue.Family.NUMERIC:
        params = {"delta": 1e-6} if name == "gaussian" else {}
        built = catalogue.build(name, epsilon=eps, **params)
        other = 2 * 90.0 / 100 - 1  # the other reading, normalised
        assert release_audit(mech.released, grid_reachable(built, other)).passed


def test_the_grid_check_catches_the_old_double_release():
    """Negative control: a double in place of an index is never reachable (the old release's reports)."""
    built = catalogue.build("hybrid", epsilon=1.0)
    assert not release_audit([0.53, 1200], grid_reachable(built, 0.8)).passed
