"""``python -m lab.decode_paths``: one checkpoint decoded on several attention backends, hypotheses compared
(its real use, a trained Gigaword MAN checkpoint, is in docs/speed.md; fairseq-generate on both paths is
tested in test_fused_bias_grad.py). Here: the reading and the comparison, no sentence or other sentences
refused, bad input in one line, a user's file never replaced."""

import subprocess
import sys

from conftest import REPO

from lab import decode_paths as dp
from man_recipes.evaluation.decode import read_generate_output, top_hypotheses

OUTPUT = """S-1\tsource one
T-1\tref one
H-1\t-0.25\ta b c
D-1\t-0.25\ta b c
P-1\t-0.1 -0.2
T-0\tref zero
H-0\t-0.5\t
H-1\t-0.9\tlater beam
"""


def test_reads_the_top_hypothesis_and_its_score_as_the_recipes_read_the_hypotheses():
    assert top_hypotheses(OUTPUT) == {1: (-0.25, "a b c"), 0: (-0.5, "")}
    assert read_generate_output(OUTPUT) == ([0, 1], ["", "a b c"], ["ref zero", "ref one"])


def test_compare_counts_identical_hypotheses_and_the_largest_score_difference():
    first = {0: (-0.5, "x"), 1: (-0.25, "a b")}
    same, diff = dp.compare(first, {0: (-0.5, "x"), 1: (-0.2501, "a b")})
    assert same == 2 and abs(diff - 1e-4) < 1e-12
    assert dp.compare(first, {0: (-0.5, "y"), 1: (-0.25, "a c")}) == (0, 0.0)


def test_no_sentence_or_other_sentences_are_refused():
    one = {0: (-0.5, "x")}
    assert dp.sentence_problem({"auto": one, "explicit": dict(one)}) is None
    assert dp.sentence_problem({"auto": {}, "explicit": {}}) == "auto decoded no sentence"
    assert dp.sentence_problem({"auto": one, "explicit": {1: (-0.5, "x")}}) == \
        "auto decoded 1 sentences, explicit 1: not the same ones"
    assert "explicit 0" in dp.sentence_problem({"auto": one, "explicit": {}})


def run(*args):
    return subprocess.run([sys.executable, "-m", "lab.decode_paths", *map(str, args)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_bad_input_gets_one_line(tmp_path):
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"")
    kept = tmp_path / "generate-auto.log"
    kept.write_text("a user's file")
    for args, message in (
        (["configs/gigaword-cpu/man.yaml", tmp_path / "none.pt"], "no such checkpoint"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--backends", "auto"], "--backends: two or more of"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--backends", "auto,nosuch"], "--backends: two or more of"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--batch-size", "0"], "--batch-size"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--logs", ckpt], "is a file, not a folder"),
        (["configs/gigaword-cpu/man.yaml", ckpt, "--logs", tmp_path], "holds generate-auto.log already"),
    ):
        proc = run(*args)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert kept.read_text() == "a user's file"
