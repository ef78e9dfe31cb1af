"""``make smoke``: the recipes end to end on CPU in about a minute, through the user's commands.

1. a small de-en parallel corpus: the first lines of the Multi30k sample in ``../shared/data``
   when it is there, else the synthetic corpus of :mod:`man_recipes.toy_corpus` written as
   ``.de`` / ``.en`` (so the smoke run never needs a download);
2. ``fairseq-preprocess`` (joined dictionary) into ``OUT/data-bin``;
3. ``scripts/train.sh CONFIG --cpu --data OUT/data-bin --run-dir OUT/runs/NAME -- <overrides>``:
   the recipe config with a tiny model and two epochs (the overrides are recorded in run.json);
4. ``scripts/evaluate.sh OUT/runs/NAME --cpu --avg-last 2``;
5. ``scripts/results_table.py --runs OUT/runs --only-finished``: the run appears under
   "Non-standard runs", never beside the paper's number.

Everything is written under ``--out`` (default ``runs/smoke``); a later run removes only what
an earlier smoke run wrote there (see :mod:`man_recipes.workdir`).
"""

import argparse
import gzip
import sys
import time
from pathlib import Path

from man_recipes.config import REPO, load_config
from man_recipes.interrupt import one_line_on_ctrl_c, run_child
from man_recipes.tools import tool_env
from man_recipes.workdir import created, prepare_out_dir
from man_recipes.logging_setup import quiet_logging

SHARED_MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
DEFAULT_CONFIG = "configs/man/t1-iwslt14-man-small.yaml"
# A tiny model and a short schedule on top of the recipe config; every value is a fairseq option.
SMOKE_OVERRIDES = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
    "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--max-tokens", "1024", "--max-epoch", "2", "--warmup-updates", "20", "--lr", "0.002",
    "--log-interval", "1", "--num-workers", "0", "--no-progress-bar",
]


def write_de_en(raw: Path, train: int, valid: int, test: int, source: str):
    """``{train,valid,test}.{de,en}`` under ``raw``; returns a description of the source."""
    raw.mkdir(parents=True, exist_ok=True)
    if source == "multi30k" or (source == "auto" and SHARED_MULTI30K.is_dir()):
        files = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
        sizes = {"train": train, "valid": valid, "test": test}
        for split, name in files.items():
            for lang in ("de", "en"):
                with gzip.open(SHARED_MULTI30K / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                    lines = [next(f).strip().lower() for _ in range(sizes[split])]
                (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return f"first lines of {SHARED_MULTI30K} (Multi30k, lowercased)"
    from man_recipes.toy_corpus import write_corpus

    write_corpus(str(raw), train=train, valid=valid, test=test, src="de", tgt="en")
    return "the synthetic corpus of man_recipes/toy_corpus.py (no ../shared/data/multi30k here)"


def step(title, cmd, env):
    print(f"\n== {title}\n+ " + " ".join(map(str, cmd)), flush=True)
    start = time.time()
    rc = run_child(cmd, env=env).returncode
    if rc != 0:
        raise SystemExit(f"smoke: {title} failed (exit code {rc})")
    print(f"== {title}: done in {time.time() - start:.0f}s", flush=True)


@one_line_on_ctrl_c("make smoke")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "smoke")
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"recipe config (default {DEFAULT_CONFIG})")
    p.add_argument("--corpus", choices=["auto", "multi30k", "synthetic"], default="auto")
    p.add_argument("--train-size", type=int, default=400)
    p.add_argument("--eval-size", type=int, default=40)
    args = p.parse_args(argv)

    cfg = load_config(args.config)
    out = prepare_out_dir(args.out, command="smoke")
    env = tool_env(PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    created(out, "raw")
    source = write_de_en(out / "raw", args.train_size, args.eval_size, args.eval_size, args.corpus)
    print(f"smoke: corpus = {source}", flush=True)

    created(out, "data-bin")
    raw = out / "raw"
    step("fairseq-preprocess", ["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
                                "--trainpref", raw / "train", "--validpref", raw / "valid",
                                "--testpref", raw / "test", "--destdir", out / "data-bin",
                                "--joined-dictionary", "--workers", "1"], env)
    created(out, "runs")
    run_dir = out / "runs" / cfg["name"]
    scripts = REPO / "scripts"
    step("train", ["bash", scripts / "train.sh", cfg["_path"], "--cpu", "--data", out / "data-bin",
                   "--run-dir", run_dir, "--", *SMOKE_OVERRIDES], env)
    step("evaluate", ["bash", scripts / "evaluate.sh", run_dir, "--cpu", "--avg-last", "2"], env)
    created(out, "results.md")
    step("results table", [scripts / "results_table.py", "--runs", out / "runs", "--only-finished",
                           "--out", out / "results.md"], env)
    print(f"\nsmoke: everything is under {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
