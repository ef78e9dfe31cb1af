"""``scripts/speed.sh synthetic``: the study mode (:mod:`.study`, its records and tables in
``RESULTS/speed/synthetic/``) on random sentences (:func:`write_data`, a joint dictionary of the paper's
size), each family's paper config at a width (:data:`WIDTHS`) against the MAN paper's Transformer config;
``--backend``: every family's ``--attention-backend``, one record each. Method: results/speed/README.md.
"""

import shutil
import sys
import tempfile
from pathlib import Path

from lab.speed import study
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.logging_setup import quiet_logging
from man_fairseq.modules.attention_backend import ATTENTION_BACKENDS
from man_recipes.config import CONFIG_DIR, load_config
from man_recipes.data.manifest import write_manifest
from man_recipes.options import generated_pairs

DATASET = "synthetic"
# each width: the joint dictionary's size (the paper's parameter counts) and {family: paper config}, the
# Transformer first; "tiny" (a smoke test) is the base configs shrunk by TINY_ARGS
WIDTHS = {
    "small": (10000, {"transformer": "man/t1-iwslt14-transformer-small", "man": "man/t1-iwslt14-man-small"}),
    "base": (37000, {"transformer": "man/t1-wmt14-transformer-base", "man": "man/t1-wmt14-man-base",
                     "localness": "localness/t4-base-localness", "diffwin": "diffwin/t1-enc-aw-cr-aw-seg-dec-mw",
                     "calibration": "calibration/t2-anneal"}),
    "big": (37000, {"transformer": "man/t1-wmt14-transformer-big", "man": "man/t1-wmt14-man-big",
                    "localness": "localness/t4-big-localness"}),
}
WIDTHS["tiny"] = (1000, WIDTHS["base"][1])
TINY_ARGS = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
             "--encoder-layers", "3", "--decoder-layers", "3", "--max-tokens", "256", "--update-freq", "1"]
LENGTH = {"mean": 25.0, "std": 10.0, "max": 100}  # tokens per sentence, EOS included; "tiny": TINY_LENGTH
TINY_LENGTH = {"mean": 8.0, "std": 3.0, "max": 100}


def write_data(dest, src, tgt, dict_size, sentences, length=LENGTH, seed=1):
    """A binarized data folder of random sentences (the ``train`` split ``sentences`` pairs, ``valid`` and
    ``test`` a tenth of it, at least one), its record (``synthetic.json``) included: lengths drawn from a
    normal law (``length``: mean, std, max), the target's 0.8-1.25 times the source's."""
    import numpy as np
    import torch
    from fairseq.data import Dictionary, indexed_dataset

    dest, rng = Path(dest), np.random.RandomState(seed)
    dest.mkdir(parents=True, exist_ok=True)
    words = "".join(f"w{i} {dict_size - i}\n" for i in range(dict_size - 4))  # fairseq adds 4 specials
    for lang in (src, tgt):
        (dest / f"dict.{lang}.txt").write_text(words)
    dictionary = Dictionary.load(str(dest / f"dict.{src}.txt"))
    counts = {"train": sentences, "valid": max(1, sentences // 10), "test": max(1, sentences // 10)}
    for split, n in counts.items():
        src_len = np.clip(np.round(rng.normal(length["mean"], length["std"], n)), 2, length["max"]).astype(int)
        tgt_len = np.clip(np.round(src_len * rng.uniform(0.8, 1.25, n)), 2, length["max"]).astype(int)
        for lang, lengths in ((src, src_len), (tgt, tgt_len)):
            prefix = dest / f"{split}.{src}-{tgt}.{lang}"
            builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(dictionary))
            for k in lengths:
                builder.add_item(torch.IntTensor(rng.randint(dictionary.nspecial, len(dictionary), k - 1).tolist()
                                                 + [dictionary.eos()]))
            builder.finalize(f"{prefix}.idx")
    write_manifest(dest, DATASET, src, tgt, counts, counts, {}, {"test": "random sentences"},
                   dict_size=dict_size, length=length, seed=seed)
    return dest


def synthetic_options(p):
    p.add_argument("--width", default="base",
                   help="comma-separated paper widths; tiny (alone): the base configs shrunk, a smoke test. Their "
                        "families: " + "; ".join(f"{w}: {', '.join(c)}" for w, (_, c) in WIDTHS.items() if w != "tiny"))
    p.add_argument("--backend", default="auto",
                   help=f"comma-separated --attention-backend values ({','.join(ATTENTION_BACKENDS)}) of every "
                        "family but the Transformer: one record each")
    p.add_argument("--sentences", type=generated_pairs("--sentences"), default=4000,
                   help="random training pairs (fairseq-train runs more epochs where --updates needs them)")
    return p


def comma_list(p, option, value, known):
    named = [v.strip() for v in value.split(",") if v.strip()]
    if not named or set(named) - set(known):
        p.error(f"{option}: unknown {sorted(set(named) - set(known)) or value!r}; choose from {', '.join(known)}")
    return named


def width_study(width, backend, families, sentences):
    dict_size, configs = WIDTHS[width]
    length = TINY_LENGTH if width == "tiny" else LENGTH
    return {"name": f"synthetic-{width}-{backend}", "dataset": DATASET, "prepare": "lab/speed/synthetic.py write_data",
            "command": f"scripts/speed.sh synthetic --width {width} --backend {backend}",
            "labels": {f: f"{f} ({Path(c).name})" for f, c in configs.items()},
            "configs": {f: CONFIG_DIR / f"{configs[f]}.yaml" for f in families},
            "model": {f: {"attention-backend": backend} for f in families if f != "transformer"},
            "record": {"synthetic": {"width": width, "backend": backend, "dict_size": dict_size,
                                     "sentences": sentences, "length": length}},
            "title": f"Random sentences at the papers' {width} width ({dict_size:,}-symbol joint dictionary), "
                     f"attention backend {backend}: each family's paper config against the Transformer's "
                     f"({configs['transformer']}); decoding: one-update models."}


@one_line_on_ctrl_c("scripts/speed.sh synthetic")  # its parser's prog, under speed.sh and python -m alike
def main(argv=None):
    quiet_logging()
    p = synthetic_options(study.measure_parser("scripts/speed.sh synthetic", "The study mode on random sentences: "
                                               "each family's paper config against the Transformer's."))
    args = study.parse(p, argv)
    widths = comma_list(p, "--width", args.width, WIDTHS)
    if "tiny" in widths and len(widths) > 1:
        p.error("--width tiny is a smoke test: run it alone")
    backends = comma_list(p, "--backend", args.backend, ATTENTION_BACKENDS)
    known = list(dict.fromkeys(f for w in widths for f in WIDTHS[w][1]))  # in the configs' order
    named = comma_list(p, "--families", args.families or ",".join(known), known)
    asked = set(named) - {"transformer"} if args.families else set()
    for width in widths:  # a width with none of the named families would measure the Transformer alone
        if asked and not asked & set(WIDTHS[width][1]):
            p.error(f"--families {args.families}: no paper config at width {width} (its families: "
                    f"{', '.join(WIDTHS[width][1])})")
    if args.width == "tiny":
        args.fairseq_args = TINY_ARGS + args.fairseq_args
    args.runs_dir, args.checkpoint_seed = None, 1  # no trained checkpoint: each family decodes a one-update model
    code, work = 0, Path(tempfile.mkdtemp(prefix="man-fairseq-synthetic-"))
    try:
        for width in widths:
            dict_size, configs = WIDTHS[width]
            baseline = load_config(CONFIG_DIR / f"{configs['transformer']}.yaml")  # its languages are every config's
            args.data = work / width
            if not args.table_only:
                write_data(args.data, baseline["source_lang"], baseline["target_lang"], dict_size, args.sentences,
                           TINY_LENGTH if width == "tiny" else LENGTH)
            families = ["transformer"] + [f for f in configs if f in named and f != "transformer"]
            for backend in backends:
                code = code or study.measure_and_tabulate(args, width_study(width, backend, families, args.sentences),
                                                          Path(args.results_dir).resolve() / "speed" / DATASET)
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
