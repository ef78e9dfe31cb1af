"""The README's commands run as written: each recipe command it quotes answers ``--help``, its
ten-minute path is what ``scripts/train.sh --dry-run`` builds, and its hand-written fairseq-train is
the study config's command (a config changed without the README, or the README without the config,
fails here)."""

import shlex
import subprocess
import sys

from conftest import REPO, child_env
from test_docs_commands import bash_blocks

README = (REPO / "README.md").read_text()


def test_every_recipe_command_answers_help():
    commands = [c for c in bash_blocks(README) if c.split()[0].startswith(("scripts/", "data-prep/"))]
    assert {c.split()[0] for c in commands} >= {"data-prep/prepare-multi30k.sh", "scripts/train.sh", "scripts/evaluate.sh"}
    for command in commands:
        proc = subprocess.run([str(REPO / command.split()[0]), "--help"], cwd=REPO, capture_output=True, text=True,
                              env=child_env({"PYTHON": sys.executable}), timeout=300)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (command, proc.stderr[-2000:])


def options(argv):
    """{option: value or None} of a fairseq command line (positional data folder left out)."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            out[argv[i]] = value
            i += 2 if value is not None else 1
        else:
            i += 1
    return out


def test_the_hand_written_run_is_the_study_config():
    (manual,) = [shlex.split(c) for c in bash_blocks(README) if c.startswith("fairseq-train ")]
    proc = subprocess.run([str(REPO / "scripts" / "train.sh"), "configs/multi30k-cpu/man.yaml", "--cpu", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, env=child_env({"PYTHON": sys.executable}), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (built,) = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ fairseq-train ")]
    readme, recipe = options(manual[2:]), options(built[2:])
    where = {"--user-dir", "--save-dir"}  # the README's own run folder, a --user-dir that works anywhere
    assert {k: v for k, v in readme.items() if k not in where} == {
        k: v for k, v in recipe.items() if k not in where | {
            # what the recipe adds that the arch's or fairseq's defaults already are, or only logging
            "--task", "--source-lang", "--target-lang", "--encoder-normalize-before", "--decoder-normalize-before",
            "--log-format", "--log-interval", "--num-workers", "--update-freq"}}
    assert recipe["--update-freq"] == "1" and recipe["--task"] == "translation"
    assert readme["--save-dir"] == "runs/manual-man/checkpoints"  # not the recipe's run folder
