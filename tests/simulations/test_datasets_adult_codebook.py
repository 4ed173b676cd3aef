"""The Adult codebook (data/adult/codebook.json) against the data it decodes: each categorical code's count is UCI's
published count of the category it names, and the inferred bins reproduce the published means."""

from __future__ import annotations

import numpy as np
import pytest

from simulations.datasets import adult_codebook, bin_midpoints, load_adult


@pytest.fixture(scope="module")
def data():
    return load_adult().data


@pytest.mark.parametrize("name", ["education_num", "sex", "native_country", "income"])
def test_every_code_has_the_published_count_of_the_category_it_names(data, name):
    col = adult_codebook()[name]
    counts = np.bincount(data[:, col["column"]], minlength=len(col["labels"]))
    assert len(col["labels"]) == len(col["uci_counts"]) == counts.size
    assert counts.tolist() == col["uci_counts"]


@pytest.mark.parametrize("name, published_mean", [("age", 38.548), ("hours_per_week", 40.938)])
def test_bins_cover_the_range_without_gaps_and_reproduce_the_published_mean(data, name, published_mean):
    col = adult_codebook()[name]
    bins = col["bins"]
    assert len(bins) == 16 and all(lo <= hi for lo, hi in bins)
    assert all(b[0] == a[1] + 1 for a, b in zip(bins, bins[1:]))  # contiguous integer ranges
    mean = bin_midpoints(col)[data[:, col["column"]]].mean()
    assert mean == pytest.approx(published_mean, abs=0.05)
