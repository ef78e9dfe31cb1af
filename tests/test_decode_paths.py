"""``python -m lab.decode_paths``: one checkpoint decoded on several attention backends, hypotheses compared
(its real use, a trained Gigaword MAN checkpoint, is in docs/speed.md; fairseq-generate on both paths is
tested in test_fused_bias_grad.py). Here: the reading and the comparison, and bad input in one line."""

import subprocess
import sys

from conftest import REPO

from lab import decode_paths as dp

OUTPUT = """S-1\tsource one
H-1\t-0.25\ta b c
D-1\t-0.25\ta b c
P-1\t-0.1 -0.2
H-0\t-0.5\t
H-1\t-0.9\tlater beam
"""


def test_reads_the_top_hypothesis_and_its_score():
    assert dp.hypotheses(OUTPUT) == {1: (-0.25, "a b c"), 0: (-0.5, "")}


def test_compare_counts_identical_hypotheses_and_the_largest_score_difference():
    first = {0: (-0.5, "x"), 1: (-0.25, "a b")}
    assert dp.compare(first, {0: (-0.5, "x"), 1: (-0.2501, "a b")})[:2] == (2, 2)
    assert abs(dp.compare(first, {0: (-0.5, "x"), 1: (-0.2501, "a b")})[2] - 1e-4) < 1e-12
    assert dp.compare(first, {0: (-0.5, "y")})[:2] == (0, 2)


def run(*args):
    return subprocess.run([sys.executable, "-m", "lab.decode_paths", *map(str, args)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_bad_input_gets_one_line(tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"")
    for args, message in (
        (["configs/gigaword-cpu/man.yaml", tmp_path / "none.pt"], "no such checkpoint"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--backends", "auto"], "--backends: two or more of"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--backends", "auto,nosuch"], "--backends: two or more of"),
    ):
        proc = run(*args)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
