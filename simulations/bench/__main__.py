"""Run every benchmark section and print the combined Markdown report (also written to docs/generated/bench.md).

With ``--only``, an existing report keeps its other sections: each section run replaces the section of the same
``## `` heading (or is appended), so ``make bench BENCH_ARGS="--only ingest"`` refreshes one table in place."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import platform
import re
import sys
import time
from pathlib import Path

import simulations.bench as bench_pkg
from simulations import GENERATED_DOCS

DEFAULT_OUT = GENERATED_DOCS / "bench.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--only", nargs="*", help="section module names to run")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    parts = [
        "# haarvest benchmarks",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}. Regenerate with `make bench`.",
        "",
    ]
    for info in sorted(pkgutil.iter_modules(bench_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or (args.only and info.name not in args.only):
            continue
        module = importlib.import_module(f"simulations.bench.{info.name}")
        if not hasattr(module, "run"):
            continue
        print(f"[bench] {info.name} ...", file=sys.stderr, flush=True)
        section = module.run(quick=args.quick)
        print(section, flush=True)
        parts.append(section)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(parts) + "\n"
    if args.only and out.exists():
        text = merge_sections(out.read_text(), text)
    out.write_text(text)
    return 0


def _split(text: str) -> tuple[str, list[str]]:
    """(preamble, sections): a section runs from its ``## `` heading to the next one."""
    head, *sections = re.split(r"(?m)^(?=## )", text)
    return head, sections


def merge_sections(old: str, new: str) -> str:
    """``old`` with every section of ``new`` in place of the one with the same heading (unknown ones appended); the
    preamble stays ``old``'s (it dates the full run)."""
    _, fresh = _split(new)
    head, kept = _split(old)
    by_title = {s.split("\n", 1)[0]: s for s in fresh}
    merged = [by_title.pop(s.split("\n", 1)[0], s) for s in kept] + list(by_title.values())
    return head + "".join(s if s.endswith("\n\n") else s.rstrip("\n") + "\n\n" for s in merged).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.exit(main())
