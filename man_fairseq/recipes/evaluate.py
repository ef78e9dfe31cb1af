"""Evaluate a finished run (``scripts/evaluate.sh RUN``).

1. average the last N checkpoints (``man_fairseq.cli.average_checkpoints``),
2. decode the test set with fairseq-generate and the config's beam / length penalty /
   max length / trigram blocking,
3. score with the paper's metric (see :mod:`man_fairseq.recipes.scoring`),
4. write ``RUN/results.json`` and ``RUN/results.md``.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .config import validate
from .launch import USER_DIR, precision_args, visible_gpus
from . import scoring
from .rouge155 import Rouge155Unavailable
from .tools import tool_env
from ..cli.plotting import quiet_logging


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
        raise RuntimeError(f"generate output has {len(hyps)} hypotheses and {len(refs)} targets")
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
    if ev.get("min_len"):
        argv += ["--min-len", str(ev["min_len"])]
    if ev.get("no_repeat_ngram_size"):
        argv += ["--no-repeat-ngram-size", str(ev["no_repeat_ngram_size"])]
    if ev.get("remove_bpe", "@@ "):
        argv += ["--remove-bpe", ev.get("remove_bpe", "@@ ")]
    return argv + precision_args(device, precision)


def _run(cmd, log_path, total=None, every_s=10.0):
    """Run fairseq-generate, keep its output in ``log_path``, and print how many sentences are
    decoded every ``every_s`` seconds (a large test set takes minutes)."""
    env = tool_env(PYTHONUNBUFFERED="1")
    print("+ " + " ".join(cmd), flush=True)
    start = last = time.time()
    done, lines = 0, []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            lines.append(line)
            if line.startswith("H-"):
                done += 1
            elif " | INFO | " in line or " | WARNING | " in line or "Error" in line:
                print("  " + line.rstrip()[-200:], flush=True)
            if time.time() - last >= every_s:
                last = time.time()
                print(f"  decoded {done:,}" + (f"/{total:,}" if total else "")
                      + f" sentences ({last - start:.0f}s)", flush=True)
        rc = proc.wait()
    if rc != 0:
        sys.exit(f"command failed ({rc}), see {log_path}:\n{''.join(lines[-40:])[-3000:]}")
    print(f"  decoded {done:,} sentences in {time.time() - start:.0f}s", flush=True)
    return "".join(lines)


def subset_size(data, subset, src, tgt):
    """Number of sentences in the binarized ``subset`` (None if it cannot be read)."""
    try:
        from fairseq.data import data_utils

        dataset = data_utils.load_indexed_dataset(str(Path(data) / f"{subset}.{src}-{tgt}.{src}"), None)
        return len(dataset) if dataset is not None else None
    except Exception:
        return None


def data_fingerprint(data, subset, src, tgt):
    """SHA-256 of the dictionaries and of the evaluated subset's binarized files, so a result
    can be traced to the exact data it was computed on."""
    out = {}
    names = [f"dict.{src}.txt", f"dict.{tgt}.txt"] + [
        f"{subset}.{src}-{tgt}.{lang}.{ext}" for lang in (src, tgt) for ext in ("idx", "bin")]
    for name in dict.fromkeys(names):
        path = Path(data) / name
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            out[name] = digest.hexdigest()
    return out


def training_progress(checkpoint):
    """(number of updates, completed epochs) recorded in a fairseq checkpoint; None where absent."""
    import torch

    from man_fairseq.checkpoint_compat import register_safe_globals

    register_safe_globals()
    state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    history = state.get("optimizer_history") or [{}]
    train_iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    epoch = train_iterator.get("epoch")  # the epoch to run next or the one interrupted
    return history[-1].get("num_updates"), (epoch - 1 if epoch else None)


def score(cfg, hyps, refs, data, rouge_implementation="rouge155", rouge_order=None):
    metric = cfg["eval"]["metric"]
    tgt = cfg.get("target_lang")
    if metric == "bleu_ci":
        return {"metric": metric, "bleu": scoring.tokenized_bleu(hyps, refs, lowercase=True)}
    if metric == "bleu_wmt":
        out = {"metric": metric,
               "bleu": scoring.tokenized_bleu(hyps, refs, compound=True),
               "bleu_tokenized_no_compound_split": scoring.tokenized_bleu(hyps, refs)}
        detok = scoring.moses_detokenize(hyps, tgt)
        raw_ref_file = Path(data) / f"{cfg['eval'].get('gen_subset', 'test')}.raw.{tgt}"
        if raw_ref_file.is_file():
            raw_refs = raw_ref_file.read_text().splitlines()
            ref_note = f"raw references {raw_ref_file}"
        else:
            # Without the untokenized references (written by data-prep) fall back to detokenized
            # tokenized references and say so: that is not the official sacreBLEU setting.
            raw_refs = scoring.moses_detokenize(refs, tgt)
            ref_note = "Moses-detokenized tokenized references (raw references not found)"
        out["_detok_hyps"] = detok
        out["_raw_refs"] = raw_refs
        out["sacrebleu_references"] = ref_note
        return out
    if metric == "rouge":
        order = rouge_order or cfg["eval"].get("rouge_order", "hyp-ref")
        return {"metric": metric, "rouge_order": order,
                "rouge": scoring.rouge(hyps, refs, implementation=rouge_implementation, order=order)}
    raise ValueError(metric)


def to_markdown(result):
    lines = [f"# {result['name']}", "", f"- config: `{result['config']}`",
             f"- checkpoint: `{result['checkpoint']}` (average of {len(result['averaged'])}: "
             + ", ".join(Path(p).name for p in result["averaged"]) + ")",
             f"- subset: {result['subset']} ({result['n_sentences']} sentences)",
             f"- data: `{result.get('data')}`; {result.get('num_updates')} updates"
             + (f"; fairseq overrides: `{' '.join(result['overrides'])}`" if result.get("overrides") else ""),
             ""]
    paper = result.get("paper_results") or {}
    lines += ["| metric | ours | paper |", "|---|---|---|"]
    for key, value in result["scores"].items():
        lines.append(f"| {key} | {value} | {paper.get(key, '–') if paper.get(key) is not None else '–'} |")
    for key, value in result.get("details", {}).items():
        if isinstance(value, str):
            lines.append(f"\n{key}: {value}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(prog="scripts/evaluate.sh",
                                description="Average the last N checkpoints of RUN, decode, score.")
    p.add_argument("run", help="run directory written by scripts/train.sh (holds config.yaml)")
    p.add_argument("--avg-last", type=int, default=None, help="override eval.avg_last")
    p.add_argument("--subset", default=None, help="override eval.gen_subset (default test)")
    p.add_argument("--data", default=None, help="override the data-bin directory")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--rouge-order", choices=sorted(scoring.ROUGE_ORDERS), default=None,
                   help="which file takes files2rouge's first slot: hyp-ref (default, or eval.rouge_order: "
                        "as the MAN authors and fairseq's BART README call it) or ref-hyp (files2rouge's "
                        "documented order); changes ROUGE-L only")
    p.add_argument("--rouge-implementation", choices=scoring.ROUGE_IMPLEMENTATIONS, default="rouge155",
                   help="rouge155 (default): ROUGE-1.5.5 as files2rouge runs it, needs Perl's XML::Parser; "
                        "rouge-score: Google's reimplementation (ROUGE-L as its rougeLsum), not the papers' numbers")
    p.add_argument("--checkpoint", default=None,
                   help="evaluate this checkpoint file instead of averaging (e.g. RUN/checkpoints/checkpoint_last.pt)")
    args = p.parse_args(argv)

    run = Path(args.run).resolve()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    validate(cfg)
    run_info = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    data = args.data or run_info.get("data") or cfg["data"]
    ev = cfg["eval"]
    subset = args.subset or ev.get("gen_subset", "test")
    n_avg = args.avg_last or ev.get("avg_last", 5)
    by_update = ev.get("avg_by", "epoch") == "update"
    device = "cpu" if args.cpu or visible_gpus() == 0 else "gpu"
    eval_dir = run / "eval"
    eval_dir.mkdir(exist_ok=True)

    from man_fairseq.cli.average_checkpoints import AverageError, last_n_checkpoints
    from man_fairseq.cli.average_checkpoints import main as average_main

    ckpt_dir = run / "checkpoints"
    if args.checkpoint:
        checkpoint = Path(args.checkpoint).resolve()
        if not checkpoint.is_file():
            sys.exit(f"checkpoint not found: {checkpoint}")
        averaged = [str(checkpoint)]
    else:
        try:
            averaged = last_n_checkpoints(str(ckpt_dir), n_avg, by_update)
        except AverageError as e:
            sys.exit(f"cannot average: {e}\nEvaluate fewer with --avg-last K, or one file with "
                     f"--checkpoint {ckpt_dir / 'checkpoint_last.pt'}.")
        checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
        avg_argv = ["--inputs", str(ckpt_dir),
                    "--num-update-checkpoints" if by_update else "--num-epoch-checkpoints", str(n_avg),
                    "--output", str(checkpoint), "--overwrite"]  # eval/ is ours: a rerun replaces it
        print("+ python -m man_fairseq.cli.average_checkpoints " + " ".join(avg_argv), flush=True)
        try:
            average_main(avg_argv)  # in-process: saves a second fairseq start-up
        except AverageError as e:
            sys.exit(f"cannot average: {e}")
    num_updates, epochs_completed = training_progress(checkpoint)

    gen_cmd = ["fairseq-generate"] + generate_args(cfg, data, checkpoint, subset, device,
                                                   args.precision, args.batch_size)
    src, tgt = cfg.get("source_lang"), cfg.get("target_lang")
    total = subset_size(data, subset, src, tgt) if src else None
    out = _run(gen_cmd, eval_dir / f"generate-{subset}.txt", total)
    ids, hyps, refs = read_generate_output(out)
    (eval_dir / f"{subset}.hyp").write_text("\n".join(hyps) + "\n")
    (eval_dir / f"{subset}.ref").write_text("\n".join(refs) + "\n")

    try:
        details = score(cfg, hyps, refs, data, args.rouge_implementation, args.rouge_order)
    except Rouge155Unavailable as e:
        sys.exit(f"cannot score ROUGE with ROUGE-1.5.5: {e}\nThe decoded files are in {eval_dir}; after "
                 "installing, rerun this command (or pass --rouge-implementation rouge-score for "
                 "numbers that are not ROUGE-1.5.5's).")
    metric = details["metric"]
    if metric == "bleu_wmt":
        detok_hyps, raw_refs = details.pop("_detok_hyps"), details.pop("_raw_refs")
        raw_refs = [raw_refs[i] for i in ids] if len(raw_refs) > max(ids) else raw_refs
        (eval_dir / f"{subset}.detok.hyp").write_text("\n".join(detok_hyps) + "\n")
        details["sacrebleu"] = scoring.sacrebleu_detok(detok_hyps, raw_refs)
        scores = {"bleu": details["bleu"]["bleu"], "sacrebleu": details["sacrebleu"]["bleu"]}
        details["sacrebleu_signature"] = details["sacrebleu"]["signature"]
    elif metric == "bleu_ci":
        scores = {"bleu": details["bleu"]["bleu"]}
    else:
        scores = {k: details["rouge"][k] for k in ("rouge1", "rouge2", "rougeL")}
        details["rouge_implementation"] = details["rouge"]["implementation"]

    result = {
        "name": cfg["name"], "config": cfg.get("_path", str(run / "config.yaml")),
        "paper": cfg["paper"], "table": cfg["table"], "row": cfg["row"], "dataset": cfg["dataset"],
        "subset": subset, "n_sentences": len(hyps), "checkpoint": str(checkpoint),
        "averaged": averaged, "generate_command": gen_cmd, "scores": scores,
        "paper_results": cfg.get("paper_results") or {}, "details": details,
        # provenance: what results_table.py needs to tell a paper-comparable run from another
        "data": str(data), "config_data": str(cfg["data"]),
        "data_fingerprint": data_fingerprint(data, subset, src, tgt) if src else {},
        "overrides": run_info.get("overrides"), "num_updates": num_updates,
        "epochs_completed": epochs_completed,
        "world_size": run_info.get("world_size"),
        "effective_batch_tokens": run_info.get("effective_batch_tokens"),
        "paper_effective_batch_tokens": run_info.get("paper_effective_batch_tokens"),
        "run_config": {k: cfg.get(k) for k in ("arch", "model", "train", "batch")},
    }
    (run / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (run / "results.md").write_text(to_markdown(result))
    print(json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
