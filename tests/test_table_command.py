"""The study table's printed reproduction command runs as printed (issue #72 item 5): its paths and
fairseq options are shell-quoted, so a path with a space or ``--adam-betas '(0.9, 0.98)'`` survives."""

import argparse
import shlex

from man_recipes.studies.study_table import one_run_command


def test_the_command_is_shell_quoted(tmp_path):
    data, results = tmp_path / "my data", tmp_path / "my results"
    args = argparse.Namespace(experiment="multi30k-cpu", data=str(data), results_dir=str(results),
                              fairseq_args=["--adam-betas", "(0.9, 0.98)", "--max-epoch", "2"])
    command = one_run_command("multi30k-cpu", "1,", " --batch-size 64", args)
    assert shlex.split(command) == [
        "scripts/reproduce.sh", "multi30k-cpu", "--seeds", "1,", "--families", "FAMILY", "--data", str(data),
        "--results-dir", str(results), "--batch-size", "64", "--", "--adam-betas", "(0.9, 0.98)", "--max-epoch", "2"]


def test_plain_paths_and_options_print_as_before(tmp_path):
    args = argparse.Namespace(experiment="multi30k-cpu", data=str(tmp_path / "data"), results_dir=str(tmp_path / "r"),
                              fairseq_args=["--max-epoch", "2"])
    assert one_run_command("multi30k-cpu", "1", "", args) == (
        f"scripts/reproduce.sh multi30k-cpu --seeds 1 --families FAMILY --data {tmp_path / 'data'} "
        f"--results-dir {tmp_path / 'r'} -- --max-epoch 2")
