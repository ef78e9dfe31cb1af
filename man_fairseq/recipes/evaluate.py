"""Evaluate a finished run (``scripts/evaluate.sh RUN``).

1. average the last N checkpoints (``man_fairseq.cli.average_checkpoints``),
2. decode the test set with fairseq-generate and the config's beam / length penalty /
   max length / trigram blocking,
3. score with the paper's metric (see :mod:`man_fairseq.recipes.scoring`),
4. write ``RUN/results.json`` and ``RUN/results.md``.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from .config import REPO, validate
from .launch import USER_DIR, precision_args, visible_gpus
from . import scoring


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


def _run(cmd, log_path):
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    Path(log_path).write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}), see {log_path}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def score(cfg, hyps, refs, data):
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
        return {"metric": metric, "rouge": scoring.rouge(hyps, refs)}
    raise ValueError(metric)


def to_markdown(result):
    lines = [f"# {result['name']}", "", f"- config: `{result['config']}`",
             f"- checkpoint: `{result['checkpoint']}` (average of {len(result['averaged'])}: "
             + ", ".join(Path(p).name for p in result["averaged"]) + ")",
             f"- subset: {result['subset']} ({result['n_sentences']} sentences)", ""]
    paper = result.get("paper_results") or {}
    lines += ["| metric | ours | paper |", "|---|---|---|"]
    for key, value in result["scores"].items():
        lines.append(f"| {key} | {value} | {paper.get(key, '–') if paper.get(key) is not None else '–'} |")
    for key, value in result.get("details", {}).items():
        if isinstance(value, str):
            lines.append(f"\n{key}: {value}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="scripts/evaluate.sh",
                                description="Average the last N checkpoints of RUN, decode, score.")
    p.add_argument("run", help="run directory written by scripts/train.sh (holds config.yaml)")
    p.add_argument("--avg-last", type=int, default=None, help="override eval.avg_last")
    p.add_argument("--subset", default=None, help="override eval.gen_subset (default test)")
    p.add_argument("--data", default=None, help="override the data-bin directory")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16")
    p.add_argument("--batch-size", type=int, default=128)
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

    ckpt_dir = run / "checkpoints"
    try:
        averaged = last_n_checkpoints(str(ckpt_dir), n_avg, by_update)
    except AverageError as e:
        sys.exit(f"cannot average: {e}")
    checkpoint = eval_dir / f"checkpoint_avg{n_avg}.pt"
    from man_fairseq.cli.average_checkpoints import main as average_main

    avg_argv = ["--inputs", str(ckpt_dir),
                "--num-update-checkpoints" if by_update else "--num-epoch-checkpoints", str(n_avg),
                "--output", str(checkpoint)]
    print("+ python -m man_fairseq.cli.average_checkpoints " + " ".join(avg_argv), flush=True)
    try:
        average_main(avg_argv)  # in-process: saves a second fairseq start-up
    except AverageError as e:
        sys.exit(f"cannot average: {e}")

    gen_cmd = ["fairseq-generate"] + generate_args(cfg, data, checkpoint, subset, device,
                                                   args.precision, args.batch_size)
    out = _run(gen_cmd, eval_dir / f"generate-{subset}.txt")
    ids, hyps, refs = read_generate_output(out)
    (eval_dir / f"{subset}.hyp").write_text("\n".join(hyps) + "\n")
    (eval_dir / f"{subset}.ref").write_text("\n".join(refs) + "\n")

    details = score(cfg, hyps, refs, data)
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
    }
    (run / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (run / "results.md").write_text(to_markdown(result))
    print(json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
