"""The command-line reference (docs/cli.md) cannot drift from the parser.

Every command and every flag the real argparse parser takes is documented where the
command is: in its row of the commands table (the synopsis in the first cell) or under a
heading that names it; a synopsis names only flags its command takes; and any other flag
on the page is a real one, or one the page shows being refused.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from objmanifest.cli.parser import build

CLI_DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
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
