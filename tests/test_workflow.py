"""A researcher's path through the recipes: `make smoke` end to end, live training logs,
evaluate.sh's hints and --checkpoint, results that cannot be mistaken for the paper's setting,
entry points that work without an activated venv, and empty lines in fairseq-interactive."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import REPO, USER_DIR, run_cli
from pausing import pause_env
from toy_config import toy_config

from man_recipes.config import load_config
from man_recipes.evaluation.results_table import build_tables, deviations


def _env(**extra):
    env = dict(os.environ, **extra)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


@pytest.fixture(scope="module")
def stopped_run(toy_data_bin, tmp_path_factory):
    """scripts/train.sh stopped by --max-update in the middle of epoch 1, its stdout read live."""
    tmp = tmp_path_factory.mktemp("stopped")
    cfg = toy_config(toy_data_bin, "toy-stopped", {"warmup-updates": 5, "max-tokens": 300, "log-interval": 1},
                     {"paper_gpus": 1, "paper_update_freq": 1}, {"avg_last": 2})
    cfg_path = tmp / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = tmp / "run"
    # fairseq-train stops after its first train_inner line until the test has read train.log
    # (pausing.py): the check below sees the run mid-training, not at whatever moment it got to
    hook, _, release = pause_env(tmp, "fairseq-train", "| train_inner |")
    proc = subprocess.Popen(["bash", REPO / "scripts" / "train.sh", cfg_path, "--cpu", "--run-dir", run,
                             "--", "--max-update", "12"], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(**hook))
    watchdog = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))  # a hung run fails, not hangs
    watchdog.start()
    seen_live = None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if seen_live is None and "| train_inner |" in line:
                # the line is on the terminal: it must already be in train.log, while training goes on
                log = (run / "train.log").read_text()
                seen_live = (line in log, "done training" in log)
                release.touch()
        rc = proc.wait()
    finally:
        watchdog.cancel()
        release.touch()
    assert rc == 0, "".join(lines[-40:])
    return run, seen_live, "".join(lines)


def test_training_log_streams_line_by_line(stopped_run):
    run, seen_live, out = stopped_run
    assert seen_live == (True, False), "train.log lags behind the terminal or arrives only at the end"
    rec = json.loads((run / "run.json").read_text())
    assert rec["overrides"] == ["--max-update", "12"]


def test_evaluate_after_a_mid_epoch_stop(stopped_run):
    run, _, _ = stopped_run
    proc = subprocess.run(["bash", REPO / "scripts" / "evaluate.sh", run, "--cpu"], env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "holds only 0" in proc.stderr and "ended before its first epoch" in proc.stderr
    assert "--checkpoint " + str(run / "checkpoints" / "checkpoint_last.pt") in proc.stderr

    proc = subprocess.run(["bash", REPO / "scripts" / "evaluate.sh", run, "--cpu", "--checkpoint",
                           run / "checkpoints" / "checkpoint_last.pt"], env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "decoded 20 sentences" in proc.stdout  # progress of fairseq-generate is shown
    res = json.loads((run / "results.json").read_text())
    assert res["num_updates"] == 12 and res["epochs_completed"] == 0 and res["n_sentences"] == 20
    assert res["overrides"] == ["--max-update", "12"]
    # a BLEU config's result holds sacreBLEU beside tokenized BLEU, as the README says (issue 81); the toy
    # data folder keeps no raw references: the Moses-detokenized tokenized ones, and results.json says so
    assert set(res["scores"]) == {"bleu", "sacrebleu"} and res["details"]["sacrebleu_signature"].startswith("nrefs:1")
    assert res["details"]["sacrebleu_references"].startswith("Moses-detokenized")
    assert set(res["data_fingerprint"]) == {"dict.src.txt", "dict.tgt.txt", "test.src-tgt.src.idx",
                                            "test.src-tgt.src.bin", "test.src-tgt.tgt.idx", "test.src-tgt.tgt.bin"}


def test_interactive_empty_line_gets_an_empty_hypothesis(stopped_run, toy_data_bin):
    run, _, _ = stopped_run
    cmd = ["fairseq-interactive", toy_data_bin, "--user-dir", USER_DIR, "--path",
           run / "checkpoints" / "checkpoint_last.pt", "--source-lang", "src", "--target-lang", "tgt",
           "--beam", "2", "--cpu", "--buffer-size", "4", "--batch-size", "4"]

    def hyps(text):
        proc = subprocess.run([str(c) for c in cmd], input=text, capture_output=True, text=True,
                              env=_env(), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {int(l.split("\t")[0][2:]): l.split("\t")[2] for l in proc.stdout.splitlines()
                if l.startswith("H-")}, proc.stdout + proc.stderr

    with_empty, log = hyps("w1 w2 w3\n\nw4 w5\n")
    assert with_empty[1] == ""
    assert "1 empty source sentence(s): empty hypothesis" in log
    without, _ = hyps("w1 w2 w3\nw4 w5\n")
    assert (with_empty[0], with_empty[2]) == (without[0], without[1])


def test_smoke_path_end_to_end(tmp_path):
    out = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, "-m", "man_recipes.checks.smoke", "--out", out,
                           "--corpus", "synthetic", "--train-size", "200", "--eval-size", "10"],
                          env=_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = (out / "results.md").read_text()
    assert "### Non-standard runs (not comparable with the papers' numbers)" in table
    row = next(l for l in table.splitlines() if "man-t1-iwslt14-man-small" in l)
    assert "fairseq options overridden: `--encoder-layers 1" in row
    assert "(config: `data-bin/iwslt14.tokenized.de-en`)" in row
    assert "10 test sentences (standard test set: 6,750)" in row and "(config: max-update 80000)" in row
    assert "36.30" not in table  # --only-finished: no paper row without a standard run
    # a second smoke run replaces its own files and keeps the user's
    (out / "notes.txt").write_text("mine")
    from man_recipes.workdir import prepare_out_dir

    prepare_out_dir(out, command="smoke")
    assert sorted(p.name for p in out.iterdir()) == [".man-fairseq-created", "notes.txt"]


def _result(cfg, **changes):
    res = {"name": cfg["name"], "scores": {"bleu": 35.0}, "subset": "test", "n_sentences": 6750,
           "data": cfg["data"], "overrides": [], "num_updates": 80000, "epochs_completed": 60,
           "effective_batch_tokens": 8192, "paper_effective_batch_tokens": 8192,
           "run_config": {k: cfg.get(k) for k in ("arch", "model", "train", "batch")}, "_run": "runs/x"}
    res.update(changes)
    return res


def test_results_table_separates_non_standard_runs():
    cfg = load_config("configs/man/t1-iwslt14-man-small.yaml")
    assert deviations(cfg, _result(cfg)) == []
    assert f"| {cfg['row']} | IWSLT14 De-En | 36.30 | 35.00 |" in build_tables([cfg], {"a": _result(cfg)})

    small = _result(cfg, data="/home/me/private-bin", n_sentences=200, num_updates=700,
                    overrides=["--encoder-layers", "1"])
    reasons = deviations(cfg, small)
    assert reasons == ["fairseq options overridden: `--encoder-layers 1`",
                       "data `/home/me/private-bin` (config: `data-bin/iwslt14.tokenized.de-en`)",
                       "700 updates (config: max-update 80000)",
                       "200 test sentences (standard test set: 6,750)"]
    table = build_tables([cfg], {"a": small})
    assert f"| {cfg['row']} | IWSLT14 De-En | 36.30 | – |" in table
    assert f"| `runs/x` | {cfg['row']} (`man-t1-iwslt14-man-small`) | bleu 35.00 |" in table

    old = {"name": cfg["name"], "scores": {"bleu": 1.0}, "dataset": "iwslt14", "n_sentences": 6750}
    assert deviations(cfg, old)[0].startswith("no provenance")
    changed = _result(cfg, run_config={**_result(cfg)["run_config"], "model": {"encoder-sublayers": "x"}})
    assert deviations(cfg, changed) == ["config `model` changed since the run"]


def test_results_table_runs_without_an_activated_venv(tmp_path):
    # like train.sh / evaluate.sh: the project's Python is found by scripts/_env.sh, not `env python`
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run([REPO / "scripts" / "results_table.py", "--runs", tmp_path, "--paper", "man"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### Mask Attention Networks — Table 1" in proc.stdout


def test_train_sh_refuses_to_mix_runs_in_one_directory(tmp_path):
    run = tmp_path / "run"
    train = ["bash", REPO / "scripts" / "train.sh", "configs/man/t1-iwslt14-man-small.yaml", "--dry-run",
             "--run-dir", run]
    run_cli(train)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "checkpoint_last.pt").write_bytes(b"trained")
    record = (run / "run.json").read_text()
    run_cli(train)  # the same command may continue its run
    proc = run_cli(train + ["--", "--encoder-layers", "1"], check=False)
    assert proc.returncode != 0 and "holds checkpoints of another command" in proc.stdout
    assert (run / "run.json").read_text() == record
