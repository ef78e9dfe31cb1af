"""python -m lab.lr_probe: the command it runs, how it reads fairseq's log, its verdicts, and one real
(tiny) probe end to end on the toy corpus."""

import json
import math

from conftest import TINY_MODEL
from lab import lr_probe
from man_recipes.config import load_config

SMALL = "configs/man/t1-iwslt14-man-small.yaml"


def _flag(argv, flag):
    i = len(argv) - 1 - argv[::-1].index(flag)
    return argv[i + 1]


def test_probe_command_keeps_the_config_and_overrides_schedule_and_batch(tmp_path):
    cfg = load_config(SMALL)
    argv = lr_probe.probe_args(lr_probe.probe_config(cfg, "config"), "DATA", tmp_path, 300, 40, 1536, "cpu", 10)
    # the config's model, optimiser and peak lr ...
    assert _flag(argv, "--arch") == "transformer_man_small" and _flag(argv, "--lr") == "0.007"
    assert _flag(argv, "--optimizer") == "adam" and _flag(argv, "--adam-betas") == "(0.9, 0.98)"
    assert "--encoder-normalize-before" in argv  # the config is pre-norm (authors' code)
    # ... with the probe's schedule and batch winning (they come last)
    assert _flag(argv, "--max-update") == "300" and _flag(argv, "--warmup-updates") == "40"
    assert _flag(argv, "--max-tokens") == "1536" and _flag(argv, "--update-freq") == "1"
    assert "--cpu" in argv and "--no-save" in argv
    gpu = lr_probe.probe_args(cfg, "DATA", tmp_path, 300, 40, None, "cuda", 10)
    assert "--cpu" not in gpu and "--fp16" not in gpu and _flag(gpu, "--max-tokens") == "8192"


def test_norm_is_forced_both_ways():
    cfg = load_config(SMALL)
    post = lr_probe.probe_args(lr_probe.probe_config(cfg, "post"), "D", "s", 10, 2, 1000, "cpu", 5)
    pre = lr_probe.probe_args(lr_probe.probe_config(cfg, "pre"), "D", "s", 10, 2, 1000, "cpu", 5)
    for side in ("encoder", "decoder"):
        assert f"--{side}-normalize-before" not in post and f"--{side}-normalize-before" in pre
    assert post[post.index("--man-norm") + 1] == "post" and pre[pre.index("--man-norm") + 1] == "pre"
    assert cfg["model"]["encoder-normalize-before"] is True  # the loaded config is not modified


def test_parse_log_reads_train_inner_records_only():
    lines = [
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "12.5", "gnorm": "3.2", '
        '"lr": "0.001", "num_updates": "10"}\n',
        '2026-01-01 | INFO | train | {"epoch": 1, "loss": "11.0", "num_updates": "20"}\n',
        '2026-01-01 | INFO | train_inner | {"loss": "nan", "gnorm": "inf", "lr": "0.002", "num_updates": "20"}\n',
        "garbage train_inner { not json\n",
    ]
    recs = lr_probe.parse_log(lines)
    assert recs[0] == {"num_updates": 10.0, "loss": 12.5, "gnorm": 3.2, "lr": 0.001}
    assert len(recs) == 2 and math.isnan(recs[1]["loss"]) and math.isinf(recs[1]["gnorm"])


def _curve(losses, gnorm=1.0):
    return [{"num_updates": 10.0 * (i + 1), "loss": l, "gnorm": gnorm, "lr": 1e-3} for i, l in enumerate(losses)]


def test_verdicts():
    falling = _curve([13, 12.5, 12, 11, 10, 9.5, 9, 8.8, 8.5])
    assert lr_probe.verdict(falling, True, 1.0)[0] == "trains"
    assert lr_probe.verdict(falling, False, 1.0)[0] == "diverges"  # fairseq stopped on NaN/Inf gradients
    assert lr_probe.verdict(_curve([13, 12.9, 13.1, 13, 12.95, 13]), True, 1.0)[0] == "stalls"
    blowup = _curve([13, 11, 9, 8, 8, 9, 11, 12, 13])
    assert lr_probe.verdict(blowup, True, 1.0) == ("diverges", "loss climbed back from 8.33 to 12.00")
    nan = falling[:4] + [{"num_updates": 50.0, "loss": float("nan"), "gnorm": float("nan"), "lr": 1e-3}]
    assert lr_probe.verdict(nan, True, 1.0) == ("diverges", "non-finite loss/gnorm at update 50")
    assert lr_probe.verdict([], True, 1.0)[0] == "diverges"


def test_tiny_probe_end_to_end(toy_data_bin, tmp_path):
    """A real fairseq-train run through the probe (tiny width via the pass-through options)."""
    out = tmp_path / "probe"
    rc = lr_probe.main([SMALL, "--norm", "post", "--updates", "12", "--warmup", "4", "--max-tokens", "500",
                        "--log-interval", "2", "--data", str(toy_data_bin), "--out", str(out), "--min-drop", "0.5",
                        "--", *TINY_MODEL, "--source-lang", "src", "--target-lang", "tgt", "--seed", "3"])
    res = json.loads((out / "probe.json").read_text())
    # seeded and single-threaded: the same curve every time, falling by more than --min-drop
    assert (res["verdict"], rc) == ("trains", 0), res["reason"]
    assert [r["num_updates"] for r in res["records"]] == [2, 4, 6, 8, 10, 12]
    assert res["records"][1]["lr"] == 0.007  # the config's peak lr, reached after the warm-up
    assert "--encoder-normalize-before" not in res["command"] and res["exit_code"] == 0
    assert (out / "loss.png").stat().st_size > 5000
    # re-judging the saved log gives the same curve
    assert lr_probe.main([SMALL, "--norm", "post", "--out", str(out), "--analyse", "--min-drop", "0.5"]) == rc
    assert json.loads((out / "probe.json").read_text())["records"] == res["records"]


def test_a_failure_that_is_not_divergence_is_an_error_not_a_verdict():
    crash = ["2026-01-01 | INFO | fairseq_cli.train | start\n", "Traceback (most recent call last):\n",
             "FileNotFoundError: Dataset not found: train (DATA)\n"]
    assert lr_probe.training_error(crash, [], 1, False, 300) == "fairseq-train failed with exit code 1"
    assert lr_probe.training_error(crash, [], -15, True, 300) == "fairseq-train crashed"
    short = _curve([13, 12, 11])
    assert "stopped at update 30 of 300" in lr_probe.training_error([], short, 0, False, 300)
    assert "no training record" in lr_probe.training_error([], [], 0, False, 300)
    # divergence stays a verdict: fairseq's NaN/Inf error, or non-finite records, whatever the exit code
    nan_stop = ["FloatingPointError: gradients are Nan/Inf\n"]
    assert lr_probe.training_error(nan_stop, short, 1, False, 300) is None
    assert lr_probe.verdict(short, False, 1.0)[0] == "diverges"
    nan = short + [{"num_updates": 40.0, "loss": float("nan"), "gnorm": 1.0, "lr": 1e-3}]
    assert lr_probe.training_error([], nan, 1, False, 300) is None
    assert lr_probe.training_error([], short, -15, True, 300) is None  # time limit: judge what was logged


def test_missing_data_folder_is_a_clear_error_not_divergence(tmp_path, capsys):
    out = tmp_path / "probe"
    rc = lr_probe.main([SMALL, "--updates", "2", "--data", str(tmp_path / "no-such-data"), "--out", str(out),
                        "--", *TINY_MODEL])
    captured = capsys.readouterr()
    assert rc == 2
    assert "DIVERGES" not in captured.out + captured.err and "diverges" not in captured.out + captured.err
    # refused before the output folder is made and fairseq-train started (it once ran and failed there)
    assert captured.err == f"ERROR: --data {tmp_path / 'no-such-data'}: no such folder (a binarized data-bin)\n"
    assert not out.exists()
