"""The one Markdown table writer (man_recipes/tables.py) and the rule that every table goes through it."""

import re
from pathlib import Path

import pytest

from man_recipes.tables import markdown_cell, markdown_table

REPO = Path(__file__).resolve().parent.parent


def test_head_separator_and_rows():
    assert markdown_table(["a", "b"], [["1", "2"], ["x", ""]]) == [
        "| a | b |", "|---|---|", "| 1 | 2 |", "| x |  |"]
    assert markdown_table(["only"], []) == ["| only |", "|---|"]


def test_alignment_per_column():
    assert markdown_table(["name", "n", "ratio"], [["a", "3", "1.2×"]], "lrr")[1] == "|---|---:|---:|"
    for bad in ("lr", "lrrr", "lcr"):
        with pytest.raises(ValueError, match="align"):
            markdown_table(["name", "n", "ratio"], [], bad)


def test_cells_are_written_as_given():
    # numbers are the caller's to format; None is a blank cell as the GPU and benchmark reports write it
    assert markdown_table([None, None], [[3, 0.5], ["a", None]]) == ["| | |", "|---|---|", "| 3 | 0.5 |", "| a | |"]
    # the writer escapes nothing: a caller that needs it says so with markdown_cell
    assert markdown_table(["x"], [["a | b"]])[2] == "| a | b |"


def test_markdown_cell_escapes_pipes_and_line_breaks():
    assert markdown_cell("a|b\nc") == "a\\|b c"
    assert markdown_table(["x"], [[markdown_cell("a | b")]])[2] == "| a \\| b |"


def test_every_table_goes_through_the_writer():
    """No module writes a table's separator line by hand (the writer is the one place that does)."""
    by_hand = re.compile(r"""["']\|?-{3}:?\|""")
    found = [f"{path.relative_to(REPO)}:{i}" for folder in ("man_fairseq", "man_recipes", "scripts") for path in sorted((REPO / folder).rglob("*.py"))
             if path.name != "tables.py" for i, line in enumerate(path.read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, found
