"""README's flag table agrees with the command line: every flag it names exists in
`trio-kubelet run`, and the config field it pairs a flag with is the one the flag sets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trio_kubelet.cli import CONFIG_FLAGS, build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def expand(flag: str) -> list[str]:
    """``--a[-b]`` names ``--a`` and ``--a-b``; ``--x-[un]y`` names ``--x-y`` and ``--x-uny``."""
    match = re.fullmatch(r"(.*)\[(.+)\](.*)", flag)
    if match is None:
        return [flag]
    head, optional, tail = match.groups()
    return [head + tail, head + optional + tail]


def flag_rows() -> list[tuple[list[str], set[str]]]:
    """(flags, top-level config fields) of each row of README's "### Flags" table."""
    section = README.read_text().split("### Flags", 1)[1].split("\n\n`", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`--"):
            continue
        flags = [name for token in re.findall(r"`(--[\w\[\]-]+)", cells[0])
                 for name in expand(token)]
        fields = {field.split(".")[0] for field in re.findall(r"`([\w.]+)`", cells[1])}
        rows.append((flags, fields))
    return rows


ROWS = flag_rows()


def run_flags() -> set[str]:
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    run = commands.choices["run"]  # type: ignore[index]
    return {option for action in run._actions for option in action.option_strings}


def test_the_table_is_found() -> None:
    assert len(ROWS) >= 15


@pytest.mark.parametrize(("flags", "fields"), ROWS, ids=[" ".join(f) for f, _ in ROWS])
def test_each_flag_exists_and_sets_the_field_named_beside_it(
        flags: list[str], fields: set[str]) -> None:
    known = run_flags()
    sets = {flag.flag: flag.field.split(".")[0] for flag in CONFIG_FLAGS}
    for flag in flags:
        assert flag in known, f"README names {flag}, which `trio-kubelet run` does not have"
        if fields:
            assert sets.get(flag) in fields, f"{flag} sets {sets.get(flag)}, not {fields}"
        else:
            assert flag not in sets, f"README says {flag} has no config field; it sets {sets[flag]}"
