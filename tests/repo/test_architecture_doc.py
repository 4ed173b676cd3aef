"""docs/architecture.md is drawn from the code: each package's section names every module of that package, and
every module it names exists there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("protocols", "edge_agent", "coordinator", "simulations", "haarvest")


def _section(package: str) -> str:
    match = re.search(rf"^## {package}/.*?(?=^## |\Z)", DOC, re.S | re.M)
    assert match, f"docs/architecture.md has no '## {package}/' section"
    return match.group(0)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_described(package):
    section = _section(package)
    named = set(re.findall(r"([A-Za-z_]\w*\.py)", section))
    modules = {p.name for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - named) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_described_module_exists(package):
    section = _section(package)
    named = set(re.findall(r"([A-Za-z_]\w*\.py)", section))
    modules = {p.name for p in (ROOT / package).rglob("*.py")}
    assert sorted(named - modules) == []
