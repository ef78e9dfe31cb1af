#!/usr/bin/env python
"""The main job on a built-in default: MAN vs. Transformer, end to end on CPU, no downloads.

    make demo                                 # synthetic corpus (see man_recipes/toy_corpus.py)
    make demo DEMO_ARGS="--data DIR --src de --tgt en"   # your own parallel text

Runs the real pipeline ``fairseq-preprocess -> fairseq-train -> man-average-checkpoints ->
fairseq-generate`` (the average, decode, score and record steps scripts/evaluate.sh and
scripts/reproduce.sh take: man_recipes/evaluation/steps.py) for a small Mask Attention
Network and a Transformer of the same width and parameter budget, then prints (and writes) a
Markdown table with BLEU, parameters and training words/s. ``--data DIR`` expects
``train/valid/test.{SRC,TGT}`` text files, one tokenized sentence per line, aligned by line.

``--out`` is only ever cleaned if the demo created it: it writes a marker file there and, on
a later run, removes only the entries it lists. A non-empty folder without the marker is
refused, and ``--data`` may not lie inside ``--out``.
"""

import argparse
import contextlib
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from man_recipes import textfile  # noqa: E402
from man_recipes.logging_setup import quiet_logging  # noqa: E402
from man_recipes.paths import REPO, USER_DIR  # noqa: E402
from man_recipes.evaluation import steps  # noqa: E402
from man_recipes.options import SEEDS_HELP, generated_pairs, number, seeds, workers  # noqa: E402
from man_recipes.tools import run_tool  # noqa: E402
from man_recipes.workdir import MARKER, created, prepare_out_dir  # noqa: E402,F401
from man_recipes.tables import markdown_table, mean_std, slug  # noqa: E402,F401
from man_recipes.interrupt import one_line_on_ctrl_c  # noqa: E402

# Same width, heads and depth, both pre-norm (as the MAN authors trained, and every study here);
# MAN halves the FFN to keep the parameter count (docs/man.md#sizes-the-halved-ffn).
WIDTH = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--encoder-layers", "2", "--decoder-layers", "2",
         "--encoder-normalize-before", "--decoder-normalize-before"]
MODELS = {
    "Transformer": ["--arch", "transformer", *WIDTH,
                    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256"],
    "MAN (DMAN-SAN-FFN)": ["--arch", "transformer_man_base", *WIDTH,
                           "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128"],
}


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
    """Run a fairseq command, stream selected lines as progress, keep the full log; its output."""
    out = []

    def progress(line):
        out.append(line)
        if show and re.search(show, line):
            print("    " + line.rstrip().split(" | ", 2)[-1][:150], flush=True)

    if run_tool(cmd, logfile, on_line=progress) != 0:
        sys.stderr.write("".join(out[-40:]))
        raise SystemExit(f"demo: command failed (see {logfile}): {' '.join(map(str, cmd[:3]))} ...")
    return "".join(out)


def average(save, n, output, logfile):
    """The average step (:func:`~man_recipes.evaluation.steps.average`) on the last ``n``
    epoch checkpoints in ``save``, its output in ``logfile``."""
    with open(logfile, "w") as f, contextlib.redirect_stdout(f):
        try:
            steps.average(save, n, False, output)
        except steps.AverageError as e:
            raise SystemExit(f"demo: cannot average the checkpoints of {save}: {e} (see {logfile})")


def decode(data_bin, checkpoint, logfile):
    """The decode step (:func:`~man_recipes.evaluation.steps.decode`), beam 4, on the test
    set; (hypotheses, references)."""
    # max length 1.2 x source + 10 (fairseq's default 200 lets an undertrained model ramble); no BPE
    cfg = {"eval": {"beam": 4, "max_len_a": 1.2, "max_len_b": 10, "remove_bpe": ""}}
    try:
        _, _, hyps, refs = steps.decode(cfg, data_bin, checkpoint, "test", "cpu", "fp32", 64, logfile)
    except steps.EvaluateError as e:
        raise SystemExit(f"demo: {e}")
    return hyps, refs


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


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="folder with your own train/valid/test.{SRC,TGT} text")
    p.add_argument("--src", default="src")
    p.add_argument("--tgt", default="tgt")
    p.add_argument("--out", type=Path, default=REPO / "demo-out", help="work folder (default: demo-out/)")
    p.add_argument("--epochs", type=number("--epochs", low=1), default=10)
    p.add_argument("--average", type=number("--average", low=1), default=3, help="average the last N epoch checkpoints")
    p.add_argument("--train-size", type=generated_pairs("--train-size"), default=3000, help="synthetic corpus: training pairs")
    p.add_argument("--eval-size", type=generated_pairs("--eval-size"), default=300, help="synthetic corpus: valid and test pairs each")
    p.add_argument("--threads", type=workers("--threads"), default=2)
    p.add_argument("--seeds", type=seeds, default=None, help="training seeds, as scripts/reproduce.sh takes them: " + SEEDS_HELP
                   .replace("(default %(default)s)", "(default: seed 1 alone); several report mean ± std"))
    p.add_argument("--seed", type=number("--seed", low=1), default=None, help="one training seed S, the same as --seeds S, "
                   "(the synthetic corpus is fixed)")
    return p


def seeds_of(p, args):
    """The training seeds of ``--seeds`` / ``--seed``."""
    if args.seeds is not None and args.seed is not None:
        p.error(f"--seed {args.seed} and --seeds {args.seeds}: give one (--seeds N is seeds 1..N, "
                "--seeds 3,4 that list, --seed S the seed S alone)")
    if args.seed is not None:
        return [args.seed]
    return args.seeds or [1]


def train_and_score(name, model_args, seed, run_tag, data_bin, out, args):
    """Train, average and decode one (model, seed) and score it: (parameters, BLEU, words/s, test
    sentences)."""
    save = out / f"checkpoints_{run_tag}"
    created(out, save.name, f"train_{run_tag}.log", f"average_{run_tag}.log", f"generate_{run_tag}.log")
    log(f"{name}: fairseq-train, {args.epochs} epochs on CPU, seed {seed}")
    started = time.time()
    train_log = run(
        ["fairseq-train", data_bin, "--user-dir", USER_DIR, *model_args, "--share-all-embeddings",
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--dropout", "0.1",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", "512", "--max-epoch", args.epochs, "--save-dir", save,
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
    average(save, args.average, avg, out / f"average_{run_tag}.log")
    log(f"{name}: fairseq-generate (beam 4) on the test set")
    hyps, refs = decode(data_bin, avg, out / f"generate_{run_tag}.log")
    bleu = steps.score(steps.DEMO_METRIC, hyps, refs).bleu["bleu"]
    log(f"{name}, seed {seed}: BLEU {bleu:.2f} on {len(refs)} sentences, "
        f"{words:,.0f} target words trained in {seconds:.1f}s")
    return params, bleu, words / seconds if seconds > 0 else float("nan"), len(refs)


def results_table(rows, seeds, args, seconds):
    """The demo's Markdown table and its note."""
    def cell(values, fmt):
        if len(values) == 1:
            return format(values[0], fmt)
        m, sd = mean_std(values)
        return f"{format(m, fmt)} ± {format(sd, fmt)}"

    table = markdown_table(["model", "arch", "parameters", "test BLEU", "training words/s"],
                           [[name, f"`{arch}`", f"{params:,}", cell(bleus, ".2f"), cell(speeds, ",.0f")]
                            for name, arch, params, bleus, speeds, _ in rows], "llrrr")
    if args.data:
        corpus = f"Corpus: your parallel text in `{args.data}` ({args.src} -> {args.tgt})."
    else:
        corpus = ("Corpus: **synthetic** (`man_recipes/toy_corpus.py`), built so that each target word "
                  "depends only on a 3-word source window: it rewards a locality bias and says nothing "
                  "about natural-language translation.")
    listed = (f"{seeds[0]}..{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1))
              else ", ".join(map(str, seeds)))
    spread = (f"mean ± sample std over seeds {listed}" if len(seeds) > 1
              else f"seed {seeds[0]} (pass --seeds N for mean ± std over seeds 1..N)")
    note = (f"\n{corpus} BLEU: sacreBLEU (tokenize=none) on {rows[0][5]} test sentences after averaging the "
            f"last {args.average} of {args.epochs} epoch checkpoints, beam 4; {spread}. Words/s: target "
            f"words trained (sum over epochs of fairseq's wpb x updates) / wall time of the whole "
            f"fairseq-train command (start-up, validation and checkpoints included), {args.threads} CPU "
            f"threads. Total time {seconds:.0f}s.\n")
    return "\n".join(table) + "\n" + note


@one_line_on_ctrl_c("scripts/demo.py")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = build_parser()
    args = p.parse_args(argv)
    seeds = seeds_of(p, args)
    if args.average > args.epochs:  # there would be fewer epoch checkpoints than that
        p.error(f"--average {args.average}: more than the {args.epochs} epoch(s) of --epochs")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    t0 = time.time()
    if args.data:
        check_user_data(args.data, args.src, args.tgt)
    out = prepare_out_dir(args.out, [args.data], command="demo")
    if args.data:
        raw, src, tgt = args.data, args.src, args.tgt
        log(f"using your parallel text in {raw} ({src} -> {tgt})")
    else:
        from man_recipes.toy_corpus import write_corpus

        raw, src, tgt = out / "raw", "src", "tgt"
        created(out, "raw")
        write_corpus(str(raw), train=args.train_size, valid=args.eval_size, test=args.eval_size)
        log(f"generated the synthetic local-context corpus in {raw} "
            f"({args.train_size} training pairs; rule in man_recipes/toy_corpus.py)")

    data_bin = out / "data-bin"
    created(out, "data-bin", "preprocess.log")
    log("fairseq-preprocess (joined dictionary)")
    run(["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
         "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
         "--destdir", data_bin, "--joined-dictionary", "--workers", "1"], out / "preprocess.log")

    rows = []
    for name, model_args in MODELS.items():
        tag = slug(name.split(" ")[0].lower())
        runs = [train_and_score(name, model_args, seed, tag if len(seeds) == 1 else f"{tag}_seed{seed}",
                                data_bin, out, args) for seed in seeds]
        rows.append((name, model_args[1], runs[0][0], [r[1] for r in runs], [r[2] for r in runs], runs[0][3]))
    text = results_table(rows, seeds, args, time.time() - t0)
    created(out, "results.md")
    steps.record(out / "results.md", text)
    print("\n" + text)
    log(f"table written to {out / 'results.md'}")


if __name__ == "__main__":
    sys.exit(main())
