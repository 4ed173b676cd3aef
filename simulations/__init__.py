"""haarvest.simulations"""

from pathlib import PurePosixPath

#: Where the generators write their reports (``make eval``: results.md and img/; ``make bench``: bench.md), relative
#: to the repository root: apart from the hand-written docs in docs/, which no generator writes.
GENERATED_DOCS = PurePosixPath("docs", "generated")
