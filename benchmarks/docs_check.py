"""Checks that every table in a benchmark page says where its numbers came from.

    python -m benchmarks.docs_check [PATH]      # default: docs/benchmarks.md

A table is a block of lines starting with `|` whose second line is a `|---` separator
(fenced code is skipped). Each must be preceded, blank lines aside, by a reader line
starting with `*Command:*` and, above it, a stamp:

    <!-- stamp: command="python -m benchmarks.speedup --repeats 16" machine="..." commit="eda21ea" -->

The command must start with `python -m benchmarks.` (the lab, run from a checkout),
`python -m specasr.` or `specasr ` and name a module that exists; a click command's parser
must accept its options (tokens only: no types, paths or callbacks are checked, so
placeholders such as WORK are fine), and any other module must at least mention each
`--option` it is given. The commit must be 7–40 hex digits, the
reader line must show the same command and commit, and the page may have at most
MAX_LINES lines. Prints one line per problem; exit status 1 if there were any.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import click

MAX_LINES = 350
DEFAULT_PATH = Path("docs/benchmarks.md")
STAMP = re.compile(r'<!-- stamp: command="([^"]+)" machine="([^"]+)" commit="([^"]+)" -->')
READER = "*Command:*"
PREFIXES = ("benchmarks.", "specasr.")  # modules a stamped `python -m` command may name
ROOT = Path(__file__).resolve().parents[1]  # the checkout: `benchmarks` imports from there


def _module_of(command: str) -> tuple[str, list[str]] | str:
    """(module, arguments) of a stamped command, or a problem."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        return f"command {command!r} does not parse: {e}"
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2].startswith(PREFIXES):
        return words[2], words[3:]
    if words[:1] == ["specasr"]:
        return "specasr.cli", words[1:]
    starts = "'python -m benchmarks.', 'python -m specasr.' or 'specasr '"
    return f"command {command!r} starts with none of {starts}"


def _click_problem(cmd: click.Command, args: list[str], name: str) -> str | None:
    """Parses args' option tokens with cmd's own parser, into subcommands for groups."""
    try:
        rest = cmd.make_parser(click.Context(cmd, info_name=name)).parse_args(args=list(args))[1]
    except click.UsageError as e:
        return f"{name}: {e.format_message()}"
    if isinstance(cmd, click.Group):
        if not rest:
            return f"{name}: no subcommand given"
        sub = cmd.get_command(click.Context(cmd, info_name=name), rest[0])
        if sub is None:
            return f"{name}: no such subcommand {rest[0]!r}"
        return _click_problem(sub, rest[1:], f"{name} {rest[0]}")
    if rest and not any(isinstance(p, click.Argument) for p in cmd.params):
        return f"{name}: unexpected arguments {rest}"
    return None


def check_command(command: str) -> str | None:
    """None if the command names an existing benchmarks or specasr module that accepts its options."""
    parsed = _module_of(command)
    if isinstance(parsed, str):
        return parsed
    module, args = parsed
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"no module {module!r} (command {command!r})"
    source = Path(spec.origin).read_text() if spec.origin and spec.origin.endswith(".py") else ""
    if "import click" in source:  # only click modules are imported (others may need a GPU stack)
        try:
            entry = getattr(importlib.import_module(module), "main", None)
        except Exception as e:  # a module that exists but does not import is a problem too
            return f"{module} does not import: {e!r}"
        if isinstance(entry, click.Command):
            return _click_problem(entry, args, module)
    for word in args:
        option = word.split("=", 1)[0]
        if option.startswith("--") and f'"{option}"' not in source:
            return f"{module}: option {option} not found in its source"
    return None


def tables(lines: list[str]) -> list[int]:
    """0-based indices of the first line of each table outside fenced code."""
    found, fenced = [], False
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith("```"):
            fenced = not fenced
        elif not fenced and text.startswith("|") and (i == 0 or not lines[i - 1].strip().startswith("|")):
            if i + 1 < len(lines) and lines[i + 1].strip().startswith("|---"):
                found.append(i)
    return found


def check(text: str, source: str = "<text>") -> list[str]:
    """Every problem of one markdown page, as 'source:line: message'."""
    lines = text.splitlines()
    problems = []
    if len(lines) > MAX_LINES:
        problems.append(f"{source}: {len(lines)} lines, more than {MAX_LINES}")
    for start in tables(lines):
        where = f"{source}:{start + 1}"
        above = [j for j in range(start - 1, -1, -1) if lines[j].strip()][:2]
        reader = above[0] if above and lines[above[0]].strip().startswith(READER) else None
        stamp_at = above[1] if reader is not None and len(above) > 1 else (above[0] if above else None)
        match = STAMP.fullmatch(lines[stamp_at].strip()) if stamp_at is not None else None
        if match is None:
            problems.append(f"{where}: table without a stamp comment right above it")
            continue
        command, machine, commit = match.groups()
        if reader is None:
            problems.append(f"{where}: no '{READER}' reader line between the stamp and the table")
        elif f"`{command}`" not in lines[reader] or commit not in lines[reader]:
            problems.append(f"{where}: the reader line does not show the stamp's command and commit")
        if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
            problems.append(f"{where}: commit {commit!r} is not 7–40 hex digits")
        if not machine.strip():
            problems.append(f"{where}: empty machine")
        if (problem := check_command(command)) is not None:
            problems.append(f"{where}: {problem}")
    for i, line in enumerate(lines):
        if line.strip().startswith("<!-- stamp:") and not STAMP.fullmatch(line.strip()):
            problems.append(f"{source}:{i + 1}: malformed stamp comment")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Checks PATH (default: docs/benchmarks.md, from the checkout if not in the cwd); 1 on problems."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    if not args and not path.exists():
        path = ROOT / DEFAULT_PATH
    text = path.read_text(encoding="utf-8")
    problems = check(text, str(path))
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{path}: {len(tables(text.splitlines()))} tables, all stamped")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
