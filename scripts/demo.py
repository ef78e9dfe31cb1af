#!/usr/bin/env python
"""The main job on a built-in default: MAN vs. Transformer, end to end on CPU, no downloads.

    make demo                                 # synthetic corpus (see man_fairseq/toy_corpus.py)
    make demo DEMO_ARGS="--data DIR --src de --tgt en"   # your own parallel text

Runs the real pipeline ``fairseq-preprocess -> fairseq-train -> man-average-checkpoints ->
fairseq-generate`` for a small Mask Attention Network and a Transformer of the same width
and parameter budget, then prints (and writes) a Markdown table with BLEU, parameters and
training words/s. ``--data DIR`` expects ``train/valid/test.{SRC,TGT}`` text files, one
tokenized sentence per line, aligned by line.

``--out`` is only ever cleaned if the demo created it: it writes a marker file there and, on
a later run, removes only the entries it lists. A non-empty folder without the marker is
refused, and ``--data`` may not lie inside ``--out``.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "man_fairseq")
BIN = Path(sys.executable).parent

sys.path.insert(0, str(REPO))
from man_fairseq.cli.plotting import quiet_logging  # noqa: E402
from man_fairseq.recipes import textfile  # noqa: E402
from man_fairseq.recipes.argtypes import number  # noqa: E402
from man_fairseq.recipes.workdir import MARKER, created, prepare_out_dir  # noqa: E402,F401

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


def mean_std(values):
    """(mean, sample standard deviation; 0 for one value)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def words_trained(train_log):
    """Target words a fairseq-train log trained on: the sum over epochs of wpb x updates."""
    words, last_updates = 0.0, 0
    for line in train_log.splitlines():
        if re.search(r"\| train \| epoch \d+ ", line):
            stats = dict(re.findall(r"\| (\w+) ([\d.]+)", line))
            updates = int(float(stats["num_updates"]))
            words += float(stats["wpb"]) * (updates - last_updates)
            last_updates = updates
    return words


def log(msg):
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, logfile, show=None):
    """Run a fairseq command, stream selected lines as progress, keep the full log."""
    cmd = [str(c) for c in cmd]
    # unbuffered child: its lines (epochs) reach the terminal and the log as they are written
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    with open(logfile, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out = []
        for line in proc.stdout:
            f.write(line)
            f.flush()
            out.append(line)
            if show and re.search(show, line):
                print("    " + line.rstrip().split(" | ", 2)[-1][:150], flush=True)
        if proc.wait() != 0:
            sys.stderr.write("".join(out[-40:]))
            raise SystemExit(f"demo: command failed (see {logfile}): {' '.join(cmd[:3])} ...")
    return "".join(out)


def average(argv, logfile):
    """man-average-checkpoints ARGV in this process, its output in ``logfile`` as ``run`` would
    keep it: a second interpreter would import torch and fairseq again for a second's work."""
    import contextlib
    import traceback

    import man_fairseq  # noqa: F401  (torch and fairseq set up their loggers' streams now, not into the log)
    from man_fairseq.cli.average_checkpoints import cli_main

    cmd = [str(BIN / "man-average-checkpoints"), *map(str, argv)]
    with open(logfile, "w") as f:
        with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                cli_main(cmd[1:])
                code = 0
            except SystemExit as e:
                code = e.code
            except Exception:  # what the command would print before exiting 1
                traceback.print_exc()
                code = 1
    if code:
        sys.stderr.write("".join(Path(logfile).read_text().splitlines(keepends=True)[-40:]))
        raise SystemExit(f"demo: command failed (see {logfile}): {' '.join(cmd[:3])} ...")


def check_user_data(data: Path, src: str, tgt: str):
    for split in ("train", "valid", "test"):
        paths = [data / f"{split}.{src}", data / f"{split}.{tgt}"]
        for p in paths:
            if not p.is_file():
                raise SystemExit(f"demo: missing {p} (expected train/valid/test.{{{src},{tgt}}} in {data})")
        try:
            lines = [textfile.read_lines(p) for p in paths]
        except textfile.NotUtf8Error as e:
            raise SystemExit(f"demo: {e}")
        n = [len(side) for side in lines]
        if n[0] != n[1]:
            raise SystemExit(f"demo: {paths[0]} has {n[0]} lines but {paths[1]} has {n[1]}")
        if n[0] == 0:
            raise SystemExit(f"demo: {paths[0]} is empty")
        for p, side in zip(paths, lines):
            empty = [i + 1 for i, line in enumerate(side) if not line.strip()]
            if empty:
                raise SystemExit(f"demo: {p} has empty lines (first at line {empty[0]}); remove them first")


def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="folder with your own train/valid/test.{SRC,TGT} text")
    p.add_argument("--src", default="src")
    p.add_argument("--tgt", default="tgt")
    p.add_argument("--out", type=Path, default=REPO / "demo-out", help="work folder (default: demo-out/)")
    p.add_argument("--epochs", type=number("--epochs", low=1), default=30)
    p.add_argument("--average", type=number("--average", low=1), default=3, help="average the last N epoch checkpoints")
    p.add_argument("--train-size", type=number("--train-size", low=1), default=3000, help="synthetic corpus: training pairs")
    p.add_argument("--eval-size", type=number("--eval-size", low=1), default=300, help="synthetic corpus: valid and test pairs each")
    p.add_argument("--threads", type=number("--threads", low=1), default=2)
    p.add_argument("--seed", type=int, default=1, help="training seed (the synthetic corpus is fixed)")
    p.add_argument("--seeds", type=number("--seeds", low=1), default=1,
                   help="train each model with seeds SEED..SEED+N-1 and report mean ± std")
    args = p.parse_args(argv)
    if args.average > args.epochs:  # there would be fewer epoch checkpoints than that
        p.error(f"--average {args.average}: more than the {args.epochs} epoch(s) of --epochs")

    import sacrebleu

    from man_fairseq.recipes.evaluate import read_generate_output

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    t0 = time.time()
    if args.data:
        check_user_data(args.data, args.src, args.tgt)
    out = prepare_out_dir(args.out, [args.data], command="demo")
    if args.data:
        raw, src, tgt = args.data, args.src, args.tgt
        log(f"using your parallel text in {raw} ({src} -> {tgt})")
    else:
        from man_fairseq.toy_corpus import write_corpus

        raw, src, tgt = out / "raw", "src", "tgt"
        created(out, "raw")
        write_corpus(str(raw), train=args.train_size, valid=args.eval_size, test=args.eval_size)
        log(f"generated the synthetic local-context corpus in {raw} "
            f"({args.train_size} training pairs; rule in man_fairseq/toy_corpus.py)")

    data_bin = out / "data-bin"
    created(out, "data-bin", "preprocess.log")
    log("fairseq-preprocess (joined dictionary)")
    run(["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
         "--destdir", data_bin, "--joined-dictionary", "--workers", "1"], out / "preprocess.log")

    seeds = list(range(args.seed, args.seed + args.seeds))
    rows = []
    for name, model_args in MODELS.items():
        tag = re.sub(r"\W+", "_", name.split(" ")[0].lower())
        bleus, speeds, params, n_test = [], [], None, None
        for seed in seeds:
            run_tag = tag if args.seeds == 1 else f"{tag}_seed{seed}"
            save = out / f"checkpoints_{run_tag}"
            created(out, save.name, f"train_{run_tag}.log", f"average_{run_tag}.log",
                    f"generate_{run_tag}.log")
            log(f"{name}: fairseq-train, {args.epochs} epochs on CPU, seed {seed}")
            started = time.time()
            train_log = run(
                ["fairseq-train", data_bin, "--user-dir", USER_DIR, *model_args, "--share-all-embeddings",
                 "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.002",
                 "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200", "--dropout", "0.1",
                 "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                 "--max-tokens", "1024", "--max-epoch", args.epochs, "--save-dir", save,
                 "--keep-last-epochs", args.average, "--no-progress-bar", "--log-format", "simple",
                 "--log-interval", "1000", "--cpu", "--seed", seed, "--num-workers", "0"],
                out / f"train_{run_tag}.log", show=r"\| (train|valid) \| epoch",
            )
            params = int(re.search(r"num\. shared model params: ([\d,]+)", train_log).group(1).replace(",", ""))
            # fairseq's own per-epoch wps cannot be summed and its train_wall is rounded to whole
            # seconds per epoch, so time the command: words trained / its wall time.
            seconds = time.time() - started
            words = words_trained(train_log)
            avg = save / "averaged.pt"
            log(f"{name}: averaging the last {args.average} checkpoints")
            average(["--inputs", save, "--num-epoch-checkpoints", args.average, "--output", avg],
                    out / f"average_{run_tag}.log")
            log(f"{name}: fairseq-generate (beam 4) on the test set")
            # max length 1.2 x source + 10 (fairseq's default 200 lets an undertrained model ramble)
            gen = run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", avg, "--beam", "4",
                       "--max-len-a", "1.2", "--max-len-b", "10", "--batch-size", "64", "--cpu"],
                      out / f"generate_{run_tag}.log")
            _, hyps, refs = read_generate_output(gen)
            bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score
            bleus.append(bleu)
            speeds.append(words / seconds if seconds > 0 else float("nan"))
            n_test = len(refs)
            log(f"{name}, seed {seed}: BLEU {bleu:.2f} on {n_test} sentences, "
                f"{words:,.0f} target words trained in {seconds:.1f}s")
        rows.append((name, model_args[1], params, bleus, speeds, n_test))

    def cell(values, fmt):
        if len(values) == 1:
            return format(values[0], fmt)
        m, sd = mean_std(values)
        return f"{format(m, fmt)} ± {format(sd, fmt)}"

    table = ["| model | arch | parameters | test BLEU | training words/s |", "|---|---|---:|---:|---:|"]
    for name, arch, params, bleus, speeds, _ in rows:
        table.append(f"| {name} | `{arch}` | {params:,} | {cell(bleus, '.2f')} | {cell(speeds, ',.0f')} |")
    if args.data:
        corpus = f"Corpus: your parallel text in `{args.data}` ({args.src} -> {args.tgt})."
    else:
        corpus = ("Corpus: **synthetic** (`man_fairseq/toy_corpus.py`), built so that each target word "
                  "depends only on a 3-word source window: it rewards a locality bias and says nothing "
                  "about natural-language translation.")
    spread = (f"mean ± sample std over seeds {seeds[0]}..{seeds[-1]}" if len(seeds) > 1
              else f"seed {seeds[0]} (pass --seeds N for mean ± std)")
    note = (f"\n{corpus} BLEU: sacreBLEU (tokenize=none) on {rows[0][5]} test sentences after averaging the "
            f"last {args.average} of {args.epochs} epoch checkpoints, beam 4; {spread}. Words/s: target "
            f"words trained (sum over epochs of fairseq's wpb x updates) / wall time of the whole "
            f"fairseq-train command (start-up, validation and checkpoints included), {args.threads} CPU "
            f"threads. Total time {time.time() - t0:.0f}s.\n")
    text = "\n".join(table) + "\n" + note
    created(out, "results.md")
    (out / "results.md").write_text(text)
    print("\n" + text)
    log(f"table written to {out / 'results.md'}")


if __name__ == "__main__":
    main()
