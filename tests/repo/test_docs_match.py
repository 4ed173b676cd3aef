"""The documentation quotes commands that exist: every `haarvest …` command line in README.md, docs/ and
deploy/ (code blocks and inline code) parses with the real CLI parser — its subcommands and options exist and take
the values shown — and every `make` target quoted is a target of the Makefile. Quoted outputs are checked where
they are produced (the demo's in tests/system/test_demo.py, /healthz in tests/coordinator/test_api.py)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from haarvest.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "generated"  # the reports `make eval` and `make bench` write (simulations.GENERATED_DOCS)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(GENERATED.glob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.md")), ROOT / "data" / "adult" / "README.md"]
COMMAND = re.compile(r"^(?:sudo -u \S+ |sudo )?(?:\S*/)?(?:\$HAARVEST|haarvest)(?= |$)")
SYNOPSIS_ONLY = ("required", "expected one argument")  # "…" / "..." in a synopsis stands for what is left out


def _code(text: str) -> list[tuple[str, bool]]:
    """(line, inline?) of every code block line and inline code span; an inline span may name a command without
    its required arguments."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    lines = [(ln.strip(), False) for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return lines + [(span.strip(), True) for span in re.findall(r"`([^`\n]+)`", rest)]


def _commands() -> list[tuple[str, str, bool]]:
    out = []
    for doc in DOCS:
        for line, inline in _code(doc.read_text(encoding="utf-8")):
            m = COMMAND.match(line)
            if m:
                out.append((f"{doc.relative_to(ROOT)}: {line}", line[m.end():].split(" / ")[0], inline))
    return out


def _tokens(cmd: str) -> tuple[list[str], bool]:
    """Shell-ish tokens of a quoted command (comments, pipes and redirections cut; ``$VAR``/``<x>``/``…``
    placeholders as a value), and whether it is a synopsis that leaves things out."""
    cmd = re.split(r"\s+#", cmd)[0]
    cmd = re.split(r"\s*(?:\||>|<|&&|;|2>)(?:\s+|$)", cmd)[0]
    partial = "..." in cmd or "…" in cmd
    cmd = cmd.replace("[", " ").replace("]", " ").replace("...", " ").replace("…", " ")
    toks = []
    for t in shlex.split(cmd):
        if t.startswith("$") or t.startswith("<") or t.startswith("{") or re.fullmatch(r"[A-Z][A-Z_]*", t):
            t = "1"
        elif "|" in t and not t.startswith("{"):
            t = t.split("|")[0]  # alternatives: the first
        toks.append(t)
    return toks, partial


QUOTED = _commands()


def test_the_docs_quote_commands_at_all():
    assert len(QUOTED) >= 30


@pytest.mark.parametrize("where, cmd, inline", QUOTED, ids=[w[:90] for w, _, _ in QUOTED])
def test_every_quoted_command_parses(where, cmd, inline):
    toks, partial = _tokens(cmd)
    partial = partial or inline
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(toks)
    except SystemExit as exc:
        problem = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(exc)
        if exc.code and not (partial and any(s in problem for s in SYNOPSIS_ONLY)):
            pytest.fail(f"{where}\n  -> {problem}")


def test_every_quoted_make_target_exists():
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    quoted = {(doc.name, m) for doc in DOCS for line, _ in _code(doc.read_text(encoding="utf-8"))
              for m in re.findall(r"(?:^|\s)make ([a-z][a-z0-9-]*)", line)}
    missing = sorted(q for q in quoted if q[1] not in targets)
    assert quoted and not missing, missing


def test_generated_reports_live_apart_from_the_hand_written_docs():
    """`make eval` and `make bench` write into docs/generated/ only (their defaults), so no generator overwrites a
    hand-written page; every hand-written page's pointer to a generated report names a file that exists."""
    from simulations import GENERATED_DOCS
    from simulations.bench.__main__ import DEFAULT_OUT
    from simulations.eval.report import REPORT_NAME
    from simulations.eval.runner import default_out_dir

    assert ROOT / GENERATED_DOCS == GENERATED
    assert default_out_dir(quick=False, only=None) == GENERATED
    assert (ROOT / DEFAULT_OUT).parent == GENERATED
    assert (GENERATED / REPORT_NAME).is_file() and (ROOT / DEFAULT_OUT).is_file()
    hand_written = [d for d in DOCS if GENERATED not in d.parents]
    for doc in hand_written:
        text = doc.read_text(encoding="utf-8")
        assert not text.startswith(("# haarvest — evaluation results", "# haarvest benchmarks")), doc
        for path in re.findall(r"docs/generated/[\w./-]*\w", text):
            assert (ROOT / path).exists(), f"{doc.relative_to(ROOT)} points at {path}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_relative_links_to_docs_and_images_resolve(doc):
    for target in re.findall(r"\]\(([^)\s#]+\.(?:md|png))(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
