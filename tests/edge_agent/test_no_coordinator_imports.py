"""The device never imports the coordinator: what both sides share lives in :mod:`protocols` (the round contract is
:mod:`protocols.contract`). Checked in a fresh interpreter after importing every edge_agent module."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import edge_agent

OPTIONAL = {"flwr"}  # the Flower ClientApp needs the optional extra


def test_no_edge_agent_module_imports_the_coordinator():
    names = [f"edge_agent.{m.name}" for m in pkgutil.iter_modules([str(Path(edge_agent.__file__).parent)])]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        f"        if exc.name not in {sorted(OPTIONAL)!r}: raise\n"
        "bad = sorted(m for m in sys.modules if m == 'coordinator' or m.startswith('coordinator.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"edge_agent imports {out.stdout.strip()}"
