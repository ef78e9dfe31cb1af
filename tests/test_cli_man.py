"""MAN through the real fairseq CLIs: train, resume, average, generate/validate/interactive."""

import inspect
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, call_entry_point, run_cli

from man_fairseq.patches import known_warnings
from man_recipes.cli.average_checkpoints import cli_main as average_main

TRAIN = ["fairseq-train", "--user-dir", USER_DIR, "--arch", "transformer_man_base",
         "--share-all-embeddings", *TINY_MODEL, *TINY_TRAIN]
TRAIN.remove("--no-epoch-checkpoints")  # averaging needs epoch checkpoints


@pytest.fixture(scope="module")
def trained_run(toy_data_bin, tmp_path_factory):
    """An 'interrupted' run (stopped after 2 epochs) resumed to 4 epochs."""
    save = tmp_path_factory.mktemp("man_run")
    first = run_cli([*TRAIN, toy_data_bin, "--save-dir", save, "--max-epoch", "2",
                     "--tensorboard-logdir", save / "tensorboard"])
    second = run_cli([*TRAIN, toy_data_bin, "--save-dir", save, "--max-epoch", "4"])
    return save, first.stdout, second.stdout


def _updates(log):
    return [int(x) for x in re.findall(r"num_updates (\d+)", log)]


def test_resume_continues_not_restarts(trained_run):
    save, first, second = trained_run
    done = _updates(first)[-1]
    assert f"Loaded checkpoint {save}/checkpoint_last.pt (epoch 3 @ {done} updates)" in second
    assert "epoch 001" not in second, "the resumed run started again from epoch 1"
    assert _updates(second)[-1] == 2 * done  # two more epochs of the same size
    assert sorted(p.name for p in save.glob("checkpoint[0-9]*.pt")) == [f"checkpoint{i}.pt" for i in range(1, 5)]


def test_tensorboard_logs_and_no_known_noise(trained_run):
    save, first, second = trained_run
    for split in ("train", "valid"):
        events = list((save / "tensorboard" / split).glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 100, split
    assert b"loss" in (save / "tensorboard" / "train").glob("events.out.tfevents.*").__next__().read_bytes()
    # what fairseq prints without a tensorboard writer: at import (fairseq.tasks.text_to_speech, INFO)
    # and for --tensorboard-logdir (fairseq.logging.progress_bar, WARNING); taken from fairseq's
    # source here, so a fairseq that words them otherwise fails this test instead of passing it
    import fairseq.logging.progress_bar
    import fairseq.tasks.text_to_speech

    missing = ["Please install tensorboardX", "tensorboard not found, please install"]
    sources = inspect.getsource(fairseq.tasks.text_to_speech) + inspect.getsource(fairseq.logging.progress_bar)
    assert all(m in sources for m in missing)
    for log in (first, second):
        assert not [m for m in missing if m in log], log[-3000:]
        for message, _ in known_warnings.KNOWN:  # silenced in the fairseq-train process
            assert not re.search(message, log), message


def test_known_warnings_are_silenced_narrowly():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        known_warnings.apply()
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use ...", FutureWarning)
        warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. Use ...", UserWarning)
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then ...", UserWarning)
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated", UserWarning)  # other category
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in seen] == ["`torch.cuda.amp.autocast(args...)` is deprecated",
                                              "something else is deprecated"]


def test_average_generate_validate_interactive(trained_run, toy_data_bin, toy_raw, tmp_path):
    save, _, _ = trained_run
    avg = tmp_path / "avg.pt"
    run_cli(["man-average-checkpoints", "--inputs", save, "--num-epoch-checkpoints", "3", "--output", avg])
    # the average of epochs 2..4 equals the mean of their parameters
    states = [torch.load(save / f"checkpoint{i}.pt", weights_only=False)["model"] for i in (2, 3, 4)]
    averaged = torch.load(avg, weights_only=False)["model"]
    name = "encoder.layers.0.blocks.0.bias_module.distance_bias"
    torch.testing.assert_close(averaged[name], sum(s[name] for s in states) / 3)

    gen = run_cli(["fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", avg,
                   "--beam", "4", "--batch-size", "16", "--cpu"])
    n_test = sum(1 for _ in open(toy_raw / "test.src"))
    assert len(re.findall(r"^H-\d+", gen.stdout, flags=re.M)) == n_test, "every test sentence is translated"
    assert re.search(r"BLEU4 = [\d.]+", gen.stdout)

    val = run_cli(["fairseq-validate", toy_data_bin, "--user-dir", USER_DIR, "--task", "translation", "--path", avg, "--cpu",
                   "--valid-subset", "valid", "--max-tokens", "1000"])
    assert re.search(r"valid on 'valid' subset \| loss [\d.]+", val.stdout)

    bindir = os.path.dirname(sys.executable)
    # 600 s: hang guards only (120 s failed on a loaded 2-core machine, where importing torch and
    # fairseq alone took that long); the same below
    inter = subprocess.run(
        [f"{bindir}/fairseq-interactive", str(toy_data_bin), "--user-dir", USER_DIR, "--path", str(avg),
         "--beam", "2", "--cpu", "-s", "src", "-t", "tgt"],
        input="w1 w2 w3 w4\n", capture_output=True, text=True, timeout=600,
    )
    assert inter.returncode == 0, inter.stderr[-3000:]
    assert re.search(r"^H-0\t", inter.stdout, flags=re.M)


def test_averaging_errors_are_clear(trained_run, tmp_path):
    save, _, _ = trained_run
    # in this process (test_average_generate_validate_interactive runs the console script itself)
    few = call_entry_point(average_main, ["--inputs", save, "--num-epoch-checkpoints", "9", "--output",
                                          tmp_path / "x.pt"], prog="man-average-checkpoints", merge_stderr=True)
    assert few.returncode == 2 and "holds only 4" in few.stdout
    assert not (tmp_path / "x.pt").exists()

    truncated = tmp_path / "checkpoint9.pt"
    truncated.write_bytes((save / "checkpoint4.pt").read_bytes()[:5000])
    bad = call_entry_point(average_main, ["--inputs", truncated, save / "checkpoint4.pt", "--output",
                                          tmp_path / "y.pt"], prog="man-average-checkpoints", merge_stderr=True)
    assert bad.returncode == 2 and f"cannot read checkpoint {truncated}" in bad.stdout
    assert not (tmp_path / "y.pt").exists(), "no half-written output"


def test_checkpoints_load_under_safe_loading(trained_run):
    """torch>=2.6 loads fairseq checkpoints with weights_only=True once the plugin is imported;
    arbitrary classes are still refused."""
    save, _, _ = trained_run
    ckpt = str(save / "checkpoint_last.pt")
    code = (
        "import torch, sys, man_fairseq\n"
        f"s = torch.load({ckpt!r})\n"
        "assert 'model' in s and s['cfg'] is not None\n"
        "import pickle, io\n"
        "class Evil:\n    pass\n"
        "buf = io.BytesIO(); torch.save({'x': Evil()}, buf); buf.seek(0)\n"
        "try:\n    torch.load(buf)\nexcept pickle.UnpicklingError:\n    print('REFUSED')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout
    # without the plugin's allow-list torch refuses the checkpoint (so the test above means something)
    plain = subprocess.run([sys.executable, "-c", f"import torch; torch.load({ckpt!r})"],
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode != 0 and "weights_only" in plain.stderr


def test_unknown_sublayer_is_a_clear_cli_error(toy_data_bin, tmp_path):
    proc = run_cli([*TRAIN, toy_data_bin, "--save-dir", tmp_path, "--max-epoch", "1",
                    "--encoder-sublayers", "dman,sn,ffn"], check=False)
    assert proc.returncode != 0
    # argparse's own error line (the plugin's option types check it when the arguments are parsed)
    assert "--encoder-sublayers: invalid value 'dman,sn,ffn': unknown sublayer(s) ['sn']" in proc.stdout
    assert not list(tmp_path.glob("*.pt"))


def test_missing_data_is_a_clear_cli_error(tmp_path):
    missing = tmp_path / "nope"
    save = tmp_path / "save"
    proc = run_cli([*TRAIN, missing, "--save-dir", save, "--max-epoch", "1"], check=False)
    # the error names the missing data directory itself (not any later failure mentioning it)
    assert proc.returncode != 0
    assert f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}'" in proc.stdout
    assert not list(save.glob("*.pt"))
