"""Fixtures of the Flower tests: device state on tmpfs when the machine has one (every report is an fsync'ed
SQLite commit; on a real disk a thousand simulated devices would spend minutes in fsync)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


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
