"""Shared test fixtures. Tests take explicit seeds; product code never does.

A test's kind (audit, statistical, integration, fault, fuzz, slow) is a marker its file sets (``pytestmark``), so
``pytest -m audit`` or ``-m "not integration"`` select by kind wherever the file lives (tests/README.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.brokers import mosquitto  # noqa: F401  (fixture)

#: Trials per side for audits in the regular test run; `make audit` raises it to 10^6.
AUDIT_TRIALS = int(os.environ.get("HAARVEST_AUDIT_TRIALS", "20000"))
EPSILONS = (0.5, 1.0, 2.0, 4.0)


@pytest.fixture(scope="module")
def postgres_server():
    """A throwaway PostgreSQL server (:class:`simulations.postgres.ThrowawayPostgres`) for a test module; the test
    skips only when psycopg or the server binaries are missing (CI installs them)."""
    pytest.importorskip("psycopg")
    from protocols.errors import MissingPostgres
    from simulations.postgres import ThrowawayPostgres

    try:
        server = ThrowawayPostgres().start()
    except MissingPostgres as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres_dsn(postgres_server):
    """The DSN of the module's PostgreSQL server (its ``postgres`` database)."""
    return postgres_server.dsn()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture
def audit_trials() -> int:
    return AUDIT_TRIALS


# Device state on tmpfs when the machine has one, for the Flower tests (every report is an fsync'ed SQLite commit;
# on a real disk a thousand simulated devices would spend minutes in fsync).


def _tmpfs_dir(prefix: str) -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@pytest.fixture
def fast_path():
    path = _tmpfs_dir("haarvest-flower-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def fast_module_path():
    path = _tmpfs_dir("haarvest-flower-mod-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
