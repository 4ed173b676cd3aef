"""The dashboard's and the demo report's SVG charts (coordinator.api): an interval at every point, round ticks,
axis labels with units, a legend."""

from __future__ import annotations

import re

import pytest

from coordinator.api import nice_ticks, stream_charts, svg_band_chart, svg_bar_chart


@pytest.mark.parametrize("lo, hi", [(0.191, 0.402), (-18.47, 68.2), (37.1, 37.1), (1e-4, 3.5e-4), (3000, 26000),
                                    (0.0, 1.236), (-0.07, 0.41)])
def test_ticks_are_round_cover_the_data_and_print_exactly(lo, hi):
    ticks, decimals = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 9
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** __import__("math").floor(__import__("math").log10(step))
    assert min(abs(mantissa - m) for m in (1, 2, 2.5, 5, 10)) < 1e-9
    assert len({f"{t:.{decimals}f}" for t in ticks}) == len(ticks)  # no two ticks print alike
    assert all(float(f"{t:.{decimals}f}") == pytest.approx(t) for t in ticks)  # and they print exactly


def test_a_single_round_chart_draws_its_interval_and_the_truth():
    svg = svg_band_chart("load", ["r1"], [29.5], [20.2], [38.9], [30.1], ylabel="mean load (%)")
    assert len(re.findall(r'<line class="ci"', svg)) == 1 and len(re.findall(r'class="ci-cap"', svg)) == 2
    assert 'class="truth"' in svg and "mean load (%)" in svg
    assert all(t in svg for t in ("estimate", "95% interval", "true value"))
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', svg)
    assert ticks and all(re.fullmatch(r"-?[0-9,]+", t) for t in ticks)  # 20, 25, 30 … not 20.19


def test_every_point_of_a_series_has_an_interval_and_frequency_ticks_are_percent():
    svg = svg_band_chart("t", ["r1", "r2", "r3"], [1.0, 2.0, 3.0], [0.5, 1.5, 2.5], [1.5, 2.5, 3.5])
    assert len(re.findall(r'<line class="ci"', svg)) == 3 and 'class="band"' in svg
    bars = svg_bar_chart("mode", ["a", "b"], [0.6, 0.4], [0.5, 0.3], [0.7, 0.5], [0.55, 0.45])
    assert len(re.findall(r'<line class="ci"', bars)) == 2 and "true share" in bars
    assert all(t.endswith("%") for t in re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', bars))


def test_stream_charts_label_numeric_axes_with_the_streams_units():
    est = {"load": {"kind": "numeric", "labels": ["load"], "units": ["%"], "estimate": [30.0], "ci_low": [25.0],
                    "ci_high": [35.0], "level": 0.9, "n": 100, "mechanism": "hybrid", "error": None}}
    (svg,) = stream_charts([("r1", est)])
    assert "mean load (%)" in svg and "90% interval" in svg
