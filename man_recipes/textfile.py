"""The one reader of a user's text (corpora, references, stories): UTF-8, or an error naming the
file and the first line that is not.

Nothing is replaced: a Latin-1 file read with ``errors="replace"`` turned every accented word
into U+FFFD, in the data-bin and in the references BLEU is computed on, and the command still
exited 0. Lines are split at "\\n" only (a "\\r" before it is dropped), the way data-prep writes
them, so that a line number here is the line number in the file. A damaged or truncated ``.gz``
is :class:`CorruptFileError` naming the file, also where its garbage would fail as text first.

:func:`check_aligned` is the one check that parallel texts (hypotheses, references) have one line
per sentence each, which every scorer (:mod:`man_recipes.scoring`, :mod:`man_recipes.rouge155`)
runs first; for ROUGE it also refuses a blank reference line.
"""

import gzip
import zlib
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


class CorruptFileError(ValueError):
    """A ``.gz`` file whose stream is cut short or damaged (or not gzip at all); the message names it."""

    def __init__(self, path, error):
        self.path = Path(path)
        super().__init__(f"{path}: corrupt or truncated gzip data ({type(error).__name__}: {error}); "
                         f"replace it with a complete copy (`gzip -t {path}` checks one)")


# what gzip raises on a damaged stream: a bad header, a CRC or length mismatch, a cut-short or
# damaged deflate stream
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _drain(f):
    """Read ``f`` to its end, so that a damaged .gz stream raises here: the garbage a damaged
    stream decompresses to is usually not UTF-8, and the file is to be named corrupt, not
    converted with iconv."""
    while f.read(1 << 20):
        pass


def read_lines(path) -> List[str]:
    """Lines of a UTF-8 text file (``*.gz``: gunzipped), without line ends.

    Raises NotUtf8Error at the first line that is not UTF-8, CorruptFileError for a damaged or
    truncated ``.gz``; both name the file."""
    path = Path(path)
    lines = []
    try:
        with _open(path) as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    _drain(f)
                    raise NotUtf8Error(path, number, e.start + 1, raw[e.start:e.end]) from None
                lines.append(line.rstrip("\n").rstrip("\r"))
    except _GZIP_ERRORS as e:
        raise CorruptFileError(path, e) from None
    return lines


def read_text(path) -> str:
    """The whole of a UTF-8 text file (``*.gz``: gunzipped); errors as :func:`read_lines`."""
    path = Path(path)
    try:
        with _open(path) as f:
            data = f.read()
    except _GZIP_ERRORS as e:
        raise CorruptFileError(path, e) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise NotUtf8Error(path, data.count(b"\n", 0, e.start) + 1, e.start - line_start + 1,
                           data[e.start:e.end]) from None


class ScoreInputError(ValueError):
    """Inputs no score can honestly be computed on; the message names each source and its count."""


def check_aligned(sources, references=None, blank_reference_lines=True):
    """Refuse what a corpus score would silently misread, and return the lines as lists.

    ``sources``: (name, lines) pairs, one line per sentence, each name saying what and which file
    (``"references data-bin/test.raw.en"``). They must have the same, non-zero number of lines,
    and the source named ``references`` must not be all blank (a hypothesis may be: a model can
    decode nothing); with ``blank_reference_lines=False`` (ROUGE, which averages per line and would
    count a blank reference as 0, where files2rouge stops) not one line of it may be blank.
    Raises :class:`ScoreInputError` naming every source with its count, or the first blank line."""
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
        if name != references:
            continue
        blank = [number for number, line in enumerate(lines, 1) if not line.strip()]
        if len(blank) == len(lines):
            raise ScoreInputError(f"nothing to score against: every line of {name} is blank ({counted()})")
        if blank and not blank_reference_lines:
            raise ScoreInputError(
                f"{name}: line {blank[0]} is blank ({len(blank):,} of {len(lines):,} lines are); ROUGE cannot score "
                "a blank reference (it would count as 0): remove those lines and the matching hypotheses, or fix "
                "the references")
    return [lines for _, lines in sources]
