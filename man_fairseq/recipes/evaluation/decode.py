"""The decode step: fairseq-generate on a checkpoint with a config's beam, length penalty, length
limits and n-gram blocking, its output kept in a log and read back as hypotheses and targets.

Called directly by every recipe that decodes: ``scripts/evaluate.sh`` (:mod:`.evaluate`), the
studies (:mod:`..studies.study_eval`) and ``scripts/demo.py``.
"""

import time
from pathlib import Path

from ..tools import run_tool
from ..training.launch import precision_args
from ...paths import USER_DIR


class EvaluateError(RuntimeError):
    """What stops an evaluation; ``main`` prints it as one ``ERROR:`` line (exit status 2)."""


def read_generate_output(text):
    """{id: (hypothesis, target)} from fairseq-generate's H-/T- lines (hypothesis = top beam)."""
    hyps, refs = {}, {}
    for line in text.splitlines():
        if line.startswith("H-"):
            idx, _score, *rest = line[2:].split("\t")
            hyps.setdefault(int(idx), rest[0] if rest else "")
        elif line.startswith("T-"):
            idx, *rest = line[2:].split("\t")
            refs[int(idx)] = rest[0] if rest else ""
    if set(hyps) != set(refs):
        raise EvaluateError(f"generate output has {len(hyps)} hypotheses and {len(refs)} targets")
    ids = sorted(hyps)
    return ids, [hyps[i] for i in ids], [refs[i] for i in ids]


def generate_args(cfg, data, checkpoint, subset, device, precision, batch_size):
    ev = cfg["eval"]
    argv = [str(data), "--user-dir", USER_DIR, "--task", cfg.get("task", "translation"),
            "--path", str(checkpoint), "--gen-subset", subset,
            "--beam", str(ev.get("beam", 5)), "--lenpen", str(ev.get("lenpen", 1.0)),
            "--max-len-a", str(ev.get("max_len_a", 0)), "--max-len-b", str(ev.get("max_len_b", 200)),
            "--batch-size", str(batch_size), "--num-workers", "0"]
    if cfg.get("source_lang"):
        argv += ["--source-lang", cfg["source_lang"], "--target-lang", cfg["target_lang"]]
    train = cfg.get("train") or {}
    if train.get("truncate-source"):
        # sources cut as in training: fairseq-generate refuses a longer one (CNN/DM: 96 of the
        # 13,368 validation articles exceed 512 BPE pieces)
        argv += ["--truncate-source"]
        if train.get("max-source-positions"):
            argv += ["--max-source-positions", str(train["max-source-positions"])]
    if ev.get("min_len"):
        argv += ["--min-len", str(ev["min_len"])]
    if ev.get("no_repeat_ngram_size"):
        argv += ["--no-repeat-ngram-size", str(ev["no_repeat_ngram_size"])]
    if ev.get("remove_bpe", "@@ "):
        argv += ["--remove-bpe", ev.get("remove_bpe", "@@ ")]
    return argv + precision_args(device, precision)


def run_generate(cmd, log_path, total=None, every_s=10.0):
    """Run fairseq-generate, keep its output in ``log_path``, and print how many sentences are
    decoded every ``every_s`` seconds (a large test set takes minutes); returns its output."""
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    start = last = time.time()
    done, lines = 0, []

    def progress(line):
        nonlocal done, last
        lines.append(line)
        if line.startswith("H-"):
            done += 1
        elif " | INFO | " in line or " | WARNING | " in line or "Error" in line:
            print("  " + line.rstrip()[-200:], flush=True)
        if time.time() - last >= every_s:
            last = time.time()
            print(f"  decoded {done:,}" + (f"/{total:,}" if total else "")
                  + f" sentences ({last - start:.0f}s)", flush=True)

    rc = run_tool(cmd, log_path, on_line=progress)
    if rc != 0:
        said = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
        raise EvaluateError(f"{Path(cmd[0]).name} failed (exit code {rc}): {said[-300:]} (its output: {log_path})")
    print(f"  decoded {done:,} sentences in {time.time() - start:.0f}s", flush=True)
    return "".join(lines)


def decode(cfg, data, checkpoint, subset, device, precision, batch_size, log_path, total=None):
    """Decode ``subset`` of ``data`` with ``checkpoint`` as ``cfg['eval']`` says; returns (the
    command, sentence ids, hypotheses, targets)."""
    cmd = ["fairseq-generate"] + generate_args(cfg, data, checkpoint, subset, device, precision, batch_size)
    ids, hyps, refs = read_generate_output(run_generate(cmd, log_path, total))
    return cmd, ids, hyps, refs
