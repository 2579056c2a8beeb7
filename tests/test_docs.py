"""docs/benchmarks.md: every table stamped with a command that runs, a machine and a commit."""

from __future__ import annotations

from pathlib import Path

from benchmarks import docs_check

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m benchmarks.speedup --repeats 16"
TABLE = "| a | b |\n|---|---|\n| 1 | 2 |\n"


def page(command: str = COMMAND, commit: str = "eda21ea", stamp: bool = True, reader: bool = True) -> str:
    lines = ["# Page", "", "Some text.", ""]
    if stamp:
        lines.append(f'<!-- stamp: command="{command}" machine="2-core CPU dev box" commit="{commit}" -->')
    if reader:
        lines.append(f"*Command:* `{command}` · *machine:* 2-core CPU dev box · *commit:* {commit}")
    return "\n".join([*lines, "", TABLE])


def test_real_benchmarks_page_passes():
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8")
    assert docs_check.check(text, str(path)) == []
    assert len(docs_check.tables(text.splitlines())) >= 8
    assert docs_check.main([str(path)]) == 0


def test_crafted_page_passes():
    assert docs_check.check(page()) == []
    assert docs_check.check(page("specasr eval librispeech-clean --data-dir /tmp/x --paper -o /tmp/y")) == []


def test_missing_stamp_fails(tmp_path):
    problems = docs_check.check(page(stamp=False))
    assert len(problems) == 1 and "without a stamp" in problems[0]
    bad = tmp_path / "bad.md"
    bad.write_text(page(stamp=False, reader=False))
    assert docs_check.main([str(bad)]) == 1


def test_missing_reader_line_fails():
    assert any("reader line" in p for p in docs_check.check(page(reader=False)))


def test_unknown_module_fails():
    problems = docs_check.check(page("python -m benchmarks.no_such_bench --repeats 3"))
    assert any("no module 'benchmarks.no_such_bench'" in p for p in problems)


def test_command_outside_specasr_fails():
    assert docs_check.check(page("python bench.py --repeats 3"))


def test_unknown_click_option_fails():
    assert any("--no-such-option" in p for p in docs_check.check(page(COMMAND + " --no-such-option 1")))
    assert any("--no-such" in p for p in docs_check.check(page("specasr bench --no-such x")))
    assert any("subcommand" in p for p in docs_check.check(page("specasr no-such-command")))


def test_unknown_argparse_option_fails():
    assert docs_check.check(page("python -m specasr.kernels.bench --device cpu")) == []
    assert any(
        "--no-such-flag" in p
        for p in docs_check.check(page("python -m specasr.kernels.bench --no-such-flag"))
    )


def test_commit_must_be_hex():
    assert any("hex" in p for p in docs_check.check(page(commit="HEAD~1")))
    assert any("hex" in p for p in docs_check.check(page(commit="abc12")))


def test_too_many_lines_fails():
    text = page() + "\n" * docs_check.MAX_LINES
    problems = docs_check.check(text)
    assert len(problems) == 1 and f"more than {docs_check.MAX_LINES}" in problems[0]


def test_tables_in_code_fences_are_not_tables():
    assert docs_check.check("```\n" + TABLE + "```\n") == []
    assert docs_check.tables((TABLE + "\n" + TABLE).splitlines()) == [0, 4]
