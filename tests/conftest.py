"""Shared test fixtures. Tests take explicit seeds; product code never does."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.brokers import mosquitto  # noqa: F401  (fixture)

#: Trials per side for audits in the regular test run; `make audit` raises it to 10^6.
AUDIT_TRIALS = int(os.environ.get("HAARVEST_AUDIT_TRIALS", "20000"))
EPSILONS = (0.5, 1.0, 2.0, 4.0)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture
def audit_trials() -> int:
    return AUDIT_TRIALS
