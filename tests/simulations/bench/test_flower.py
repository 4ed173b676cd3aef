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


def test_capacity_text_from_the_large_rounds_and_the_open_rounds():
    from simulations.bench.flower import _capacity_text

    text = _capacity_text([1000.0, 800.0], [1250.0, 1430.0], 2, reattached=True)
    assert "(800–1,000 devices/s), a 60 s round holds about 48,000–60,000 devices whose databases are" in text
    assert "1,250–1,430 µs of CPU: 100,000 devices at that cost take at least 62.5–71.5 s per round on 2 cores" in text
    assert text.endswith("over the target even then.")
    cheapest = _capacity_text([900.0], [1100.0, 1300.0], 2, reattached=True)
    assert cheapest.endswith("within the target only at the cheapest.")
    assert _capacity_text([900.0], [1000.0, 1100.0], 2, reattached=True).endswith("— within the target.")
    assert _capacity_text([900.0], [], 2, reattached=False) == ("At the rates of this run's 100,000-device rounds "
                                                                 "(900–900 devices/s), a 60 s round holds about "
                                                                 "54,000–54,000 devices.")


def test_open_costs_takes_only_the_rounds_of_runs_without_reattachment():
    from types import SimpleNamespace

    from simulations.bench.flower import _open_costs

    def run(n, reattached, cpu, signature="hmac-sha256", phases=True):
        hosts = [{"reattached": r, "busy_seconds": {"round t=0": {"cpu": cpu / 2}},
                  "phase_seconds": {"round t=0": {"privatize": 0.1}} if phases else {}} for r in reattached]
        return SimpleNamespace(extra={"hosts": hosts, "tree_cpu": [cpu]}, summaries=[SimpleNamespace(cpu_ingest=0.0)])

    results = {(10, "hmac-sha256"): run(10, [0, 0], 0.02), (20, "hmac-sha256"): run(20, [0, 3], 0.04),
               (10, "ed25519"): run(10, [0, 0], 0.05), (30, "hmac-sha256"): run(30, [0, 0], 0.03, phases=False)}
    results[(40, "hmac-sha256")] = SimpleNamespace(extra={"hosts": []}, summaries=[])
    assert [round(c) for c in _open_costs(results)] == [2000]
