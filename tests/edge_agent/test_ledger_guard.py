"""The ledger cannot be silently reset (edge_agent.ledger_guard): a missing, emptied, older, foreign or damaged
ledger is refused at start; an explicit reset is recorded; the coordinator flags a device's sequence regression."""

from __future__ import annotations

import json
import shutil

import pytest

from coordinator.store import SQLiteStore
from coordinator.validate import Validator
from edge_agent.agent import Agent
from edge_agent.embed import categorical, new_identity, simple_config
from edge_agent.ledger_guard import MARK_NAME, RESETS_NAME, LedgerIntegrityError, read_mark, reset_ledger
from edge_agent.sources import CallableSource
from haarvest.cli import main
from tests.edge_agent.test_cli import _write_config

IDENTITY = new_identity()


def _cfg(tmp_path, cap=6.0):
    return simple_config("dev-g", tmp_path / "state", [categorical("x", 3)],
                         [{"name": "x", "dimensions": ["x"], "mechanism": "grr", "epsilon": 1.0}], total_cap=cap)


def _agent(cfg):
    return Agent(cfg, CallableSource(lambda: {"x": 1}), secrets=IDENTITY, transport=False).open()


def _spend(cfg, rounds: int, start: int = 0) -> None:
    a = _agent(cfg)
    for t in range(start, start + rounds):
        a.report(f"r{t}")
    a.close()


def test_mark_follows_the_committed_ledger(tmp_path):
    cfg = _cfg(tmp_path)
    _spend(cfg, 3)
    mark = read_mark(cfg.state_dir)
    assert (mark["boot"], mark["next_seq"], mark["ledger_rows"], mark["spent_total"]) == (1, 3, 3, 3.0)
    _spend(cfg, 1, 3)  # reopening checks the ledger against the mark, and the mark moves on
    assert read_mark(cfg.state_dir)["next_seq"] == 4


@pytest.mark.parametrize("damage", ["delete", "truncate", "lose_wal", "restore_older", "other_ledger"])
def test_a_damaged_or_replaced_ledger_is_refused_not_restarted(tmp_path, damage):
    """Negative controls: each of these gave a full budget again before (cap 6: 12 spent in all)."""
    cfg = _cfg(tmp_path)
    db = cfg.database_path
    _spend(cfg, 2)
    older = tmp_path / "older"
    older.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if (p := db.with_name(db.name + suffix)).exists():
            shutil.copy(p, older / p.name)
    _spend(cfg, 4, 2)  # the cap (6) is reached
    a = _agent(cfg)
    assert a.report("r9").refused == [("x", "stream_cap")]  # stream cap = total cap here
    a.close()
    if damage == "delete":
        for suffix in ("", "-wal", "-shm"):
            db.with_name(db.name + suffix).unlink(missing_ok=True)
    elif damage == "truncate":
        db.write_bytes(b"")
        db.with_name(db.name + "-wal").unlink(missing_ok=True)
    elif damage == "lose_wal":
        a = _agent(cfg)  # this boot's commits sit in the WAL only (no checkpoint yet) ...
        a.state._db.execute("PRAGMA wal_autocheckpoint=0")
        a.report("r10")
        keep = db.read_bytes()
        a.close()
        db.write_bytes(keep)  # ... and the -wal file is lost
        db.with_name(db.name + "-wal").unlink(missing_ok=True)
        db.with_name(db.name + "-shm").unlink(missing_ok=True)
    elif damage == "restore_older":
        for p in older.iterdir():
            shutil.copy(p, db.with_name(p.name))
    else:
        for suffix in ("", "-wal", "-shm"):
            db.with_name(db.name + suffix).unlink(missing_ok=True)
        other = _cfg(tmp_path / "elsewhere")
        _spend(other, 1)
        a = _agent(other)
        a.close()
        shutil.copy(other.database_path, db)
    with pytest.raises(LedgerIntegrityError, match="reset-ledger") as err:
        _agent(cfg)
    assert "\n" not in str(err.value)


def test_a_hand_written_mark_and_an_emptied_ledger_are_refused(tmp_path, capsys):
    """Issue 37's silent cases on an enrolled device (cap 6, 6 spent): (a) database deleted and a "never used"
    mark written by hand — full budget again before; (b) an empty database and no mark — 12 released before."""
    cfg = _write_config(tmp_path)
    assert main(["agent", "enroll", "--config", str(cfg)]) == 0
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "2", "--log-level", "WARNING"]) == 0
    state = tmp_path / "state"
    mark_text = (state / MARK_NAME).read_text()
    assert '"mac"' in mark_text  # authenticated with the device's secret
    db = state / "agent.sqlite3"

    def wipe():
        for suffix in ("", "-wal", "-shm"):
            db.with_name(db.name + suffix).unlink(missing_ok=True)

    wipe()  # (a)
    (state / MARK_NAME).write_text(json.dumps({"ledger_id": None, "boot": 0, "next_seq": 0, "ledger_rows": 0,
                                               "spent_total": 0.0, "resets": 0}) + "\n")
    capsys.readouterr()
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 2
    assert "carries no authentication" in capsys.readouterr().err and not db.exists()
    forged = json.loads(mark_text)  # a mark with a MAC that does not verify: refused too
    forged.update(next_seq=0, spent_total=0.0, ledger_id=None, boot=0, ledger_rows=0)
    (state / MARK_NAME).write_text(json.dumps(forged) + "\n")
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 2
    assert "fails its authentication" in capsys.readouterr().err
    (state / MARK_NAME).unlink()  # (b): an empty database, no mark
    from edge_agent.state import State

    State(db).close()
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 2
    assert "its ledger mark is gone" in capsys.readouterr().err


def test_missing_ledger_with_an_enrolled_identity_is_refused_by_the_cli(tmp_path, capsys):
    cfg = _write_config(tmp_path)
    assert main(["agent", "enroll", "--config", str(cfg)]) == 0
    assert read_mark(tmp_path / "state") == {"ledger_id": None, "boot": 0, "next_seq": 0, "ledger_rows": 0,
                                             "spent_total": 0.0, "resets": 0}
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "2", "--log-level", "WARNING"]) == 0
    db = tmp_path / "state" / "agent.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the ledger database") and err.count("\n") == 1 and "Traceback" not in err
    assert not db.exists()  # nothing created by the refusal
    # the mark without identity files is refused too (an embedded agent whose database vanished)
    (tmp_path / "state" / "device.key").unlink()
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 2
    # a reset needs --yes, is recorded, and continues the sequence numbers
    assert main(["agent", "reset-ledger", "--config", str(cfg)]) == 2
    assert main(["agent", "enroll", "--config", str(cfg), "--force"]) == 0
    capsys.readouterr()
    assert main(["agent", "reset-ledger", "--config", str(cfg), "--yes", "--reason", "test"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["next_seq"] == 4 and record["reason"] == "test" and record["resets"] == 1
    assert main(["agent", "run", "--config", str(cfg), "--max-rounds", "1", "--log-level", "WARNING"]) == 0
    capsys.readouterr()
    assert main(["agent", "status", "--config", str(cfg)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["next_seq"] == 6 and status["ledger_resets"][0]["reason"] == "test"
    assert status["privacy_units"]["cpu"]["unit"] == "device"
    lines = (tmp_path / "state" / RESETS_NAME).read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["next_seq"] == 4


def test_reset_keeps_the_old_database_and_counts_in_the_mark(tmp_path):
    cfg = _cfg(tmp_path)
    _spend(cfg, 6)
    record = reset_ledger(cfg.database_path, reason="operator", now=1_800_000_000.0)
    assert record["old_spent_total"] == pytest.approx(6.0) and record["next_seq"] == 6
    kept = [p.name for p in cfg.state_dir.iterdir() if ".reset-" in p.name]
    assert kept and all(p.startswith("agent.sqlite3.reset-20270115") for p in kept)
    assert json.loads((cfg.state_dir / MARK_NAME).read_text())["resets"] == 1
    a = _agent(cfg)
    out = a.report("r0")
    assert out.commits[0].seq == 6 and a.state.status()["ledger_resets"][0]["reason"] == "operator"
    a.close()


def test_coordinator_flags_and_counts_a_devices_sequence_regression(tmp_path, capsys):
    from coordinator.rounds import RoundManager
    from protocols import wire

    key = wire.generate_signing_key()
    cfg = simple_config("dev-r", tmp_path / "s", [categorical("x", 3)],
                        [{"name": "x", "dimensions": ["x"], "mechanism": "grr", "epsilon": 1.0}],
                        coordinator_public_key=wire.public_key_b64(key), total_cap=100)
    store = SQLiteStore(tmp_path / "c.db")
    store.upsert_device(cfg.device_id, IDENTITY.public_key_b64)
    v = Validator(store)
    rounds = RoundManager(store, key, on_change=v.set_round)
    agent = _agent(cfg)
    payloads = []
    for rid in ("r1", "r2"):
        rc = rounds.open_round(rid, 1.0, {"streams": agent.stream_specs()})
        payloads.append(agent.handle_round(rc.to_bytes()).commits[0].payload)
    agent.close()
    store.commit_batch([v.check(wire.report_topic(cfg.device_id), p) for p in payloads], {})
    v.batch_committed()
    # the device's ledger is restored from a copy made before round 1: it re-uses seq 0 and 1
    for suffix in ("", "-wal", "-shm"):
        cfg.database_path.with_name(cfg.database_path.name + suffix).unlink(missing_ok=True)
    (cfg.state_dir / MARK_NAME).unlink()  # the whole state directory restored: the device cannot tell
    again = _agent(cfg)
    rc = rounds.open_round("r3", 1.0, {"streams": again.stream_specs()})
    regressed = again.handle_round(rc.to_bytes()).commits[0]
    again.close()
    assert regressed.seq == 0
    from coordinator.ingest import per_device_counters

    results = v.check_batch([(wire.report_topic(cfg.device_id), regressed.payload)])
    assert isinstance(results[0], wire.WireError) and results[0].reason == "seq_regression"
    store.commit_batch([], {"seq_regression": 1, **per_device_counters(results)})
    assert store.counters()[f"seq_regression.{cfg.device_id}"] == 1
    store.close()
    assert main(["coordinator", "devices", "--db", str(tmp_path / "c.db")]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing[0]["rejected"] == {"seq_regression": 1}
