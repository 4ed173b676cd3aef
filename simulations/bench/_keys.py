"""Per-report cost of the two report-key algorithms (:mod:`protocols.wire`), measured when a bench section runs.

Not a section of its own (the leading underscore): the sections that describe Ed25519 and HMAC-SHA256 report keys
quote these measurements instead of frozen figures.
"""

from __future__ import annotations

import time

from protocols import wire
from protocols.contract import make_body

__all__ = ["ALGORITHMS", "key_costs", "key_costs_text"]

ALGORITHMS = {"hmac-sha256": "HMAC-SHA256", "ed25519": "Ed25519"}


def key_costs(reports: int = 1000) -> dict[str, tuple[float, float]]:
    """``{algorithm: (µs to sign, µs to verify)}`` per report: the median over 5 passes of ``reports`` typical
    reports (a 16-value body), signed as a device does (:func:`protocols.wire.signed_report_bytes`) and verified as
    the coordinator does (:func:`protocols.wire.verify_report` over the received payload)."""
    out: dict[str, tuple[float, float]] = {}
    for algorithm in ALGORITHMS:
        key = wire.generate_device_key(algorithm)
        verify_key = wire.load_registry_key(wire.registry_key(key))
        topic = wire.report_topic("dev-0")
        reps = [wire.Report(device_id="dev-0", boot=1, seq=i + 1, round_id="r1", stream="age", mechanism="hm",
                            body=make_body([0.5 * (i % 7)] * 16)) for i in range(reports)]
        sign, verify = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            payloads = [wire.signed_report_bytes(r, topic, key) for r in reps]
            t1 = time.perf_counter()
            decoded = [wire.decode_report(p) for p in payloads]
            t2 = time.perf_counter()
            for r, p in zip(decoded, payloads):
                wire.verify_report(r, topic, verify_key, p)
            t3 = time.perf_counter()
            sign.append((t1 - t0) / reports)
            verify.append((t3 - t2) / reports)
        out[algorithm] = (1e6 * sorted(sign)[2], 1e6 * sorted(verify)[2])
    return out


def key_costs_text(costs: dict[str, tuple[float, float]]) -> str:
    """One sentence quoting :func:`key_costs`."""
    parts = [f"{ALGORITHMS[a]} {s:.0f} µs to encode and sign, {v:.0f} µs to verify" for a, (s, v) in costs.items()]
    return "Report keys, measured in this run per report (a device signs, the coordinator verifies): " \
        + "; ".join(parts) + "."
