"""`make demo` (scripts/demo.py): a short real run, and its checks on user-supplied text."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import demo  # noqa: E402


def test_demo_runs_the_whole_pipeline(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, REPO / "scripts" / "demo.py", "--out", out, "--epochs", "2", "--average", "2",
         "--train-size", "300", "--eval-size", "40"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "results.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert [r.split("|")[2].strip() for r in rows] == ["`transformer`", "`transformer_man_base`"]
    for row in rows:
        params, bleu, wps = (float(c.strip().replace(",", "")) for c in row.split("|")[3:6])
        assert params > 1e5 and 0 <= bleu <= 100 and wps > 0
    assert re.search(r"train \| epoch 002 \| loss", proc.stdout), "epochs are shown as they finish"
    assert (out / "checkpoints_man" / "averaged.pt").is_file()


def _write(folder, split, src_lines, tgt_lines):
    (folder / f"{split}.de").write_text("".join(l + "\n" for l in src_lines))
    (folder / f"{split}.en").write_text("".join(l + "\n" for l in tgt_lines))


def test_user_data_checks(tmp_path):
    for split in ("train", "valid", "test"):
        _write(tmp_path, split, ["a b", "c"], ["x", "y z"])
    demo.check_user_data(tmp_path, "de", "en")  # fine

    _write(tmp_path, "valid", ["a b", "c"], ["x"])
    with pytest.raises(SystemExit, match="valid.de has 2 lines but .*valid.en has 1"):
        demo.check_user_data(tmp_path, "de", "en")

    _write(tmp_path, "valid", ["a b", ""], ["x", "y"])
    with pytest.raises(SystemExit, match="empty lines .*line 2"):
        demo.check_user_data(tmp_path, "de", "en")

    (tmp_path / "test.en").unlink()
    _write(tmp_path, "valid", ["a"], ["x"])
    with pytest.raises(SystemExit, match="missing .*test.en"):
        demo.check_user_data(tmp_path, "de", "en")
