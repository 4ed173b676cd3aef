"""Durable state: atomic report transactions, caps, outbox bounds, append-only ledger, invariants."""

from __future__ import annotations

import sqlite3

import pytest

from edge_agent.agent import Agent
from edge_agent.embed import new_identity, numeric
from edge_agent.sources import CallableSource
from edge_agent.state import HOSTED_PAGE_SIZE, SCHEMA_VERSION, Refused, ReportRequest, State
from tests.edge_agent.signed_rounds import HYBRID_LOAD, round_config


def _req(stream="s", key="k", eps=1.0, cap=10.0, round_id="r", round_cap=None, body=None, payload_exc=None):
    def make_payload(seq, b):
        if payload_exc:
            raise payload_exc
        return "t/x", f'{{"seq":{seq}}}'.encode()

    return ReportRequest(stream=stream, round_id=round_id, memo_key=key, spec="{}", mechanism="m", epsilon=eps,
                         stream_cap=cap, round_cap=round_cap, make_body=lambda: body or {"report": 107},
                         make_payload=make_payload)


def _commit(st, reqs, total=100.0, period=None, max_pending=1000, now=None):
    return st.commit_reports(reqs, total_cap=total, renewal_period_s=period, max_pending=max_pending, now=now)


def test_boot_counter_and_integrity(tmp_path):
    with State(tmp_path / "a.db") as st:
        assert st.begin_boot() == 1 and st.integrity_check() == ["ok"]
        assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with State(tmp_path / "a.db") as st:
        assert st.begin_boot() == 2


def test_memo_hit_and_charge(tmp_path):
    with State(tmp_path / "a.db") as st:
        (c1,) = _commit(st, [_req(key="a", body={"report": 7})])
        (c2,) = _commit(st, [_req(key="a", body={"report": 99})])
        assert (c1.seq, c1.charged, c1.memo_hit) == (0, 1.0, False)
        assert (c2.seq, c2.charged, c2.memo_hit, c2.body) == (1, 0.0, True, {"report": 7})
        assert st.spent() == 1.0 and st.pending_count() == 2
        assert st.check_invariants()["ok"]


def test_caps_refuse_and_write_nothing(tmp_path):
    with State(tmp_path / "a.db") as st:
        res = _commit(st, [_req(key=str(i), cap=2.5) for i in range(4)])
        assert [type(r).__name__ for r in res] == ["Commit", "Commit", "Refused", "Refused"]
        assert res[2].reason == "stream_cap"
        assert st.spent() == 2.0 and st.next_seq == 2 and st.pending_count() == 2
        (r,) = _commit(st, [_req(stream="other", key="z", cap=5)], total=2.5)
        assert isinstance(r, Refused) and r.reason == "total_cap"
        (hit,) = _commit(st, [_req(key="0", cap=2.5)])  # a memo hit costs nothing: still allowed
        assert hit.memo_hit and hit.charged == 0
        assert st.counters()["refused_stream_cap"] == 2 and st.counters()["refused_total_cap"] == 1
        (r,) = _commit(st, [_req(key="9", cap=2.5)], total=100, max_pending=10)
        assert isinstance(r, Refused) and r.reason == "stream_cap"
        assert st.check_invariants()["ok"]


def test_round_budget(tmp_path):
    with State(tmp_path / "a.db") as st:
        res = _commit(st, [_req(stream=s, key=s, round_cap=2.0) for s in "abc"])
        assert [getattr(r, "reason", None) for r in res] == [None, None, "round_budget"]
        (ok,) = _commit(st, [_req(stream="c", key="c", round_id="next", round_cap=2.0)])
        assert ok.charged == 1.0


def test_renewal_period_is_a_sliding_window(tmp_path):
    with State(tmp_path / "a.db") as st:
        assert all(not isinstance(r, Refused) for r in _commit(st, [_req(key="a"), _req(key="b")], total=2, period=100, now=1000))
        (r,) = _commit(st, [_req(key="c")], total=2, period=100, now=1050)
        assert isinstance(r, Refused) and r.reason == "total_cap"
        (ok,) = _commit(st, [_req(key="d")], total=2, period=100, now=1101)
        assert ok.charged == 1.0
        # a clock stepped back cannot reopen budget: ledger timestamps never decrease
        (r2,) = _commit(st, [_req(key="e")], total=2, period=100, now=500)
        assert isinstance(r2, Refused) and r2.reason == "total_cap"
        ts = [row["ts"] for row in st.ledger_rows()]
        assert ts == sorted(ts)


def test_the_window_is_closed_a_charge_exactly_p_old_still_counts(tmp_path):
    """Issue 37: reports at t = 0 and t = P were both charged, so the closed interval [0, P] held twice the cap."""
    with State(tmp_path / "a.db") as st:
        (a,) = _commit(st, [_req(key="a")], total=1, period=100, now=1000)
        assert a.charged == 1.0
        (r,) = _commit(st, [_req(key="b")], total=1, period=100, now=1100)  # exactly P later: still in the window
        assert isinstance(r, Refused) and r.reason == "total_cap"
        (ok,) = _commit(st, [_req(key="c")], total=1, period=100, now=1100.001)
        assert ok.charged == 1.0
        assert st.spent(since=1000) == 2.0 and st.spent(since=1000.0005) == 1.0  # since: at or after


def test_outbox_full_refuses_without_charging(tmp_path):
    with State(tmp_path / "a.db") as st:
        res = _commit(st, [_req(key=str(i)) for i in range(3)], max_pending=2)
        assert getattr(res[2], "reason", None) == "outbox_full"
        assert st.spent() == 2.0
        st.mark_sent([0])
        (ok,) = _commit(st, [_req(key="x")], max_pending=2)
        assert ok.seq == 2


def test_failures_roll_back_everything(tmp_path):
    with State(tmp_path / "a.db") as st:
        (r,) = _commit(st, [_req(key="a", payload_exc=Refused("too_large"))])
        assert isinstance(r, Refused) and st.spent() == 0 and st.next_seq == 0

        def boom():
            raise RuntimeError("mechanism bug")

        bad = ReportRequest(stream="s", round_id="r", memo_key="b", spec="{}", mechanism="m", epsilon=1, stream_cap=9,
                            make_body=boom, make_payload=lambda s, b: ("t", b"x"))
        with pytest.raises(RuntimeError):
            _commit(st, [_req(key="ok"), bad])
        assert st.spent() == 0 and st.next_seq == 0 and st.pending_count() == 0  # the whole batch rolled back


def test_ledger_is_append_only(tmp_path):
    with State(tmp_path / "a.db") as st:
        _commit(st, [_req()])
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            st._db.execute("UPDATE ledger SET epsilon = 0.1")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            st._db.execute("DELETE FROM ledger")


def test_outbox_order_ack_and_compaction(tmp_path):
    with State(tmp_path / "a.db") as st:
        _commit(st, [_req(key=str(i)) for i in range(6)])
        assert [r.seq for r in st.pending(limit=3)] == [0, 1, 2]
        assert [r.seq for r in st.pending(after_seq=2)] == [3, 4, 5]
        assert st.mark_sent([0, 1, 2]) == 3 and st.mark_sent([0]) == 0
        st.mark_sent([3], status="rejected")
        assert [r.seq for r in st.pending()] == [4, 5]
        assert st.compact(keep_sent=1) == 3
        tot = st.outbox_totals()
        assert tot["compacted"] == {"count": 3, "epsilon": 3.0}
        assert st.check_invariants()["ok"] and st.integrity_check() == ["ok"]
        with pytest.raises(ValueError):
            st.mark_sent([4], status="lost")


def test_rounds_and_rounding_tables(tmp_path):
    with State(tmp_path / "a.db") as st:
        assert st.round_seen("r1") is None
        st.record_round("r1", "answered")
        assert st.round_seen("r1") == "answered"
        st.save_rounding({"cpu": {"u": [0.25]}})
        assert st.load_rounding() == {"cpu": {"u": [0.25]}}
        st.bump({"x": 2})
        st.bump({"x": 1})
        assert st.counters()["x"] == 3
        s = st.status()
        assert s["rounds"] == {"answered": 1} and s["boot"] == 0


def test_one_batch_with_a_repeated_memo_key_charges_once(tmp_path):
    with State(tmp_path / "a.db") as st:
        c1, c2 = _commit(st, [_req(key="a", body={"report": 7}), _req(key="a", body={"report": 99})])
        assert (c1.charged, c1.memo_hit, c2.charged, c2.memo_hit, c2.body) == (1.0, False, 0.0, True, {"report": 7})
        assert st._db.execute("SELECT hits FROM memo WHERE key = 'a'").fetchone()[0] == 1
        assert st.spent() == 1.0 and st.next_seq == 2 and st.check_invariants()["ok"]


def test_round_record_rounding_counters_and_sent_marks_commit_with_the_reports(tmp_path):
    with State(tmp_path / "a.db") as st:
        (c0,) = _commit(st, [_req(key="a")])
        assert st.backlog == 0
        (c1,) = st.commit_reports([_req(key="b")], total_cap=100.0, renewal_period_s=None, max_pending=10,
                                  round_record=("r2", "answered", ""), rounding={"cpu": {"u": [0.5]}},
                                  counters={"clipped.cpu": 2}, sent=[c0.seq])
        assert st.backlog == 0  # c0 was marked sent in the same transaction
        assert st.round_seen("r2") == "answered" and st.load_rounding() == {"cpu": {"u": [0.5]}}
        assert st.counters()["clipped.cpu"] == 2 and st.pending_count() == 1 and st.next_seq == 2
        (c2,) = _commit(st, [_req(key="c")])
        assert st.backlog == 1  # c1 is still pending
        # a failing batch (an exception that is not a refusal) leaves none of it: no round record, no mark, no row
        def boom():
            raise RuntimeError("privatize failed")

        bad = ReportRequest(stream="s", round_id="r3", memo_key="d", spec="{}", mechanism="m", epsilon=1.0,
                            stream_cap=10.0, make_body=boom, make_payload=lambda seq, b: ("t/x", b"{}"))
        with pytest.raises(RuntimeError):
            st.commit_reports([bad], total_cap=100.0, renewal_period_s=None, max_pending=10,
                              round_record=("r3", "answered", ""), sent=[c1.seq, c2.seq])
        assert st.round_seen("r3") is None and st.pending_count() == 2 and st.next_seq == 3
        assert st.check_invariants()["ok"]


# The ledger records δ only for (ε, δ) mechanisms


def test_pure_mechanisms_leave_delta_null(tmp_path):
    a = Agent(round_config(tmp_path, [numeric("load", 0, 100)], HYBRID_LOAD), CallableSource(lambda: {"load": 5.0}),
              secrets=new_identity(), transport=False).open()
    a.report("r1")
    assert [r["delta"] for r in a.state.ledger_rows()] == [None] and a.state.spent_delta() == 0.0
    a.close()


# An older state database is migrated in place


def test_version_1_state_database_is_migrated_in_place(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL);
        CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, stream TEXT NOT NULL,
            round_id TEXT NOT NULL, epsilon REAL NOT NULL CHECK (epsilon > 0), memo_key TEXT NOT NULL,
            seq INTEGER NOT NULL, mechanism TEXT NOT NULL);
        CREATE TRIGGER ledger_append_only_u BEFORE UPDATE ON ledger
            BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END;
        INSERT INTO meta VALUES ('schema_version', 1);
        INSERT INTO ledger (ts, stream, round_id, epsilon, memo_key, seq, mechanism) VALUES (1, 's', 'r', 0.5, 'k', 0, 'grr');
    """)
    db.commit()
    db.close()
    with State(path) as st:
        assert [r["delta"] for r in st.ledger_rows()] == [None] and st.spent() == 0.5
        # every charge before privacy units was a per-value memo charge
        assert [r["unit"] for r in st.ledger_rows()] == ["value"] and st.spent_by_unit() == {"value": 0.5}
        assert int(st._get("schema_version")) == SCHEMA_VERSION == 4
    with State(path) as st:  # idempotent
        assert len(list(st.ledger_rows())) == 1


def test_version_3_database_drops_the_unused_ledger_indexes_and_keeps_its_rows(tmp_path):
    path = tmp_path / "v3.db"
    with State(path) as st:
        req = ReportRequest(stream="s", round_id="r", memo_key="k", spec="{}", mechanism="grr", epsilon=0.5,
                            stream_cap=10.0, make_body=lambda: {"report": 1}, make_payload=lambda seq, b: ("t/x", b"{}"))
        st.commit_reports([req], total_cap=10.0, renewal_period_s=None, max_pending=10)
        st._db.executescript("CREATE INDEX ledger_stream_ts ON ledger (stream, ts);"
                             "CREATE INDEX ledger_round ON ledger (round_id);"
                             "UPDATE meta SET value = 3 WHERE key = 'schema_version';")
    with State(path) as st:
        indexes = {r[0] for r in st._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert indexes.isdisjoint({"ledger_stream_ts", "ledger_round"}) and "outbox_status_seq" in indexes
        assert int(st._get("schema_version")) == SCHEMA_VERSION and st.spent() == 0.5
        assert [r["memo_key"] for r in st.ledger_rows()] == ["k"]


def test_the_device_ledger_and_the_accountant_agree(tmp_path):
    """One ledger: the same charges through the device's State and protocols.accounting.Accountant — memo hits
    free, stream, total and δ caps — are admitted or refused alike, with the same reasons and the same totals."""
    from protocols.accounting import Accountant, BudgetExceededError

    caps, total, delta_cap = {"a": 2.5, "b": 10.0}, 4.0, 2e-5
    charges = [("a", "k1", 1.0, 0.0), ("a", "k1", 1.0, 0.0), ("a", "k2", 1.0, 0.0),
               ("a", "k3", 1.0, 0.0),  # stream cap
               ("b", "g1", 0.5, 1e-5), ("b", "g2", 0.5, 1e-5),
               ("b", "g3", 0.5, 1e-5),  # δ cap
               ("b", "k1", 1.0, 0.0), ("b", "k5", 0.5, 0.0),  # total cap
               ("a", "k1", 1.0, 0.0)]  # a memo hit is free whatever is spent
    acc = Accountant(total_cap=total, delta_cap=delta_cap)
    for stream, cap in caps.items():
        acc.set_cap(stream, cap)
    device, accountant = [], []
    with State(tmp_path / "s.db") as st:
        for stream, key, eps, delta in charges:
            req = ReportRequest(stream=stream, round_id="r", memo_key=f"{stream}/{key}", spec="{}", mechanism="m",
                                epsilon=eps, stream_cap=caps[stream], make_body=lambda: {"report": 107},
                                make_payload=lambda seq, body: ("t/x", b"{}"), delta=delta)
            (r,) = st.commit_reports([req], total_cap=total, renewal_period_s=None, max_pending=100,
                                     delta_cap=delta_cap)
            device.append(r.reason if isinstance(r, Refused) else ("hit" if r.memo_hit else r.charged))
            try:
                charged = acc.charge_memo(stream, f"{stream}/{key}", eps, "m", delta)
                accountant.append(eps if charged else "hit")
            except BudgetExceededError as exc:
                accountant.append(exc.reason)
        assert device == accountant == [1.0, "hit", 1.0, "stream_cap", 0.5, 0.5, "delta_cap", 1.0, "total_cap", "hit"]
        assert (st.spent(), st.spent_delta()) == pytest.approx(acc.basic())
        assert st.spent_by_stream() == pytest.approx({s: acc.basic(s)[0] for s in caps})


def test_hosted_database_keeps_wal_and_full_sync_without_a_shared_memory_file(tmp_path):
    path = tmp_path / "h" / "agent.sqlite3"
    st = State(path, hosted=True)
    try:
        assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert st._db.execute("PRAGMA locking_mode").fetchone()[0] == "exclusive"
        assert st._db.execute("PRAGMA page_size").fetchone()[0] == HOSTED_PAGE_SIZE  # created hosted
        (c,) = _commit(st, [_req(key="a")])
        assert c.charged == 1.0 and st.ledger_max == 1
        assert not path.with_name(path.name + "-shm").exists()  # the WAL index lives in this process's memory
    finally:
        st.close()
    st = State(path, hosted=True, reattach=True)  # a suspended agent's database: no directory or schema checks
    try:
        assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        (c,) = _commit(st, [_req(key="b")])
        assert st.ledger_max == 2 and st.ledger_rows_max() == 2
        (c,) = _commit(st, [_req(key="b")])  # a memo hit writes no ledger row
        assert c.memo_hit and st.ledger_max is None
    finally:
        st.close()
    st = State(path, hosted=True, reattach=True, transient=True)  # one device round, closed right after it
    try:
        assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: the round's commit is as durable
        (c,) = _commit(st, [_req(key="c")])
        assert c.charged == 1.0 and st.ledger_max == 3
        assert st._db.execute("PRAGMA locking_mode").fetchone()[0] == "exclusive"
        assert not path.with_name(path.name + "-shm").exists()
    finally:
        st.close()
    assert not path.with_name(path.name + "-wal").exists()  # closing checkpointed the WAL into the database
    with State(path) as st:  # closed: any process may open it again, everything committed is there
        assert st.spent() == 3.0 and st.check_invariants()["ok"]
        assert st._db.execute("PRAGMA page_size").fetchone()[0] == HOSTED_PAGE_SIZE  # a database keeps its pages
