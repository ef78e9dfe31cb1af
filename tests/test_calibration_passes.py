"""``scripts/speed.sh profile --passes`` (lab/speed/profile.py): calibration's update timed by part. What it
times must be what the trainer runs (its two backwards write the joint backward's gradients), and a
short run on toy data writes a record of every part (nothing timed is asserted)."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from lab.speed import profile as cp, records
from test_calibration import build_model, make_batch, make_criterion, make_dictionary


def test_the_parts_write_the_gradients_of_the_criterions_one_backward():
    d = make_dictionary()
    torch.manual_seed(0)
    model = build_model(["--calibration-fusion", "anneal"], dictionary=d)
    model.train()  # dropout on: both runs must draw the same masks
    crit = make_criterion(d)
    sample = make_batch(d)

    torch.manual_seed(1)
    loss, _, _ = crit(model, sample)
    loss.backward()
    joint = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    parts = cp.calibration_update(model, crit, sample)
    assert list(parts) == cp.PHASES["calibration"] and all(s >= 0 for s in parts.values())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, joint[name], msg=name)
    assert any(float(joint[n].abs().sum()) > 0 for n in joint if ".perturbation." in n)


def test_a_short_run_records_every_part_and_keeps_an_earlier_record(gigaword_like_bin, tmp_path):
    out = tmp_path / "passes.json"
    cmd = [sys.executable, "-m", "lab.speed", "profile", "gigaword-cpu", "--passes", "--batches", "2",
           "--warmup", "0", "--data", str(gigaword_like_bin), "--output", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = records.read_record(out)  # the study's record format, its runs each batch's phases
    assert rec["experiment"] == "gigaword-cpu" and rec["settings"]["batches"] == 2
    assert rec["families"] == list(cp.PHASES) and rec["configs"]["calibration"] == "configs/gigaword-cpu/calibration.yaml"
    for fam, phases in cp.PHASES.items():
        runs = [r for r in rec["runs"] if r["family"] == fam]
        assert [r["batch"] for r in runs] == [1, 2] and all(list(r["phases"]) == phases for r in runs)
        assert all(r["target_tokens"] > 0 for r in runs)
    assert "| calibration | perturbation forward |" in proc.stdout and "| calibration | **all** |" in proc.stdout

    again = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert again.returncode == 2 and "exists; pass --force" in again.stderr.strip().splitlines()[-1]
    assert json.loads(out.read_text()) == rec


def test_a_folder_without_binarized_data_is_one_line_naming_the_command_that_makes_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cp.main(["gigaword-cpu", "--passes", "--data", str(tmp_path)])
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds no binarized data (prepare it: data-prep/prepare-gigaword.sh" in line
    assert line.endswith(f"--dest {tmp_path})")
