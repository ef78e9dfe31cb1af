"""Small helpers of every results table (the studies', the paper rows', the demo's, the speed and GPU
reports', the analyses'): the Markdown table writer, mean and sample standard deviation, and a label
made safe as a file name."""

import math
import re

SEPARATORS = {"l": "---", "r": "---:"}  # a column's separator cell by its alignment


def markdown_table(header, rows, align=None):
    """The lines of a Markdown table: ``header``'s line, the separator, one line per row of ``rows``.
    Cells are text the caller formatted (the writer formats no number and escapes nothing: see
    :func:`markdown_cell`); a cell ``None`` is left blank as ``| |``. ``align``: one letter per column,
    ``l`` (the default, ``---``) or ``r`` (``---:``)."""
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - set(SEPARATORS):
        raise ValueError(f"align {align!r}: one of {sorted(SEPARATORS)} per column of {len(header)}")
    return ([_line(header), "|" + "|".join(SEPARATORS[a] for a in align) + "|"]
            + [_line(row) for row in rows])


def _line(cells):
    return "|" + "|".join(" " if c is None else f" {c} " for c in cells) + "|"


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a table: its ``|`` escaped, its line breaks spaces."""
    return text.replace("|", "\\|").replace("\n", " ")


def mean_std(values):
    """(mean, sample standard deviation or None for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return mean, std


def slug(label: str) -> str:
    """``label`` as a file or folder name: runs of other characters than letters, digits, ``_.-``
    become one ``_`` (``model`` when nothing is left)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "model"
