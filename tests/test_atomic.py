"""The one writer of whole files (man_recipes/atomic.py): a reader sees the old file or the new one,
never half of one, and no other module renames a temporary file of its own over a result."""

import os
import re

import pytest

from conftest import REPO
from man_recipes.atomic import replacing, write_text

# the renames that are not a file written whole: a result moved aside, a resumable download's
# finished part, folders built whole (a binarized data folder, a sample, ROUGE's data, a head subset)
OTHER_RENAMES = {"man_recipes/atomic.py", "man_recipes/evaluation/result_files.py", "man_recipes/data/downloads.py",
                 "man_recipes/data/binarize.py", "man_recipes/evaluation/fixed_sample.py", "man_recipes/rouge155.py",
                 "man_recipes/data/head_subset.py"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old\n")
    theirs = tmp_path / ".results.json.tmp"  # a fixed temporary name would be someone's file
    theirs.write_text("keep")
    with pytest.raises(RuntimeError):
        with replacing(path) as f:
            f.write("half")
            raise RuntimeError("stopped")
    assert path.read_text() == "old\n" and theirs.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.json.tmp", "results.json"]
    write_text(path, "new\n")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == [".results.json.tmp", "results.json"]


def test_binary_and_the_umask_permissions(tmp_path):
    path = tmp_path / "figure.png"
    with replacing(path, "wb") as f:
        f.write(b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it: not a private mkstemp file


def test_no_other_writer_renames_a_temporary_file_over_a_result():
    files = [p for folder in ("man_fairseq", "man_recipes", "lab", "scripts") for p in sorted((REPO / folder).rglob("*.py"))]
    renaming = {str(p.relative_to(REPO)) for p in files if re.search(r"os\.replace\(|\.rename\(", p.read_text())}
    assert "man_recipes/atomic.py" in renaming  # the reader finds renames
    assert renaming - OTHER_RENAMES == set()
