"""`make bench`: speed and memory, side by side with the peer libraries, in one run.

Each module in this package that defines ``run(quick: bool) -> str`` contributes one section (Markdown text) to
the report printed by ``python -m simulations.bench`` and written to ``docs/generated/bench.md``. Timings are measurements,
never test assertions.
"""
