"""Ctrl-C in scripts/reproduce.sh (issue 48, item 9): one line saying what was interrupted and how to
resume, exit status 130, no traceback (the resume itself: tests/test_multi30k.py, tests/test_convergence.py)."""

import os
import signal
import subprocess
import sys
import time

from conftest import REPO, TINY_MODEL, child_env, default_ctrl_c


def test_ctrl_c_while_training_is_one_line(gigaword_like_bin, tmp_path):
    cmd = [sys.executable, "-m", "man_recipes.studies.reproduce", "gigaword-cpu", "--seeds", "1,",
           "--families", "transformer", "--data", str(gigaword_like_bin), "--runs-dir", str(tmp_path / "runs"),
           "--results-dir", str(tmp_path / "results"), "--", *TINY_MODEL, "--max-epoch", "200", "--max-tokens", "500"]
    # its own process group, as a terminal's foreground job: Ctrl-C reaches fairseq-train too
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env({"OMP_NUM_THREADS": "1"}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_ctrl_c)
    checkpoint = tmp_path / "runs" / "transformer-seed1" / "checkpoints" / "checkpoint_last.pt"
    deadline = time.time() + 300
    while not checkpoint.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == [
        "scripts/reproduce.sh: interrupted while training transformer-seed1; run the same command again to "
        "resume: finished runs are skipped and it resumes from its last epoch checkpoint"]
    assert "Traceback" not in out + err
