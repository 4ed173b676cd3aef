"""The ``haarvest`` command: one entry point, subcommands contributed by each package.

Each package exposes ``register(subparsers)`` in its ``cli`` module; subcommands are imported lazily so a
device never imports coordinator code it does not need.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: (subcommand, module providing ``register``) — modules are imported only if present.
SUBCOMMAND_MODULES = [
    ("agent", "edge_agent.cli"),
    ("coordinator", "coordinator.cli"),
    ("simulate", "simulations.cli"),
    ("demo", "simulations.demo"),
    ("pki", "coordinator.pki"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haarvest", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for _name, module in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue
            raise
        mod.register(sub)
    return parser


def one_line(exc: BaseException) -> str:
    """An error as one line: a pydantic validation error as ``where: what`` of its first problem (and how many
    more), anything else as the first line of its message."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            found = errors()
        except Exception:  # noqa: BLE001 - not a pydantic error after all
            found = None
        if found:
            first = found[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            msg = str(first.get("msg", "")).removeprefix("Value error, ")
            return f"{where + ': ' if where else ''}{msg}{more}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
        sys.stdout.flush()  # the last buffered output: a reader gone by now is the same broken pipe, caught below
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `haarvest … | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ValueError as exc:  # bad input the command did not catch itself: one line, nothing changed
        print(f"haarvest {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
