"""The edge-agent bench section's conclusion on the exact release (simulations/bench/agent.py), on fixed numbers."""

from __future__ import annotations

from simulations.bench.agent import release_conclusion, release_costs


def test_release_conclusion_is_computed_from_the_measurements():
    costs = [("HM", 2.0, 1.0), ("PM", 1.2, 0.7)]
    text = release_conclusion(costs, 1.0)  # +1 µs of a 1 ms round
    assert "+1.00 µs" in text and "+0.100 %" in text and "within" in text
    assert "over" in release_conclusion([("HM", 301.0, 1.0)], 2.0)  # +300 µs of a 2 ms round: 15 %


def test_release_costs_time_every_one_value_path():
    costs = release_costs(quick=True)
    assert [c[0] for c in costs] == ["HM", "PM", "Duchi"]
    assert all(exact > 0 and plain > 0 for _, exact, plain in costs)
