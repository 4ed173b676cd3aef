"""coordinator.service: the round-signing key file."""

from __future__ import annotations

import multiprocessing
import stat

from coordinator.service import load_or_create_key
from protocols import wire


def _public_key(path: str, out: multiprocessing.Queue) -> None:
    try:
        out.put(wire.public_key_b64(load_or_create_key(path)))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.put(f"error: {exc!r}")


def test_key_file_created_once_then_loaded(tmp_path):
    path = tmp_path / "keys" / "coordinator.key"
    first = load_or_create_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert wire.public_key_b64(load_or_create_key(path)) == wire.public_key_b64(first)
    assert [p.name for p in path.parent.iterdir()] == ["coordinator.key"]  # no temporary file left behind


def test_processes_starting_at_once_share_one_key(tmp_path):
    """Workers started together on one host with the same key file: one creates it, every one gets that key (before,
    the others failed with FileExistsError or read the file before it was written)."""
    ctx = multiprocessing.get_context("fork")  # started within milliseconds of each other
    for attempt in range(20):
        path = str(tmp_path / f"coordinator-{attempt}.key")
        out = ctx.Queue()
        procs = [ctx.Process(target=_public_key, args=(path, out)) for _ in range(4)]
        for p in procs:
            p.start()
        keys = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert len(set(keys)) == 1 and not keys[0].startswith("error"), keys
        assert wire.public_key_b64(load_or_create_key(path)) == keys[0]
