"""The Flower bench section's conclusion about the round target is computed from its measurements."""

from __future__ import annotations

from simulations.bench.flower import _floor_text

COST = {"reading+plan": 300.0, "privatize": 200.0, "sign": 130.0, "ledger mark": 80.0, "host rest": 250.0,
        "coordinator ingest": 130.0, "Flower/Ray + driver": 110.0}


def test_floor_text_says_what_the_budget_leaves_for_the_agent():
    text = _floor_text({"open/close": 300.0, "transaction": 400.0, "devices": 2000, "rounds": 3}, COST, 1200.0)
    assert "300 µs to reattach and close, 400 µs for the check and the transaction" in text
    assert "940 µs of the 1,200 µs a device round may cost are spent, leaving 260 µs" in text
    assert "960 µs in this round" in text  # the agent's phases and the hosts' rest, measured


def test_floor_text_when_nothing_is_left():
    text = _floor_text({"open/close": 600.0, "transaction": 600.0, "devices": 2000, "rounds": 3}, COST, 1200.0)
    assert "1,440 µs of the 1,200 µs a device round may cost are spent, before any of the agent's own work" in text
