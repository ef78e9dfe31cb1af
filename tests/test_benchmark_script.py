"""Smoke test of scripts/benchmark.py: the real build/train/decode path at a tiny width.

No timing assertions (the numbers depend on the machine); it checks that the script runs
fairseq's Transformer and transformer_man_base on the same batches, prints the ratio table,
writes it to --output, and skips an unregistered arch with a message instead of failing.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "benchmark.py"


def run_benchmark(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO, timeout=timeout,
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
    # params, tok/s, ratio, memory, ratio, sent/s, ratio
    assert cells[1] == "transformer_man_base"
    assert re.fullmatch(r"\d+\.\d\dM", cells[2])
    train_ratio, decode_ratio = cells[4], cells[8]
    assert re.fullmatch(r"\d+\.\d{3}×", train_ratio) and re.fullmatch(r"\d+\.\d{3}×", decode_ratio), cells
    assert re.fullmatch(r"\d+ MiB", cells[5]), cells

    results = json.loads(raw.read_text())
    base, man = results["baseline:tiny"], results["man"]
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


def test_unregistered_arch_is_skipped_with_a_message(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import benchmark
    finally:
        sys.path.remove(str(REPO / "scripts"))
    monkeypatch.setitem(benchmark.CASES, "ghost", benchmark.Case("ghost", "transformer_ghost_{w}"))
    out = tmp_path / "ghost.md"
    benchmark.main(["--width", "tiny", "--cases", "ghost", "--output", str(out)])
    text = out.read_text()
    assert "transformer_ghost_base is not registered" in text
    assert "no case could run" in text
