"""The bench report's key costs (simulations/bench/_keys.py) are measured on this machine, not quoted."""


def test_report_key_costs_are_measured_not_quoted():
    from simulations.bench._keys import ALGORITHMS, key_costs, key_costs_text

    costs = key_costs(reports=20)
    assert set(costs) == set(ALGORITHMS)
    assert all(sign > 0 and verify > 0 for sign, verify in costs.values())
    text = key_costs_text({"hmac-sha256": (3.0, 1.0), "ed25519": (50.0, 120.0)})
    assert "HMAC-SHA256 3 µs to encode and sign, 1 µs to verify" in text
    assert "Ed25519 50 µs to encode and sign, 120 µs to verify" in text
