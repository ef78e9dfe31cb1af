"""The one reader of a user's text (corpora, references, stories): UTF-8, or an error naming the
file and the first line that is not.

Nothing is replaced: a Latin-1 file read with ``errors="replace"`` turned every accented word
into U+FFFD, in the data-bin and in the references BLEU is computed on, and the command still
exited 0. Lines are split at "\\n" only (a "\\r" before it is dropped), the way data-prep writes
them, so that a line number here is the line number in the file.

:func:`check_aligned` is the one check that parallel texts (hypotheses, references) have one line
per sentence each, which every scorer (:mod:`man_fairseq.scoring`, :mod:`man_fairseq.rouge155`)
runs first.
"""

import gzip
from pathlib import Path
from typing import List


class NotUtf8Error(ValueError):
    """A user's text file with bytes that are not UTF-8; the message says where."""

    def __init__(self, path, line: int, column: int, bad: bytes):
        self.path, self.line, self.column = Path(path), line, column
        shown = " ".join(f"0x{b:02x}" for b in bad)
        super().__init__(
            f"{path}: line {line} is not UTF-8 text ({shown} at byte {column} of the line); "
            "convert the file to UTF-8 first (e.g. iconv -f latin1 -t utf-8, for a Latin-1 file)")


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def read_lines(path) -> List[str]:
    """Lines of a UTF-8 text file (``*.gz``: gunzipped), without line ends.

    Raises NotUtf8Error at the first line that is not UTF-8; a truncated ``.gz`` raises what
    gzip raises (EOFError, gzip.BadGzipFile), for the caller to name."""
    path = Path(path)
    lines = []
    with _open(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise NotUtf8Error(path, number, e.start + 1, raw[e.start:e.end]) from None
            lines.append(line.rstrip("\n").rstrip("\r"))
    return lines


def read_text(path) -> str:
    """The whole of a UTF-8 text file (``*.gz``: gunzipped); NotUtf8Error as :func:`read_lines`."""
    path = Path(path)
    with _open(path) as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise NotUtf8Error(path, data.count(b"\n", 0, e.start) + 1, e.start - line_start + 1,
                           data[e.start:e.end]) from None


class ScoreInputError(ValueError):
    """Inputs no score can honestly be computed on; the message names each source and its count."""


def check_aligned(sources, references=None):
    """Refuse what a corpus score would silently misread, and return the lines as lists.

    ``sources``: (name, lines) pairs, one line per sentence, each name saying what and which file
    (``"references data-bin/test.raw.en"``). They must have the same, non-zero number of lines,
    and the source named ``references`` must not be all blank (a hypothesis may be: a model can
    decode nothing). Raises :class:`ScoreInputError` naming every source with its count."""
    sources = [(name, list(lines)) for name, lines in sources]

    def counted():
        said = [f"{name} has {len(lines):,} line{'' if len(lines) == 1 else 's'}" for name, lines in sources]
        return " but ".join(said) if len(said) == 2 else ", ".join(said)

    counts = {len(lines) for _, lines in sources}
    if len(counts) > 1:
        raise ScoreInputError(f"unequal line counts: {counted()} (one line per sentence is needed, in the same order)")
    if counts == {0}:
        raise ScoreInputError(f"nothing to score: {counted()}")
    for name, lines in sources:
        if name == references and not any(line.strip() for line in lines):
            raise ScoreInputError(f"nothing to score against: every line of {name} is blank ({counted()})")
    return [lines for _, lines in sources]
