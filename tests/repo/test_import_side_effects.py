"""Importing a haarvest module has no side effects: the environment, sys.path, the root logger, the warning filters
and the working directory are the same after every import as before it. Setting up a run's
environment is the job of the function that starts the run (e.g. :func:`simulations.flower_sim.configure_environment`,
called by :func:`simulations.flower_sim.run_flower_simulation`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("haarvest", "protocols", "edge_agent", "coordinator", "simulations")

# Runs in a fresh interpreter (nothing imported yet) with an empty working directory; prints one JSON object.
_PROBE = r"""
import importlib, json, logging, os, sys, warnings

names = json.loads(sys.argv[1])
import numpy, scipy.optimize, scipy.stats  # their own import-time warning filters are theirs, not haarvest's

def snapshot():
    root = logging.getLogger()
    return {"environ": dict(os.environ), "sys.path": list(sys.path), "root logger": [repr(root.handlers), root.level],
            "warning filters": repr(warnings.filters), "files": sorted(os.listdir("."))}

changed, missing = {}, {}
for name in names:
    before = snapshot()
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional extra that is not installed
        missing[name] = str(exc)
        continue
    after = snapshot()
    diff = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
    if diff:
        if "environ" in diff:
            b, a = diff["environ"]
            diff["environ"] = sorted(set(a.items()) ^ set(b.items()))
        changed[name] = diff
print(json.dumps({"modules": len(names), "changed": changed, "missing": missing}, default=str))
"""


def _modules(package: str) -> list[str]:
    """Every module of ``package`` (found on disk, so that finding them imports nothing), parents first."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def _probe(names: list[str], tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(names)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_any_module_has_no_side_effects(tmp_path):
    result = _probe([m for p in PACKAGES for m in _modules(p)], tmp_path)
    assert result["modules"] > 50
    assert result["changed"] == {}


def test_importing_flower_sim_leaves_the_environment_alone(tmp_path):
    result = _probe(["simulations.flower_sim"], tmp_path)
    assert "simulations.flower_sim" not in result["missing"]
    assert result["changed"] == {}


def test_configure_environment_sets_only_unset_variables(monkeypatch):
    from simulations import flower_sim

    for name in {**flower_sim.SIM_ENV, **flower_sim.THREAD_ENV}:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_DEDUP_LOGS", "1")  # set by the user: kept
    flower_sim.configure_environment()
    assert os.environ["RAY_DEDUP_LOGS"] == "1"
    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0"
    for name, value in flower_sim.THREAD_ENV.items():
        assert os.environ[name] == value


def test_the_simulation_configures_its_environment_before_importing_ray():
    source = (ROOT / "simulations" / "flower_sim.py").read_text(encoding="utf-8")
    body = source[source.index("def run_flower_simulation("):]
    assert body.index("configure_environment()") < body.index("import ray")

