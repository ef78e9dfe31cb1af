"""fairseq-train with --fp16 / --bf16 and fairseq-generate on CUDA, every family (issue 13).

Skipped without CUDA. One update per family and precision on the toy corpus, then
fairseq-generate of one trained tiny checkpoint on every attention backend: the hypotheses of
``flex`` / ``sdpa`` / ``auto`` equal those of ``explicit`` (greedy, fp32 generation).
"""

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import TINY_MODEL, USER_DIR, run_cli  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FAMILIES = {
    "man": ["--arch", "transformer_man_base"],
    "localness": ["--arch", "transformer_localness_base", "--localness-attention-types", "encoder_self,decoder_self"],
    "diffwin": ["--arch", "transformer_diffwin_base"],
    "calibration": ["--arch", "transformer_calibrated_base", "--criterion", "calibrated_label_smoothed_cross_entropy"],
}
GPU_TRAIN = [
    "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
    "--label-smoothing", "0.1", "--max-tokens", "1000", "--dropout", "0.1", "--no-progress-bar",
    "--log-interval", "1", "--num-workers", "0", "--seed", "1", "--no-epoch-checkpoints",
    "--user-dir", USER_DIR, "--task", "translation", "--share-all-embeddings",
]


def train(data, save, family, precision, backend="auto", extra=()):
    args = FAMILIES[family]
    criterion = [] if "--criterion" in args else ["--criterion", "label_smoothed_cross_entropy"]
    return run_cli(["fairseq-train", data, "--save-dir", save, *GPU_TRAIN, *TINY_MODEL, *args, *criterion,
                    f"--{precision}", "--attention-backend", backend, *extra], timeout=600)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_train_step_in_half_precision(toy_data_bin, tmp_path, family, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    proc = train(toy_data_bin, tmp_path / "ck", family, precision, extra=["--max-update", "1"])
    losses = [float(x) for x in re.findall(r"\| loss ([\d.]+)", proc.stdout)]
    assert losses and all(x == x and x < 1e4 for x in losses), proc.stdout[-3000:]  # finite
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists()


@pytest.fixture(scope="module")
def trained_man(toy_data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("gpu_man")
    train(toy_data_bin, save, "man", "fp16", backend="flex", extra=["--max-epoch", "3"])
    return save / "checkpoint_best.pt"


def hypotheses(stdout):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", stdout, re.M)}


def test_generate_on_every_backend_agrees(trained_man, toy_data_bin):
    outs = {}
    for backend in ("explicit", "auto", "sdpa", "flex"):
        proc = run_cli(["fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", trained_man,
                        "--beam", "1", "--batch-size", "16", "--gen-subset", "test",
                        "--model-overrides", str({"attention_backend": backend})], timeout=600)
        outs[backend] = hypotheses(proc.stdout)
        assert outs[backend], proc.stdout[-2000:]
    for backend in ("auto", "sdpa", "flex"):
        same = sum(outs[backend][i] == outs["explicit"][i] for i in outs["explicit"])
        # fp32 kernels differ in summation order only: a near-tie may flip a rare token
        assert same >= 0.9 * len(outs["explicit"]), (backend, same, len(outs["explicit"]))


def test_generate_in_half_precision(trained_man, toy_data_bin):
    for flag in ("--fp16", "--bf16"):
        proc = run_cli(["fairseq-generate", toy_data_bin, "--user-dir", USER_DIR, "--path", trained_man,
                        "--beam", "4", "--batch-size", "16", "--gen-subset", "test", flag], timeout=600)
        assert hypotheses(proc.stdout), proc.stdout[-2000:]
