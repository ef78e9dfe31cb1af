"""Decode one checkpoint on several attention backends and compare the hypotheses.

``python -m lab.decode_paths CONFIG CHECKPOINT [--data DATA] [--subset test] [--backends auto,explicit]``

The check that a model trained on one attention path is an ordinary checkpoint of its family (and that
decoding does not depend on the path): the config's decoding (beam, length limits, n-gram blocking;
``man_recipes.evaluation.decode.generate_args``) of a whole subset on the CPU, once per backend with
``--model-overrides "{'attention_backend': B}"``. Prints how many hypotheses equal the first backend's
and the largest difference of their scores; exit status 1 when a hypothesis differs, 2 on bad input or
when a backend decoded no sentence or other sentences than the first.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from man_recipes.config import ConfigError, load_config
from man_recipes.evaluation.decode import EvaluateError, generate_args, run_generate, top_hypotheses
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.options import batch_size
from man_recipes.paths import output_folder_problem

BACKENDS = ("auto", "sdpa", "flex", "explicit")


def compare(first, other):
    """(identical hypotheses, largest score difference) of two {id: (score, hypothesis)} of the same sentences."""
    same = sum(first[i][1] == other[i][1] for i in first)
    diff = max((abs(first[i][0] - other[i][0]) for i in first), default=0.0)
    return same, diff


def sentence_problem(found):
    """None when every backend decoded the same sentences, at least one; otherwise what differs."""
    (ref, first), *others = found.items()
    if not first:
        return f"{ref} decoded no sentence"
    for backend, other in others:
        if set(other) != set(first):
            return f"{ref} decoded {len(first):,} sentences, {backend} {len(other):,}: not the same ones"
    return None


@one_line_on_ctrl_c("python -m lab.decode_paths")
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab.decode_paths", description=__doc__.split("\n")[0])
    p.add_argument("config", help="the config the checkpoint was trained with (its eval settings decode)")
    p.add_argument("checkpoint")
    p.add_argument("--data", default=None, help="binarized data (default: the config's)")
    p.add_argument("--subset", default="test")
    p.add_argument("--backends", default="auto,explicit", help="comma-separated, the first the reference")
    p.add_argument("--batch-size", type=batch_size(), default=128)
    p.add_argument("--logs", default=None, help="folder for fairseq-generate's outputs (default: a temporary one)")
    args = p.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if len(backends) < 2 or any(b not in BACKENDS for b in backends):
        p.error(f"--backends: two or more of {', '.join(BACKENDS)}")
    if not Path(args.checkpoint).is_file():
        p.error(f"{args.checkpoint}: no such checkpoint")
    if args.logs and (problem := output_folder_problem(args.logs)):
        p.error(f"--logs {args.logs}: {problem}")
    if args.logs and (kept := [b for b in backends if (Path(args.logs) / f"generate-{b}.log").exists()]):
        p.error(f"--logs {args.logs}: holds generate-{kept[0]}.log already; it is not replaced")
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        p.error(str(e))
    data = args.data or cfg.get("data")
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(args.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        found = {}
        try:
            for backend in backends:
                cmd = (["fairseq-generate"] + generate_args(cfg, data, args.checkpoint, args.subset, "cpu", "fp32",
                                                            args.batch_size)
                       + ["--model-overrides", repr({"attention_backend": backend})])
                found[backend] = top_hypotheses(run_generate(cmd, logs / f"generate-{backend}.log"))
        except EvaluateError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return 2
        if problem := sentence_problem(found):
            where = f"their outputs: {logs}/generate-*.log" if args.logs else "--logs keeps fairseq-generate's outputs"
            print(f"ERROR: {problem} ({where})", file=sys.stderr)
            return 2
    ref = backends[0]
    differ = False
    for backend in backends[1:]:
        same, diff = compare(found[ref], found[backend])
        differ |= same != len(found[ref])
        print(f"{backend} against {ref}: {same:,} of {len(found[ref]):,} hypotheses identical, "
              f"largest score difference {diff:.2g}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
