"""make gpu-check (lab/gpu_check.py): the parts a CPU can run -- the no-CUDA
refusal, pytest result parsing, judging the training logs and benchmark results, the report."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lab import gpu_check

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")

INNER = ("2026-11-23 22:13:00 | INFO | train_inner | epoch 001:     {u} / 127 loss={loss}, nll_loss=9.9, ppl=1, "
         "wps=1, ups=1, wpb=900, bsz=90, num_updates={u}, lr=1e-05, gnorm=1.6, loss_scale=None, train_wall=1, wall=2\n")
VALID = ("2026-11-23 22:13:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | nll_loss 6.9 | "
         "ppl 120.74 | wps 0 | wpb 346 | bsz 40 | num_updates 127\n")


def train_log(losses, valid="7.5"):
    return "".join(INNER.format(u=25 * (i + 1), loss=x) for i, x in enumerate(losses)) + VALID.format(loss=valid)


def test_without_cuda_it_says_so_and_exits_nonzero(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "lab.gpu_check", "--out", str(out)], cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no CUDA device" in proc.stderr and "--cpu-dry-run" in proc.stderr
    assert not out.exists()


def test_pytest_results_are_parsed_from_junit(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok():\n    assert True\n"
        "def test_bad():\n    assert 1 == 2, 'gradient off'\n"
        "@pytest.mark.skip(reason='needs CUDA')\ndef test_gpu():\n    pass\n")
    xml = tmp_path / "r.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
                           f"--junitxml={xml}"], cwd=tmp_path, stdout=subprocess.PIPE, text=True, timeout=120)
    results = {r["id"].split("::")[-1]: r for r in gpu_check.parse_junit(xml)}
    assert {k: r["outcome"] for k, r in results.items()} == {"test_ok": "passed", "test_bad": "failed",
                                                             "test_gpu": "skipped"}
    assert "gradient off" in results["test_bad"]["message"]
    check = gpu_check.pytest_check(list(results.values()), proc.returncode, "pytest-gpu.log")
    assert check.status == gpu_check.FAIL and check.summary.startswith("1 passed, 1 failed, 1 skipped")
    assert any("test_bad" in line and "gradient off" in line for line in check.details)
    passed_only = [results["test_ok"], results["test_gpu"]]
    assert gpu_check.pytest_check(passed_only, 0, "x.log").status == gpu_check.PASS
    assert gpu_check.pytest_check([results["test_gpu"]], 0, "x.log").status == gpu_check.SKIPPED
    # a crash with no failed test (e.g. a timeout) is not a pass
    assert gpu_check.pytest_check(passed_only, 124, "x.log").status == gpu_check.FAIL


def test_training_logs_are_judged():
    ok = gpu_check.training_row("man", train_log(["9.8", "8.1", "6.5"]), 0, 10.0, 300)
    assert ok["ok"] and ok["first"] == 9.8 and ok["last"] == 6.5 and ok["valid"] == 7.5 and ok["updates_per_s"] == 30
    assert gpu_check.training_row("man", train_log(["9.8", "nan", "6.5"]), 0, 10.0, 300)["problems"] == [
        "non-finite loss"]
    assert gpu_check.training_row("man", train_log(["9.8", "8.1"], valid="inf"), 0, 10.0, 300)["problems"] == [
        "non-finite loss"]
    assert gpu_check.training_row("man", train_log(["6.5", "9.8"]), 0, 10.0, 300)["problems"] == [
        "training loss did not fall"]
    crashed = gpu_check.training_row("man", "Traceback ...\n", 1, 3.0, 300)
    assert crashed["problems"] == ["exit code 1", "no training loss logged"] and crashed["updates_per_s"] is None
    check = gpu_check.training_check([ok, crashed], 300)
    assert check.status == gpu_check.FAIL
    assert "| man | ok | 9.800 → 6.500 | 7.500 | 30.00 |" in check.details


def test_benchmark_results_become_ratios():
    """The synthetic mode's records (one per backend) become each family's ratios to the Transformer; a
    failed run (the mode's ERROR line, its exit code) fails the check and is quoted."""
    from test_speed import record, run_of

    def backend_record(backend, families=("transformer", "man")):
        runs = [run_of(1, "transformer", [5, 1000, 1000], 1024.0, 50.0), run_of(1, "man", [5, 950, 950], 1126.4, 45.0)]
        return dict(record(runs[:len(families)], families=families, experiment=f"synthetic-base-{backend}"),
                    synthetic={"backend": backend})

    recs = [backend_record("auto"), backend_record("flex")]
    check = gpu_check.benchmark_check(recs, "| table |", 2, "fp16", "ERROR: training man failed (exit code 1): boom")
    assert check.status == gpu_check.FAIL and "exit code 2" in check.summary
    assert "| man | auto | 0.950× | 1.100× | 0.900× |" in check.details
    assert any("boom" in line for line in check.details)
    assert gpu_check.benchmark_check(recs, "", 0, "fp16").status == gpu_check.PASS
    assert gpu_check.benchmark_check(recs, "", 1, "fp16").status == gpu_check.FAIL
    assert gpu_check.benchmark_check([], "", 0, "fp16").status == gpu_check.FAIL  # nothing measured


def test_cpu_dry_run_writes_one_report(tmp_path, capsys):
    out = tmp_path / "check"
    assert gpu_check.main(["--cpu-dry-run", "--out", str(out), "--skip", "training"]) == 0
    report = (out / "gpu-check.md").read_text()
    assert report.startswith("# man-fairseq GPU check: pass") and "CPU dry run: no GPU was used" in report
    for key in ("| commit |", "| device | no CUDA device |", "| torch | " + torch.__version__, "| cuDNN |", "| driver |"):
        assert key in report, key
    # tests/gpu was collected and skipped (not crashed): every GPU test skipped for want of CUDA
    assert "| pytest tests/gpu | skipped |" in report and "needs CUDA" in report
    assert "| benchmark against fairseq's transformer | skipped | CPU dry run |" in report
    assert "Multi30k" not in report  # --skip training
    assert (out / "pytest-gpu.log").exists()
    # nothing is overwritten
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main(["--cpu-dry-run", "--out", str(out)])
    assert exit_info.value.code == 2
    assert f"--out {out} exists; give a new folder (nothing is overwritten)" in capsys.readouterr().err
