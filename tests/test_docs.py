"""The docs cannot drift from the code.

The command-line reference (docs/cli.md): every command and every flag the real argparse
parser takes is documented where the command is: in its row of the commands table (the
synopsis in the first cell) or under a heading that names it; a synopsis names only flags
its command takes; and any other flag on the page is a real one, or one the page shows
being refused.

Every Markdown file: each source file it names (``objmanifest/...``, ``tests/...``, or a
module of the package by its path inside it, as ARCHITECTURE.md's code map does) exists,
each test it names (``FILE.py::NAME``) is defined in that file, and each of our modules it
runs (``python -m tests.support.sim``) can be run so.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from objmanifest.cli.parser import build

ROOT = Path(__file__).resolve().parent.parent
CLI_DOC = ROOT / "docs" / "cli.md"
FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w*…-])")
LONG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w*…-])")
"""Prose names other tools' short options (``python -m``, ``read -r``): only long flags
are checked page-wide; a synopsis is checked for short ones too."""
# Shown on the page as refused (the hostile-input table), so never one of the parser's.
REFUSED = {"--nosuch", "--bogus"}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


GLOBAL = flags_of(build())
"""``--url``, ``--task``, ``--json`` ...: every command takes them."""
COMMANDS = commands()
TEXT = CLI_DOC.read_text()


def synopses(command: str) -> list[str]:
    """The first cell of each row of the commands table that is about ``command``."""
    return re.findall(rf"^\| `({re.escape(command)}(?: [^`]*)?)` \|", TEXT, re.M)


def sections(command: str) -> list[str]:
    """Every section whose heading names ``command`` in backquotes."""
    parts = re.split(r"(?m)^(?=#{2,4} )", TEXT)
    named = rf"`{re.escape(command)}(?: [^`]*)?`"
    return [part for part in parts if re.search(named, part.split("\n", 1)[0])]


def own_flags(command: str) -> set[str]:
    return flags_of(COMMANDS[command]) - GLOBAL - {"-h", "--help"}


def test_the_parser_has_commands_and_the_page_rows_for_each() -> None:
    assert len(COMMANDS) >= 30, sorted(COMMANDS)
    undocumented = [name for name in COMMANDS if not synopses(name)]
    assert undocumented == [], f"commands without a row in docs/cli.md: {undocumented}"
    rows = re.findall(r"^\| `([a-z][a-z-]*)[ `]", TEXT[TEXT.index("## Commands") :], re.M)
    table = rows[: rows.index("iam-policy") + 1]
    assert [name for name in table if name not in COMMANDS] == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_of_a_command_is_documented_with_it(command: str) -> None:
    where = "\n".join(synopses(command) + sections(command))
    missing = sorted(flag for flag in own_flags(command) if flag not in FLAG.findall(where))
    assert missing == [], f"{command}: flags missing from docs/cli.md: {missing}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_synopsis_names_only_flags_its_command_takes(command: str) -> None:
    taken = flags_of(COMMANDS[command])
    named = {flag for synopsis in synopses(command) for flag in FLAG.findall(synopsis)}
    assert sorted(named - taken) == [], f"{command}: docs/cli.md names flags it lacks"


def test_every_flag_on_the_page_is_one_the_parser_takes() -> None:
    every = set(GLOBAL).union(*(flags_of(p) for p in COMMANDS.values()))
    assert REFUSED.isdisjoint(every)
    unknown = sorted(set(LONG.findall(TEXT)) - every - REFUSED)
    assert unknown == [], f"docs/cli.md documents flags no command takes: {unknown}"


def test_the_global_options_table_lists_every_global_option() -> None:
    table = TEXT[TEXT.index("## Global options") : TEXT.index("## Commands")]
    listed = {
        flag for row in re.findall(r"^\| `([^`]*)`", table, re.M) for flag in FLAG.findall(row)
    }
    assert listed == GLOBAL - {"-h", "--help"}


# -- every page names files, tests and modules that exist -----------------------------------

MARKDOWN = sorted(
    [
        *ROOT.glob("*.md"),
        *(
            p
            for d in ("docs", "tests", "bench", "scripts", "localstack")
            for p in (ROOT / d).rglob("*.md")
        ),
    ]
)
"""Every page of the project but CHANGELOG.md, which records what was, gone files too."""
MARKDOWN.remove(ROOT / "CHANGELOG.md")
SOURCE = re.compile(r"(?<![\w./-])([\w-]+/[\w./-]*?\.(?:py|sh))(?:::(\w+))?")
"""A path to a source file (``tests/test_docs.py``, or ``core/layout.py`` inside the
package, as the code map writes them), and a test in it (``FILE.py::NAME``)."""
RUN = re.compile(r"python3? -m ((?:objmanifest|shard_index|tests|bench)(?:\.\w+)*)")
"""``python -m`` of one of our modules (not ``pytest`` or ``localstack``)."""


def named(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    return [
        (f"{page.relative_to(ROOT)}:{page.read_text()[: m.start()].count(chr(10)) + 1}", m)
        for page in MARKDOWN
        for m in pattern.finditer(page.read_text())
    ]


def source_file(path: str) -> Path | None:
    """The file a path on a page names: from the root, or inside the package."""
    for where in (ROOT / path, ROOT / "objmanifest" / path):
        if where.is_file():
            return where
    return None


def test_the_pages_are_found_and_name_files() -> None:
    assert {ROOT / "ARCHITECTURE.md", ROOT / "docs" / "testing.md"} <= set(MARKDOWN)
    assert len(named(SOURCE)) > 100


def test_every_file_a_page_names_exists() -> None:
    missing = [f"{where}: {m[1]}" for where, m in named(SOURCE) if source_file(m[1]) is None]
    assert missing == [], "pages name files that do not exist:\n" + "\n".join(missing)


def test_every_test_a_page_names_is_defined_in_its_file() -> None:
    missing = []
    for where, m in named(SOURCE):
        path = source_file(m[1])
        if m[2] and path is not None:
            tree = ast.parse(path.read_text())
            defined = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
            if m[2] not in defined:
                missing.append(f"{where}: {m[1]}::{m[2]}")
    assert missing == [], "pages name tests that do not exist:\n" + "\n".join(missing)


def runnable(module: str) -> bool:
    """Whether ``python -m module`` runs something: a package with a ``__main__``, or a
    module that runs when it is the main one."""
    path = ROOT.joinpath(*module.split("."))
    if (path / "__main__.py").is_file():
        return True
    script = path.with_suffix(".py")
    return script.is_file() and '__name__ == "__main__"' in script.read_text()


def test_every_module_a_page_runs_can_be_run() -> None:
    assert len(named(RUN)) > 20
    missing = [f"{where}: {m[0]}" for where, m in named(RUN) if not runnable(m[1])]
    assert missing == [], "pages run modules that cannot be run:\n" + "\n".join(missing)
