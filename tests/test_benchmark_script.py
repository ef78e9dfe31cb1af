"""Smoke test of ``scripts/speed.sh synthetic`` (lab/speed/synthetic.py): the real build/train/decode
path at a tiny width.

No timing assertions (the numbers depend on the machine); it checks that the script runs
fairseq's Transformer and transformer_man_base on the same batches, prints the ratio table,
writes it to --output, and skips an unregistered arch with a message instead of failing.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

from conftest import call_entry_point
from lab.speed.__main__ import main as speed_main

REPO = Path(__file__).resolve().parent.parent


def run_benchmark(*args, timeout=900):
    proc = subprocess.run(
        [sys.executable, "-m", "lab.speed", "synthetic", *map(str, args)], cwd=REPO, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_tiny_width_prints_ratio_table(tmp_path):
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    proc = run_benchmark(
        "--width", "tiny", "--cases", "man", "--iters", "1", "--warmup", "1", "--decode-iters", "1",
        "--decode-sentences", "4", "--threads", "1", "--output", out, "--json", raw,
    )
    table = proc.stdout
    assert out.read_text().strip() == table.strip()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "baseline (tiny)" in rows and "man" in rows, table
    cells = [c.strip() for c in rows["man"].split("|")[1:-1]]
    # model, backend, params, tok/s, ratio, memory, ratio, sent/s, ratio, target, met, kernels, graphs
    assert cells[1] == "transformer_man_base" and cells[2] == "auto"
    assert re.fullmatch(r"\d+\.\d\dM", cells[3])
    train_ratio, decode_ratio = cells[5], cells[9]
    assert re.fullmatch(r"\d+\.\d{3}×", train_ratio) and re.fullmatch(r"\d+\.\d{3}×", decode_ratio), cells
    assert re.fullmatch(r"\d+ MiB", cells[6]), cells
    # CPU: the self-attentions take SDPA with the dispatcher free; fairseq's decoder asks the last
    # cross-attention for its weights (explicit); nothing is compiled
    assert cells[12] == "explicit sdpa / explicit sdpa" and cells[13] == "0", cells

    results = json.loads(raw.read_text())
    base, man = results["baseline:tiny@auto"], results["man:tiny@auto"]
    # the ratio printed is the ratio of the measured rates
    assert abs(float(train_ratio[:-1]) - man["train_tok_s"] / base["train_tok_s"]) < 1e-3
    # both models saw the very same batches
    assert base["batch_tokens"] == man["batch_tokens"] and len(man["batch_tokens"]) == 2
    assert len(man["train_times"]) == 1 and len(man["decode_times"]) == 1
    # they are different models, built through fairseq's task with the plugin
    assert man["params"] != base["params"]
    assert man["train_peak_bytes"] > 0 and base["train_peak_bytes"] > 0
    # decoding ran to the forced length (min_len = max_len_b = 5, plus EOS)
    assert man["decode_hyp_len"] == 6


def test_a_failed_models_row_has_every_column():
    """A model (or its baseline) that failed: its error in the params column, the other cells blank,
    as many columns as the head has (the row once ended in one cell too many)."""
    from lab.speed.synthetic import CASES, baseline_key, case_key, table

    runs = [(CASES["man"], "base", "transformer_man_base", "auto")]
    results = {baseline_key("base", "auto"): {"error": "out of memory"}, case_key("man", "base", "auto"): {}}
    lines, _, _ = table(runs, results, "cpu")
    head, baseline, man = lines[0], lines[2], lines[3]
    for row, name in ((baseline, "baseline (base)"), (man, "man")):
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert len(cells) == len(head.split("|")[1:-1]) == 14, row
        assert cells[0] == name and cells[3] == "error: out of memory" and cells[4:] == [""] * 10, row


def test_unregistered_arch_is_skipped_with_a_message(tmp_path, monkeypatch):
    from lab.speed import synthetic as cli

    monkeypatch.setitem(cli.CASES, "ghost", cli.Case("ghost", "transformer_ghost_{w}"))
    out = tmp_path / "ghost.md"
    cli.main(["--width", "tiny", "--cases", "ghost", "--output", str(out)])
    text = out.read_text()
    assert "transformer_ghost_base is not registered" in text
    assert "no case could run" in text


def test_backends_are_groups_with_their_own_baseline(tmp_path):
    raw = tmp_path / "bench.json"
    proc = run_benchmark(
        "--width", "tiny", "--cases", "man", "--backend", "explicit,flex", "--iters", "1", "--warmup", "1",
        "--decode-iters", "1", "--decode-sentences", "4", "--threads", "1", "--memory-iters", "0", "--json", raw,
    )
    results = json.loads(raw.read_text())
    assert set(results) == {"baseline:tiny@explicit", "man:tiny@explicit", "baseline:tiny@flex", "man:tiny@flex"}
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| man ")]
    assert [r.split("|")[3].strip() for r in rows] == ["explicit", "flex"]
    # the option reached the model: explicit everywhere; flex trains through SDPA on CPU (no flex
    # backward there) and decodes through flex
    assert results["man:tiny@explicit"]["train_kernels"] == ["explicit"]
    assert results["man:tiny@flex"]["train_kernels"] == ["explicit", "sdpa"]
    assert "flex" in results["man:tiny@flex"]["decode_kernels"]


def test_bad_width_and_backend_are_clear_errors():
    # the command itself, run in this process: argument errors need no process of their own, and each
    # new interpreter would pay the torch/fairseq import
    for args, msg in ((["--width", "huge"], "--width: unknown"), (["--backend", "fast"], "--backend: unknown"),
                      (["--width", "tiny,base"], "run it alone")):
        proc = call_entry_point(lambda: speed_main(["synthetic", *args]), args, prog="scripts/speed.sh")
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-2000:]


def test_bad_model_args_are_clear_errors():
    for value, msg in (("--encoder-layers '3", "--model-args: No closing quotation"),
                       ("encoder-layers 3", "--model-args: expected fairseq options starting with --")):
        proc = call_entry_point(lambda: speed_main(["synthetic", "--model-args", value]), [], prog="scripts/speed.sh")
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-2000:]


def test_backend_names_are_the_cores():
    from lab.speed import synthetic
    from man_fairseq.modules import attention_backend

    assert synthetic.ATTENTION_BACKENDS is attention_backend.ATTENTION_BACKENDS  # one list, not a copy


def test_half_precision_is_the_recipes_model_cast(tmp_path):
    """--dtype bf16 measures fairseq-train --bf16: the model itself in bf16, fp32 master weights
    in fairseq's FP16Optimizer, an update that changes the weights (not autocast on fp32 weights)."""
    import torch
    from fairseq.optim import FP16Optimizer

    from lab.speed.model import Built
    from lab.speed.synthetic import TINY_OVERRIDES
    from lab.speed.workers import make_batches, write_dictionary

    spec = {"max_tokens": 128, "seed": 1, "dtype": "bf16", "warmup": 0, "iters": 1, "len_mean": 6.0,
            "len_std": 2.0, "len_max": 12, "decode_sentences": 2}
    write_dictionary(str(tmp_path), 100)
    built = Built(spec, {"label": "man", "arch": "transformer_man_base", "criterion": "label_smoothed_cross_entropy",
                         "extra_args": TINY_OVERRIDES}, str(tmp_path), torch.device("cpu"))
    assert {p.dtype for p in built.model.parameters()} == {torch.bfloat16}
    assert isinstance(built.optimizer, FP16Optimizer)
    before = [p.detach().clone() for p in built.optimizer.fp32_params]
    train, _ = make_batches(spec, built.task.source_dictionary)
    (_, _), loss = built.train_step(train[0])
    # a fresh model predicts near-uniformly: its per-token loss is about ln V nats (V: the dictionary)
    assert abs(loss - math.log(len(built.task.target_dictionary))) < 1.5, loss
    assert built.skipped_updates == 0
    assert all(p.dtype == torch.float32 for p in built.optimizer.fp32_params)
    assert any(not torch.equal(b, p) for b, p in zip(before, built.optimizer.fp32_params))
