"""coordinator/prometheus.py: round series stay bounded however many rounds a fleet has run (issue 37, item 5)."""

from __future__ import annotations

from coordinator.prometheus import RECENT_ROUNDS, labelled_rounds


def _rounds(n: int, open_ids: set[int]) -> list[dict]:
    return [{"round_id": f"r{i}", "status": "open" if i in open_ids else "closed", "streams": ["cpu"]}
            for i in range(n)]


def test_only_open_and_recent_rounds_get_series():
    rounds = _rounds(10_000, {3, 9_999})
    kept = [r["round_id"] for r in labelled_rounds(rounds)]
    assert len(kept) == RECENT_ROUNDS + 1  # r3 is open and old; r9999 is open and recent
    assert kept[0] == "r3" and kept[-1] == "r9999" and kept[1] == f"r{10_000 - RECENT_ROUNDS}"
    assert [r["round_id"] for r in labelled_rounds(_rounds(5, set()))] == ["r0", "r1", "r2", "r3", "r4"]
    assert labelled_rounds(_rounds(5, {1}), recent=0) == [_rounds(5, {1})[1]]
