"""The decode step: fairseq-generate on a checkpoint with a config's beam, length penalty, length
limits and n-gram blocking, its output kept in a log and read back as hypotheses and targets.

Called directly by every recipe that decodes: ``scripts/evaluate.sh`` (:mod:`.evaluate`), the
studies (:mod:`..studies.study_eval`) and ``scripts/demo.py``.
"""

import os
import shlex
import shutil
import time
from pathlib import Path

from man_recipes.data.subword import post_process_args, read_subword
from man_recipes.tools import run_tool
from man_recipes.options import precision_args
from man_recipes.paths import USER_DIR


class EvaluateError(RuntimeError):
    """What stops an evaluation; ``main`` prints it as one ``ERROR:`` line (exit status 2)."""


def top_hypotheses(text):
    """{sentence id: (score, hypothesis)} from fairseq-generate's H- lines (the top beam: the first)."""
    hyps = {}
    for line in text.splitlines():
        if line.startswith("H-"):
            idx, score, *rest = line[2:].split("\t")
            hyps.setdefault(int(idx), (float(score), rest[0] if rest else ""))
    return hyps


def read_generate_output(text, with_targets=True):
    """(ids, hypotheses, targets) from fairseq-generate's H-/T- lines (hypothesis = top beam);
    targets None when decoded ``with_targets=False`` (from the sources alone)."""
    hyps = {i: hyp for i, (_score, hyp) in top_hypotheses(text).items()}
    refs = {}
    for line in text.splitlines():
        if line.startswith("T-"):
            idx, *rest = line[2:].split("\t")
            refs[int(idx)] = rest[0] if rest else ""
    if set(hyps) != set(refs) and (with_targets or refs):
        raise EvaluateError(f"generate output has {len(hyps)} hypotheses and {len(refs)} targets")
    ids = sorted(hyps)
    return ids, [hyps[i] for i in ids], [refs[i] for i in ids] if with_targets else None


def sources_view(data, subset, src, tgt, dest):
    """A data folder ``dest`` holding links to ``data``'s dictionaries and to the source side of
    ``subset`` only. fairseq-generate decodes it without targets, so it checks no target length: a
    reference longer than the model's target positions (CNN/DM validation articles 4,493 and
    11,529: 687 and 1,949 BPE pieces) cannot stop it. Rebuilt at each call (``dest`` is the
    caller's own). Returns ``dest``."""
    data, dest = Path(str(data).split(os.pathsep)[0]).resolve(), Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    # fairseq-preprocess names a pair either way round (fairseq's translation task reads both)
    pair = next((p for p in (f"{src}-{tgt}", f"{tgt}-{src}") if (data / f"{subset}.{p}.{src}.idx").is_file()),
                f"{src}-{tgt}")
    names = [f"dict.{src}.txt", f"dict.{tgt}.txt"] + [f"{subset}.{pair}.{src}.{ext}" for ext in ("bin", "idx")]
    for name in names:
        if not (data / name).is_file():
            raise EvaluateError(f"{data / name}: not found (the binarized {subset} set); check --data")
        os.symlink(data / name, dest / name)
    return dest


def generate_args(cfg, data, checkpoint, subset, device, precision, batch_size, subword=None):
    """fairseq-generate's options. ``subword``: the data folder's subword model (its record's, read
    from ``data`` when not given): its pieces are joined back with the same model (BPE: the config's
    ``eval.remove_bpe``, ``@@ `` by default; sentencepiece: ``--post-process sentencepiece``)."""
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
    argv += post_process_args(subword or read_subword(data), ev.get("remove_bpe", "@@ "))
    return argv + precision_args(device, precision)


def run_generate(cmd, log_path, total=None, every_s=10.0):
    """Run fairseq-generate, keep its output in ``log_path``, and print how many sentences are
    decoded every ``every_s`` seconds (a large test set takes minutes); returns its output."""
    print("+ " + shlex.join(str(c) for c in cmd), flush=True)  # runs as printed
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


def decode(cfg, data, checkpoint, subset, device, precision, batch_size, log_path, total=None, sources_only=False,
           subword=None):
    """Decode ``subset`` of ``data`` with ``checkpoint`` as ``cfg['eval']`` says; returns (the
    command, sentence ids, hypotheses, targets). ``sources_only``: decode the sources alone
    (:func:`sources_view`, beside ``log_path``), for a metric that reads the release's references
    (ROUGE); the targets are then None. ``subword``: the subword model of the data folder ``data`` was
    made from (:func:`..data.subword.read_subword`; by default ``data``'s own record)."""
    subword = subword or read_subword(data)  # before a sources view, which holds no record
    if sources_only:
        data = sources_view(data, subset, cfg["source_lang"], cfg["target_lang"],
                            Path(log_path).parent / f"{subset}-sources")
    cmd = ["fairseq-generate"] + generate_args(cfg, data, checkpoint, subset, device, precision, batch_size,
                                                 subword)
    ids, hyps, refs = read_generate_output(run_generate(cmd, log_path, total), with_targets=not sources_only)
    return cmd, ids, hyps, refs
