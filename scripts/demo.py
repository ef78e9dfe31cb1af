#!/usr/bin/env python
"""The main job on a built-in default: MAN vs. Transformer, end to end on CPU, no downloads.

    make demo                                 # synthetic corpus (see man_fairseq/toy_corpus.py)
    make demo DEMO_ARGS="--data DIR --src de --tgt en"   # your own parallel text

Runs the real pipeline ``fairseq-preprocess -> fairseq-train -> man-average-checkpoints ->
fairseq-generate`` for a small Mask Attention Network and a Transformer of the same width
and parameter budget, then prints (and writes) a Markdown table with BLEU, parameters and
training words/s. ``--data DIR`` expects ``train/valid/test.{SRC,TGT}`` text files, one
tokenized sentence per line, aligned by line.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "man_fairseq")
BIN = Path(sys.executable).parent

# Same width, heads and depth; MAN halves the FFN to keep the parameter count (SPEC §1).
WIDTH = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--encoder-layers", "2", "--decoder-layers", "2"]
MODELS = {
    "Transformer": ["--arch", "transformer", *WIDTH,
                    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256"],
    "MAN (DMAN-SAN-FFN)": ["--arch", "transformer_man_base", *WIDTH,
                           "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128"],
}


def log(msg):
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, logfile, show=None):
    """Run a fairseq command, stream selected lines as progress, keep the full log."""
    cmd = [str(c) for c in cmd]
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    with open(logfile, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out = []
        for line in proc.stdout:
            f.write(line)
            out.append(line)
            if show and re.search(show, line):
                print("    " + line.rstrip().split(" | ", 2)[-1][:150], flush=True)
        if proc.wait() != 0:
            sys.stderr.write("".join(out[-40:]))
            raise SystemExit(f"demo: command failed (see {logfile}): {' '.join(cmd[:3])} ...")
    return "".join(out)


def check_user_data(data: Path, src: str, tgt: str):
    for split in ("train", "valid", "test"):
        paths = [data / f"{split}.{src}", data / f"{split}.{tgt}"]
        for p in paths:
            if not p.is_file():
                raise SystemExit(f"demo: missing {p} (expected train/valid/test.{{{src},{tgt}}} in {data})")
        n = [sum(1 for _ in open(p, encoding="utf-8")) for p in paths]
        if n[0] != n[1]:
            raise SystemExit(f"demo: {paths[0]} has {n[0]} lines but {paths[1]} has {n[1]}")
        if n[0] == 0:
            raise SystemExit(f"demo: {paths[0]} is empty")
        for p in paths:
            with open(p, encoding="utf-8") as fh:
                empty = [i + 1 for i, line in enumerate(fh) if not line.strip()]
            if empty:
                raise SystemExit(f"demo: {p} has empty lines (first at line {empty[0]}); remove them first")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="folder with your own train/valid/test.{SRC,TGT} text")
    p.add_argument("--src", default="src")
    p.add_argument("--tgt", default="tgt")
    p.add_argument("--out", type=Path, default=REPO / "demo-out", help="work folder (default: demo-out/)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--average", type=int, default=3, help="average the last N epoch checkpoints")
    p.add_argument("--train-size", type=int, default=3000, help="synthetic corpus: training pairs")
    p.add_argument("--eval-size", type=int, default=300, help="synthetic corpus: valid and test pairs each")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import sacrebleu

    from man_fairseq.recipes.evaluate import read_generate_output

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    t0 = time.time()
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if args.data:
        check_user_data(args.data, args.src, args.tgt)
        raw, src, tgt = args.data, args.src, args.tgt
        log(f"using your parallel text in {raw} ({src} -> {tgt})")
    else:
        from man_fairseq.toy_corpus import write_corpus

        raw, src, tgt = out / "raw", "src", "tgt"
        write_corpus(str(raw), train=args.train_size, valid=args.eval_size, test=args.eval_size)
        log(f"generated the synthetic local-context corpus in {raw} "
            f"({args.train_size} training pairs; rule in man_fairseq/toy_corpus.py)")

    data_bin = out / "data-bin"
    log("fairseq-preprocess (joined dictionary)")
    run(["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
         "--destdir", data_bin, "--joined-dictionary", "--workers", "1"], out / "preprocess.log")

    rows = []
    for name, model_args in MODELS.items():
        tag = re.sub(r"\W+", "_", name.split(" ")[0].lower())
        save = out / f"checkpoints_{tag}"
        log(f"{name}: fairseq-train, {args.epochs} epochs on CPU")
        train_log = run(
            ["fairseq-train", data_bin, "--user-dir", USER_DIR, *model_args, "--share-all-embeddings",
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.002",
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200", "--dropout", "0.1",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", "1024", "--max-epoch", args.epochs, "--save-dir", save,
             "--keep-last-epochs", args.average, "--no-progress-bar", "--log-format", "simple",
             "--log-interval", "1000", "--cpu", "--seed", "1", "--num-workers", "0"],
            out / f"train_{tag}.log", show=r"\| (train|valid) \| epoch",
        )
        params = int(re.search(r"num\. shared model params: ([\d,]+)", train_log).group(1).replace(",", ""))
        wps = [float(x) for x in re.findall(r"\| train \| epoch \d+ .*?\| wps ([\d.]+)", train_log)]
        avg = save / "averaged.pt"
        log(f"{name}: averaging the last {args.average} checkpoints")
        run([BIN / "man-average-checkpoints", "--inputs", save, "--num-epoch-checkpoints", args.average,
             "--output", avg], out / f"average_{tag}.log")
        log(f"{name}: fairseq-generate (beam 4) on the test set")
        # max length 1.2 x source + 10 (fairseq's default 200 lets an undertrained model ramble)
        gen = run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", avg, "--beam", "4",
                   "--max-len-a", "1.2", "--max-len-b", "10", "--batch-size", "64", "--cpu"],
                  out / f"generate_{tag}.log")
        _, hyps, refs = read_generate_output(gen)
        bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none")
        rows.append((name, model_args[1], params, bleu.score, sum(wps) / max(len(wps), 1), len(refs)))
        log(f"{name}: BLEU {bleu.score:.2f} on {len(refs)} sentences")

    table = ["| model | arch | parameters | test BLEU | training words/s |", "|---|---|---:|---:|---:|"]
    for name, arch, params, bleu, wps, _ in rows:
        table.append(f"| {name} | `{arch}` | {params:,} | {bleu:.2f} | {wps:,.0f} |")
    note = (f"\nBLEU: sacreBLEU (tokenize=none) on {rows[0][5]} test sentences after averaging the last "
            f"{args.average} of {args.epochs} epoch checkpoints, beam 4. Words/s: fairseq's training wps "
            f"averaged over epochs, {args.threads} CPU threads. Total time {time.time() - t0:.0f}s.\n")
    text = "\n".join(table) + "\n" + note
    (out / "results.md").write_text(text)
    print("\n" + text)
    log(f"table written to {out / 'results.md'}")


if __name__ == "__main__":
    main()
