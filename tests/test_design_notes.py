"""docs/design-notes.md's table "Where each rule lives" names only what exists.

Every backticked dotted name in the table (``package.module.function``,
``package.module.Class.method``) must import and resolve, so the page a newcomer
reads to find a rule of DESIGN.md can never send them to a function that was
renamed or deleted; and every rule issue 21 lists has its row.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

NOTES = Path(__file__).resolve().parent.parent / "docs" / "design-notes.md"
HEADING = "## Where each rule lives"
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")

# the rules that must each have a row (words of its first column, lower case)
RULES = (
    "eligibility, one row",
    "eligibility, the query",
    "ranking",
    "the pick and the claim",
    "opening a job",
    "the deadlines",
    "the decision after a failed attempt",
    "ending an attempt",
    "ending a job",
    "the score's inputs",
    "the charge",
    "the receipt",
    "the hold",
    "credit check",
    "spot checks",
    "quarantine",
    "rentals",
    "token sanity",
    "continuation",
    "liveness",
)


def table_rows() -> list[list[str]]:
    """The cells of the table's body rows (header and separator left out)."""
    text = NOTES.read_text(encoding="utf-8")
    start = text.index(HEADING) + len(HEADING)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else None]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.lstrip().startswith("|")
    ]
    return rows[2:]


def dotted_names() -> list[str]:
    """Every backticked dotted name in the table, in order, once."""
    names: dict[str, None] = {}
    for row in table_rows():
        for cell in row:
            for name in DOTTED.findall(cell):
                names.setdefault(name, None)
    return list(names)


def resolve(name: str) -> object:
    """The object ``name`` names: the longest importable module prefix, then
    attributes. Raises ImportError or AttributeError when it does not exist."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # a missing prefix is fine (try a shorter one); a module that exists
            # but fails to import is an error of its own
            if exc.name is not None and not module_name.startswith(exc.name):
                raise
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(f"no module of {name} can be imported")


def test_the_table_has_a_row_for_every_rule():
    firsts = [row[0].lower() for row in table_rows()]
    missing = [rule for rule in RULES if not any(rule in first for first in firsts)]
    assert missing == []
    assert all(len(row) == 3 for row in table_rows()), "rule | function(s) | callers"


def test_the_table_names_functions():
    assert len(dotted_names()) > 40


@pytest.mark.parametrize("name", dotted_names())
def test_every_name_in_the_table_exists(name):
    assert resolve(name) is not None
