"""`python -m simulations.bench --only …` refreshes its sections of an existing report and keeps the others."""

from simulations.bench.__main__ import merge_sections


def test_only_replaces_its_sections_and_keeps_the_rest():
    old = "# haarvest benchmarks\n\nMachine: full run\n\n## A\n\na1\n\n## B\n\nb1\n\n## C\n\nc1\n"
    new = "# haarvest benchmarks\n\nMachine: partial run\n\n## B\n\nb2\n\n## D\n\nd2\n"
    merged = merge_sections(old, new)
    assert merged == ("# haarvest benchmarks\n\nMachine: full run\n\n## A\n\na1\n\n## B\n\nb2\n\n## C\n\nc1\n\n"
                      "## D\n\nd2\n")
    assert merge_sections(merged, new) == merged  # idempotent


def test_report_key_costs_are_measured_not_quoted():
    from simulations.bench._keys import ALGORITHMS, key_costs, key_costs_text

    costs = key_costs(reports=20)
    assert set(costs) == set(ALGORITHMS)
    assert all(sign > 0 and verify > 0 for sign, verify in costs.values())
    text = key_costs_text({"hmac-sha256": (3.0, 1.0), "ed25519": (50.0, 120.0)})
    assert "HMAC-SHA256 3 µs to encode and sign, 1 µs to verify" in text
    assert "Ed25519 50 µs to encode and sign, 120 µs to verify" in text
