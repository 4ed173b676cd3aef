"""`python -m simulations.bench --only …` refreshes its sections of an existing report and keeps the others."""

from simulations.bench.__main__ import merge_sections


def test_only_replaces_its_sections_and_keeps_the_rest():
    old = "# haarvest benchmarks\n\nMachine: full run\n\n## A\n\na1\n\n## B\n\nb1\n\n## C\n\nc1\n"
    new = "# haarvest benchmarks\n\nMachine: partial run\n\n## B\n\nb2\n\n## D\n\nd2\n"
    merged = merge_sections(old, new)
    assert merged == ("# haarvest benchmarks\n\nMachine: full run\n\n## A\n\na1\n\n## B\n\nb2\n\n## C\n\nc1\n\n"
                      "## D\n\nd2\n")
    assert merge_sections(merged, new) == merged  # idempotent
