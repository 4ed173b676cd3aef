"""The ``peers`` bench section's prose is computed from its measurements (fake tables change the text)."""

from __future__ import annotations

import pytest

from simulations.bench.peers import _table, conclusions, ratio, verdict


def _row(what: str, ours: list[float], theirs: list[float], t_ours: float = 0.001, t_theirs: float = 0.1) -> dict:
    return {"what": what, "peer": "peer", "metric": "MSE", "ours": ours, "theirs": theirs,
            "t_ours": [t_ours] * len(ours), "t_theirs": [t_theirs] * len(theirs)}


def _pem(default_top3: int, pem_top3: int, never: int = 0) -> dict:
    base = {"never_held": never, "mean_items": 3.0, "time": [0.01], "runs": 20}
    return {"haarvest default (β = 10⁻³)": {**base, "top3": default_top3},
            "pure-ldp PEM top-3": {**base, "top3": pem_top3, "never_held": 0}}


def test_ratio_and_verdict():
    r, se = ratio([2.0, 2.2, 1.8], [1.0, 1.1, 0.9])
    assert r == pytest.approx(2.0) and se > 0
    assert verdict(2.0, 0.1) == "above" and verdict(0.5, 0.1) == "below" and verdict(1.1, 0.1) == "within noise of"


def test_conclusions_follow_the_numbers():
    rows = [_row("A", [1.0, 1.01, 0.99], [2.0, 2.02, 1.98]), _row("B", [1.0, 1.5, 0.5], [1.0, 1.4, 0.6])]
    _table(rows)
    text = "\n".join(conclusions(rows, _pem(20, 20)))
    assert "below the peer's" in text and "A vs peer (0.50)" in text and "within noise" in text
    assert "100× to 100× faster" in text and "20/20" in text and "matches it" in text
    worse = [_row("A", [3.0, 3.01, 2.99], [1.0, 1.01, 0.99], t_ours=1.0, t_theirs=0.5)]
    _table(worse)
    text = "\n".join(conclusions(worse, _pem(12, 19, never=1)))
    assert "above the peer's" in text and "below 1: slower" in text
    assert "12/20" in text and "falls short of it" in text and "nobody holds in 1 runs" in text
    assert "beats it" in "\n".join(conclusions(worse, _pem(20, 15)))
