"""Ctrl-C is one line on stderr and exit status 130 in every command (issue #72 item 6), never a
KeyboardInterrupt traceback: each entry point is wrapped in man_recipes.interrupt.one_line_on_ctrl_c
(data-prep and scripts/reproduce.sh print their own line inside it: tests/test_data_prep.py,
tests/test_reproduce_interrupt.py)."""

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, child_env, default_ctrl_c
from man_recipes.interrupt import EXIT_INTERRUPTED


def console_scripts():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return sorted(scripts.items())


def script_main(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


# the entry points of scripts/*.sh, scripts/*.py and data-prep/*.sh (beside the console scripts)
SCRIPT_MAINS = {
    "scripts/train.sh": "man_recipes.training.launch:main",
    "scripts/evaluate.sh": "man_recipes.evaluation.evaluate:main",
    "scripts/reproduce.sh": "man_recipes.studies.reproduce:main",
    "scripts/speed.sh": "lab.speed.__main__:main",
    "scripts/results_table.py": "man_recipes.evaluation.results_table:main",
    "data-prep/prepare-*.sh": "man_recipes.data.prepare:main",
    "data-prep/prepare-multi30k.sh": "man_recipes.data.multi30k:main",
    # the lab's instruments with a command line of their own
    "python -m lab.lr_probe": "lab.lr_probe:main",
    "python -m lab.sublayer_grads": "lab.sublayer_grads:main",
    "python -m lab.dev_set_rouge": "lab.dev_set_rouge:main",
    "python -m lab.gpu_check": "lab.gpu_check:main",
    "python -m lab.flex_keys": "lab.flex_keys:main",
    "python -m lab.compare_rouge_scorers": "lab.compare_rouge_scorers:main",
    "python -m lab.man_training_study": "lab.man_training_study:main",
    "python -m lab.decode_paths": "lab.decode_paths:main",
    "python -m lab.speed.fused_bias": "lab.speed.fused_bias:main",
    "python -m lab.speed.study": "lab.speed.study:main",
    "python -m lab.speed.synthetic": "lab.speed.synthetic:main",
    "python -m lab.speed.cuda_peak": "lab.speed.cuda_peak:main",
    "make smoke": "man_recipes.checks.smoke:main",
}


def resolve(target):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("command, target", console_scripts() + sorted(SCRIPT_MAINS.items()))
def test_every_entry_point_prints_ctrl_c_as_one_line(command, target):
    assert getattr(resolve(target), "ctrl_c_is_one_line", False), f"{command}: {target} is not wrapped"


def test_the_demo_prints_ctrl_c_as_one_line():
    assert getattr(script_main(REPO / "scripts" / "demo.py"), "ctrl_c_is_one_line", False)


def ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def test_files2rouge(tmp_path, capsys, monkeypatch):
    from man_recipes.cli import files2rouge

    ref = tmp_path / "ref.txt"
    ref.write_text("a b .\n")
    monkeypatch.setattr(files2rouge.rouge155, "run", ctrl_c)
    assert files2rouge.main([str(ref), str(ref)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "man-files2rouge: interrupted (Ctrl-C)\n"


def test_evaluate_names_where_the_previous_result_is(tmp_path, capsys, monkeypatch):
    from man_recipes.evaluation import evaluate

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    (run / "results.json").write_text("{}\n")

    def retire_then_ctrl_c(run, args, moved):  # as evaluate() does: the earlier results aside, then decoding
        moved += evaluate.result_files.retire(run, "test", evaluate.result_files.result_names("test", "test"), False)
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate", retire_then_ctrl_c)
    assert evaluate.main([str(run), "--cpu"]) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err == f"scripts/evaluate.sh: interrupted (Ctrl-C); the previous result is in {run / 'results.previous.json'}\n"
    assert (run / "results.previous.json").read_text() == "{}\n"


def test_speed(capsys, monkeypatch):
    import lab.speed.__main__ as speed
    import lab.speed.study

    monkeypatch.setattr(lab.speed.study, "main", ctrl_c)
    assert speed.main(["study", "gigaword-cpu"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "scripts/speed.sh: interrupted (Ctrl-C)\n"


@pytest.mark.parametrize("mode, line", [("study", "scripts/speed.sh"), ("synthetic", "scripts/speed.sh synthetic")])
def test_a_speed_mode_prints_ctrl_c_as_one_line_alone_and_under_speed_sh(mode, line, capsys, monkeypatch):
    """``python -m lab.speed.MODE`` (issue 81): its own line, the same as under scripts/speed.sh, said once."""
    import lab.speed.__main__ as speed

    module = importlib.import_module(f"lab.speed.{mode}")
    monkeypatch.setattr(module, "quiet_logging", ctrl_c)  # the mode's first step
    assert module.main([]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"{line}: interrupted (Ctrl-C)\n"
    assert speed.main([mode]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"{line}: interrupted (Ctrl-C)\n"


def test_a_real_ctrl_c_while_rouge_runs(tmp_path):
    """SIGINT to the command's process group (a terminal's Ctrl-C), ROUGE-1.5.5's Perl included."""
    lines = "".join(f"the cat number {i} sat on the mat . it was a good cat .\n" for i in range(4000))
    (tmp_path / "ref.txt").write_text(lines)
    proc = subprocess.Popen([sys.executable, "-u", "-m", "man_recipes.cli.files2rouge", str(tmp_path / "ref.txt"),
                             str(tmp_path / "ref.txt")], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_ctrl_c)
    out = ""
    while "Running ROUGE" not in out and proc.poll() is None:
        out += proc.stdout.readline()
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err[-2000:]
    assert err == "man-files2rouge: interrupted (Ctrl-C)\n"


# ---- no child left running (issue 81): man_recipes.interrupt.child_process / run_child


def running(pid):
    """Whether process ``pid`` exists and is not a zombie (ended, not yet waited for)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ended_or_killed(pids):
    """The pids of ``pids`` still running, each then killed so that no test leaves it behind."""
    alive = [pid for pid in pids if running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


@pytest.mark.parametrize("to", ["the terminal's group", "train.sh alone"])
def test_a_real_ctrl_c_while_train_sh_trains_leaves_no_fairseq_train(to, toy_data_bin, tmp_path):
    """SIGINT while scripts/train.sh's fairseq-train trains (held after its first logged update, so not
    racing it): one line, exit 130, fairseq-train ended, whether SIGINT reached the whole foreground
    group (a terminal's Ctrl-C) or train.sh alone (``kill -INT``: fairseq-train was left training)."""
    import yaml
    from pausing import pause_env, wait_for
    from toy_config import toy_config

    cfg = toy_config(toy_data_bin, "toy-ctrl-c", {"warmup-updates": 5, "max-tokens": 300, "log-interval": 1},
                     {"paper_gpus": 1, "paper_update_freq": 1}, {})
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(cfg))
    hook, reached, release = pause_env(tmp_path, "fairseq-train", "| train_inner |")
    with open(tmp_path / "stdout.txt", "w") as out:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "train.sh"), str(tmp_path / "toy.yaml"), "--cpu",
                                 "--run-dir", str(tmp_path / "run"), "--", "--max-update", "50"],
                                env=child_env({"OMP_NUM_THREADS": "1", **hook}), stdout=out, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=default_ctrl_c)
    child = None
    try:
        wait_for(reached, proc)
        child = int(reached.read_text())
        if to == "train.sh alone":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        release.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _ended_or_killed([child]) == [], "fairseq-train was left running"
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert err == ("scripts/train.sh: interrupted (Ctrl-C); fairseq-train keeps its last checkpoint: the same "
                   "command again resumes from it\n")


NESTED = """
import os, sys
from man_recipes.interrupt import child_process, one_line_on_ctrl_c, run_child

@one_line_on_ctrl_c(sys.argv[1])
def main():
    if sys.argv[1] == "outer":  # a command of ours running another (as the smoke check runs train.sh)
        return run_child([sys.executable, "-c", sys.argv[2], "inner", sys.argv[2], sys.argv[3]]).returncode
    with child_process(["sleep", "600"]) as proc:  # the inner one: a child of its own
        with open(sys.argv[3], "w") as f:
            f.write(f"{os.getpid()} {proc.pid}\\n")
        return proc.wait()

sys.exit(main())
"""


def test_ctrl_c_of_a_command_running_another_of_ours_is_one_line_and_ends_both_and_theirs(tmp_path):
    """The inner command is stopped (SIGTERM) by the outer one: it stops its own child and says nothing;
    the outer one says its line."""
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", NESTED, "outer", NESTED, str(pids)], cwd=REPO, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_ctrl_c)
    try:
        deadline = time.monotonic() + 60
        while not (pids.is_file() and pids.read_text().endswith("\n")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        inner, sleep = map(int, pids.read_text().split())
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _ended_or_killed([inner, sleep]) == []
    assert (proc.returncode, out, err) == (EXIT_INTERRUPTED, "", "outer: interrupted (Ctrl-C)\n")


POOL = """
import sys, time
from multiprocessing import Pool
from man_recipes.interrupt import one_line_on_ctrl_c

def nap(x):
    time.sleep(60)

@one_line_on_ctrl_c("pool")
def main():
    with Pool(2) as pool:  # its exit terminates the workers (SIGTERM), as data-prep's tokenizer on Ctrl-C
        pool.map_async(nap, [1, 2])
        time.sleep(1)
    return 0

sys.exit(main())
"""


def test_forked_workers_end_on_sigterm_as_before():
    """A command's SIGTERM handler (Terminated) is inherited by the workers a Pool forks: terminated, they
    end without a traceback, as before."""
    proc = subprocess.run([sys.executable, "-c", POOL], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
