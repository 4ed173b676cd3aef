"""Run every benchmark section and print the combined Markdown report (also written to docs/bench.md)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import platform
import sys
import time
from pathlib import Path

import simulations.bench as bench_pkg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--only", nargs="*", help="section module names to run")
    parser.add_argument("--out", default="docs/bench.md")
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
