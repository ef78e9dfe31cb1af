"""man-average-checkpoints' --output: never replaces a file it was not told to (--overwrite), never
a checkpoint of the run it averages, and is checked before any checkpoint is read; the recipes that
re-average into their own eval/ folder still can. Small synthetic checkpoints, in this process."""

import types

import pytest
import torch
import yaml
from conftest import REPO, call_entry_point

from man_recipes import averaging
from man_recipes.cli import average_checkpoints as avg
from man_recipes.evaluation import decode, evaluate
from man_recipes.studies import study_eval
from man_recipes.config import load_config


def _run_dir(tmp_path, n=3):
    """checkpoints/checkpoint{1..n}.pt whose one parameter is the epoch number, plus fairseq's others."""
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for i in range(1, n + 1):
        torch.save({"model": {"w": torch.full((2,), float(i))}}, ckpts / f"checkpoint{i}.pt")
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        torch.save({"model": {"w": torch.full((2,), 100.0)}}, ckpts / name)
    return ckpts


def _average(*argv):
    return call_entry_point(avg.cli_main, argv, prog="man-average-checkpoints", merge_stderr=True)


def _w(path):
    return torch.load(path, weights_only=True)["model"]["w"].tolist()


def _error_line(proc):
    """The command's whole output on an error: one line ``ERROR: ...``, exit status 2."""
    assert proc.returncode == 2, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), proc.stdout
    return lines[0]


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path):
    ckpts = _run_dir(tmp_path)
    out = tmp_path / "avg.pt"
    out.write_bytes(b"the user's file")
    line = _error_line(_average("--inputs", ckpts, "--num-epoch-checkpoints", "2", "--output", out))
    assert f"--output {out} exists; pass --overwrite" in line
    assert out.read_bytes() == b"the user's file"
    assert _average("--inputs", ckpts, "--num-epoch-checkpoints", "2", "--output", out, "--overwrite").returncode == 0
    assert _w(out) == [2.5, 2.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt", "run"]  # no temporary file left


def test_the_runs_own_checkpoints_are_never_replaced(tmp_path):
    ckpts = _run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    for name in ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint9.pt", "checkpoint_1_50.pt",
                 "checkpoint.best_loss_4.23.pt"):
        for extra in ((), ("--overwrite",)):
            line = _error_line(_average("--inputs", ckpts, "--num-epoch-checkpoints", "2",
                                        "--output", ckpts / name, *extra))
            assert "checkpoint name of the run being averaged" in line
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == before
    # other names in that folder are fine (the README's example writes checkpoints/run/avg.pt)
    assert _average("--inputs", ckpts, "--num-epoch-checkpoints", "3", "--output", ckpts / "avg.pt").returncode == 0
    assert _w(ckpts / "avg.pt") == [2.0, 2.0]


def test_output_is_checked_before_any_checkpoint_is_read(tmp_path, monkeypatch):
    ckpts = _run_dir(tmp_path)
    folder = tmp_path / "results"
    folder.mkdir()

    def no_work(*_):
        raise AssertionError("averaged before the output was checked")

    monkeypatch.setattr(averaging, "average_checkpoints", no_work)
    line = _error_line(_average("--inputs", ckpts, "--num-epoch-checkpoints", "2", "--output", folder))
    assert f"--output {folder} is a folder" in line
    assert list(folder.iterdir()) == []  # no .tmp left behind
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = _error_line(_average("--inputs", ckpts, "--num-epoch-checkpoints", "2", "--output", blocker / "avg.pt"))
    assert f"cannot write in {blocker}" in line


def test_a_failed_write_leaves_no_file_and_never_touches_a_tmp_of_the_user(tmp_path, monkeypatch):
    ckpts = _run_dir(tmp_path)
    out = tmp_path / "avg.pt"
    theirs = tmp_path / "avg.pt.tmp"  # the name the old command wrote to first
    theirs.write_text("keep")

    def full_disk(obj, f):  # half a checkpoint written, then the disk is full
        with open(f, "wb") if isinstance(f, str) else f as stream:
            stream.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(averaging.torch, "save", full_disk)
    with pytest.raises(OSError):
        avg.main(["--inputs", str(ckpts), "--num-epoch-checkpoints", "2", "--output", str(out)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg.pt.tmp", "run"]
    assert theirs.read_text() == "keep"


@pytest.mark.parametrize("flag", ["--num-epoch-checkpoints", "--num-update-checkpoints"])
def test_zero_checkpoints_is_named_as_such(tmp_path, flag):
    ckpts = _run_dir(tmp_path)
    line = _error_line(_average("--inputs", ckpts, flag, "0", "--output", tmp_path / "avg.pt"))
    assert f"{flag} 0: the number of checkpoints must be >= 1" in line


def test_a_folder_without_a_count_is_named_as_such(tmp_path):
    ckpts = _run_dir(tmp_path)
    line = _error_line(_average("--inputs", ckpts, "--output", tmp_path / "avg.pt"))
    assert f"--inputs {ckpts} is a folder: pass --num-epoch-checkpoints N" in line


class _Decoding(Exception):
    """fairseq-generate was reached: the averaging before it succeeded."""


def _stop_at_generate(monkeypatch):
    def generate(*_, **__):
        raise _Decoding()

    monkeypatch.setattr(decode, "run_generate", generate)


def test_reproduce_rescoring_replaces_its_own_average(tmp_path, monkeypatch):
    ckpts = _run_dir(tmp_path)
    run = ckpts.parent
    (run / "eval").mkdir()
    torch.save({"model": {"w": torch.zeros(2)}}, run / "eval" / "checkpoint_avg2.pt")  # an earlier scoring's
    _stop_at_generate(monkeypatch)
    args = types.SimpleNamespace(avg_last=2, device="cpu", data=tmp_path, precision="fp32", batch_size=8)
    manifest = {"target_lang": "en", "test_sets": {"test": "test"}}
    with pytest.raises(_Decoding):
        study_eval.evaluate_run({"eval": {}}, run, 1, "man", manifest, "bleu", args, "fp", "cpu", print)
    assert _w(run / "eval" / "checkpoint_avg2.pt") == [2.5, 2.5]


def test_evaluate_rerun_replaces_its_own_average(tmp_path, monkeypatch):
    ckpts = _run_dir(tmp_path)
    run = ckpts.parent
    cfg = {k: v for k, v in load_config(REPO / "configs" / "multi30k-cpu" / "man.yaml").items()
           if not k.startswith("_")}
    cfg["eval"]["avg_last"] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "eval").mkdir()
    torch.save({"model": {"w": torch.zeros(2)}}, run / "eval" / "checkpoint_avg3.pt")
    _stop_at_generate(monkeypatch)
    monkeypatch.setattr(evaluate, "check_before_decoding", lambda *_: None)  # no data folder: not this test's subject
    with pytest.raises(_Decoding):
        evaluate.main([str(run), "--cpu"])
    assert _w(run / "eval" / "checkpoint_avg3.pt") == [2.0, 2.0]
