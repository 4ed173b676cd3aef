"""Shared test fixtures. Tests take explicit seeds; product code never does."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.brokers import mosquitto  # noqa: F401  (fixture)

#: Trials per side for audits in the regular test run; `make audit` raises it to 10^6.
AUDIT_TRIALS = int(os.environ.get("HAARVEST_AUDIT_TRIALS", "20000"))
EPSILONS = (0.5, 1.0, 2.0, 4.0)


#: A test's kind is a marker (``pytest -m audit``, ``-m "not integration"``): the directory it lives in says which.
KIND_BY_DIRECTORY = {"audit": "audit", "statistical": "statistical", "integration": "integration",
                     "deploy": "integration", "flower": "integration", "fault": "fault", "fuzz": "fuzz"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        kind = KIND_BY_DIRECTORY.get(parts[1]) if len(parts) > 2 and parts[0] == "tests" else None
        if kind is not None and item.get_closest_marker(kind) is None:
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture
def audit_trials() -> int:
    return AUDIT_TRIALS
