"""`man-average-checkpoints` through its real CLI on checkpoints written by fairseq-train:
update-based selection and its upper bound, fp16 inputs, and clear errors for checkpoints of
different models (options, vocabularies) or too few checkpoints."""

import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, call_entry_point, run_cli

from man_recipes.cli.average_checkpoints import cli_main as average_main


def _train(data_bin, save_dir, sublayers, max_update):
    """A few updates of a tiny MAN with an update checkpoint after every update."""
    run_cli(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "transformer_man_small",
             "--encoder-sublayers", sublayers, "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN,
             "--max-update", max_update, "--save-interval-updates", "1", "--save-dir", save_dir])
    return save_dir


@pytest.fixture(scope="module")
def runs(toy_data_bin, tmp_path_factory):
    from man_recipes.toy_corpus import write_corpus

    tmp = tmp_path_factory.mktemp("averaging")
    other_raw = write_corpus(str(tmp / "raw30"), train=100, valid=10, test=10, vocab=30, max_len=8, seed=7)
    other_bin = tmp / "bin30"
    run_cli(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
             "--trainpref", f"{other_raw}/train", "--validpref", f"{other_raw}/valid",
             "--destdir", other_bin, "--joined-dictionary", "--workers", "1"])
    return {
        "sman1": _train(toy_data_bin, tmp / "sman1", "sman1,san,ffn", 3),
        "sman2": _train(toy_data_bin, tmp / "sman2", "sman2,san,ffn", 1),
        "vocab30": _train(other_bin, tmp / "vocab30", "sman1,san,ffn", 1),
    }


def _average(*args, check=True):
    # the console command's entry point in this process (fairseq-train above stays a real run):
    # each of its calls would otherwise pay a new interpreter's torch/fairseq import
    proc = call_entry_point(average_main, args, prog="man-average-checkpoints", merge_stderr=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"man-average-checkpoints failed ({proc.returncode}): {proc.stdout[-6000:]}")
    return proc


def _models(*paths):
    return [torch.load(p, map_location="cpu", weights_only=False)["model"] for p in paths]


def test_update_checkpoints_and_upper_bound(runs, tmp_path):
    d = runs["sman1"]
    out = tmp_path / "avg.pt"
    log = _average("--inputs", d, "--num-update-checkpoints", "2", "--output", out).stdout
    assert "checkpoint_1_3.pt" in log and "checkpoint_1_2.pt" in log and "checkpoint_1_1.pt" not in log
    avg, a, b = _models(out, d / "checkpoint_1_3.pt", d / "checkpoint_1_2.pt")
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(avg[k], (a[k].float() + b[k].float()) / 2)

    log = _average("--inputs", d, "--num-update-checkpoints", "2", "--checkpoint-upper-bound", "2",
                   "--output", out, "--overwrite").stdout
    assert "checkpoint_1_2.pt" in log and "checkpoint_1_1.pt" in log and "checkpoint_1_3.pt" not in log

    proc = _average("--inputs", d, "--num-update-checkpoints", "3", "--checkpoint-upper-bound", "2",
                    "--output", out, check=False)
    assert proc.returncode == 2
    assert "asked to average the last 3 update-based (checkpoint_E_U.pt) checkpoints" in proc.stdout
    assert "holds only 2 at or below --checkpoint-upper-bound 2: checkpoint_1_1.pt, checkpoint_1_2.pt" in proc.stdout
    assert "--checkpoint-upper-bound 2 leaves out the 1 later one(s)" in proc.stdout  # not "train longer"
    # with named files there is nothing to bound: refused, not ignored
    proc = _average("--inputs", d / "checkpoint_1_3.pt", "--checkpoint-upper-bound", "2", "--output", out, check=False)
    assert (proc.returncode, proc.stdout) == (2, "ERROR: --checkpoint-upper-bound needs --num-epoch-checkpoints "
                                                 "or --num-update-checkpoints\n")

    # no epoch checkpoints: the run stopped mid-epoch; the message says so and lists what is there
    proc = _average("--inputs", d, "--num-epoch-checkpoints", "1", "--output", out, check=False)
    assert proc.returncode == 2
    assert "holds only 0" in proc.stdout and "checkpoint_last.pt" in proc.stdout
    assert "ended before its first epoch" in proc.stdout


def test_fp16_inputs_are_averaged_in_fp32(runs, tmp_path):
    d = runs["sman1"]
    halves = []
    for name in ("checkpoint_1_2.pt", "checkpoint_1_3.pt"):
        state = torch.load(d / name, map_location="cpu", weights_only=False)
        state["model"] = {k: v.half() if v.is_floating_point() else v for k, v in state["model"].items()}
        torch.save(state, tmp_path / name)
        halves.append(state["model"])
    out = tmp_path / "avg16.pt"
    _average("--inputs", tmp_path / "checkpoint_1_2.pt", tmp_path / "checkpoint_1_3.pt", "--output", out)
    (avg,) = _models(out)
    for k, v in halves[0].items():
        if v.is_floating_point():
            assert avg[k].dtype == torch.float32
            torch.testing.assert_close(avg[k], (v.float() + halves[1][k].float()) / 2)
    # a mix of fp16 and fp32 copies of the same model is the same model
    _average("--inputs", tmp_path / "checkpoint_1_2.pt", d / "checkpoint_1_3.pt", "--output", out, "--overwrite")


def test_different_models_are_refused(runs, tmp_path):
    out = tmp_path / "avg.pt"
    # same parameter names and shapes, different MAN sublayers: the option is named
    proc = _average("--inputs", runs["sman1"] / "checkpoint_1_1.pt", runs["sman2"] / "checkpoint_1_1.pt",
                    "--output", out, check=False)
    assert proc.returncode == 2, proc.stdout
    assert "is a different model than" in proc.stdout
    assert "option encoder_sublayers = 'sman2,san,ffn' vs 'sman1,san,ffn'" in proc.stdout
    assert not out.exists()

    # same options, different dictionaries: the first parameter whose shape differs is named
    proc = _average("--inputs", runs["sman1"] / "checkpoint_1_1.pt", runs["vocab30"] / "checkpoint_1_1.pt",
                    "--output", out, check=False)
    assert proc.returncode == 2, proc.stdout
    assert "encoder.embed_tokens.weight has shape" in proc.stdout
    assert "different dictionaries" in proc.stdout
    assert "RuntimeError" not in proc.stdout and not out.exists()


def test_missing_and_corrupt_inputs(runs, tmp_path):
    out = tmp_path / "avg.pt"
    proc = _average("--inputs", tmp_path / "nope.pt", "--output", out, check=False)
    assert proc.returncode == 2 and "checkpoint file(s) not found" in proc.stdout
    bad = tmp_path / "truncated.pt"
    bad.write_bytes((runs["sman1"] / "checkpoint_1_1.pt").read_bytes()[:1000])
    proc = _average("--inputs", runs["sman1"] / "checkpoint_1_1.pt", bad, "--output", out, check=False)
    assert proc.returncode == 2 and f"cannot read checkpoint {bad}" in proc.stdout
    assert not out.exists()


def test_output_may_not_overwrite_an_input(runs):
    d = runs["sman1"]
    before = (d / "checkpoint_1_3.pt").read_bytes()
    proc = _average("--inputs", d / "checkpoint_1_2.pt", d / "checkpoint_1_3.pt",
                    "--output", d / "checkpoint_1_3.pt", check=False)
    assert proc.returncode == 2 and "is one of the inputs" in proc.stdout
    assert (d / "checkpoint_1_3.pt").read_bytes() == before


def test_one_checkpoint_given_twice_is_refused_not_averaged(tmp_path, capsys):
    # it was "averaged": the mean of a file and itself, written with exit status 0
    ckpt = tmp_path / "checkpoint1.pt"
    ckpt.write_bytes(b"never read: refused before loading")
    out, again = tmp_path / "avg.pt", f"{tmp_path}/./checkpoint1.pt"  # the same file, spelt otherwise
    with pytest.raises(SystemExit) as e:
        average_main(["--inputs", str(ckpt), again, "--output", str(out)])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"ERROR: {again} is given twice (also as {ckpt}); each checkpoint is averaged once\n"
    assert not out.exists()
