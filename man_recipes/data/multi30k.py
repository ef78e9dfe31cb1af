"""Data preparation for Multi30k (WMT16 multimodal translation, task 1, text only).

``data-prep/prepare-multi30k.sh [--from FOLDER] [--src de --tgt en]``: the official raw files
(``data/task1/raw/{train,val,test_2016_flickr}.{de,en}.gz`` of github.com/multi30k/dataset) are
downloaded (resumable, SHA-256 checked) or taken from a folder (plain or ``.gz``; any other
``test_*`` pair there becomes an extra test set), Moses-tokenized with the project's tokenizer,
joint-BPE'd and binarized with fairseq-preprocess. The steps are the shared
:class:`steps.Steps` (idempotent, resumable); the split sizes are checked against the standard
29,000 / 1,014 / 1,000 pairs.

Outputs in ``--dest``: the binarized ``train`` / ``valid`` / ``test`` (= test_2016_flickr) and one
binarized split per extra test set under its own name (``test_2017_flickr.de-en.*``, decoded with
``--gen-subset test_2017_flickr``), the untokenized references ``<split>.raw.<lang>`` for sacreBLEU,
the BPE codes and ``multi30k.json`` (test sets, counts, settings) that scripts/reproduce.sh reads.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.config import REPO
from man_recipes.corpora import MULTI30K
from man_recipes.options import workers
from man_recipes.data import subword
from man_recipes.data.binarize import binarize, learn_and_apply_bpe
from man_recipes.data.dataprep import PrepError, log, read_lines, report_counts, tokenize_lines, write_lines
from man_recipes.data.destination import add_force_option, check_dest, making_record
from man_recipes.data.downloads import fetch
from man_recipes.data.manifest import manifest_path
from man_recipes.data.steps import Steps, check_paths, run_command, work_lock

BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# (our split name, the release's file stem)
STANDARD_SPLITS = [("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")]
LANGS = ("de", "en", "fr", "cs")  # task-1 languages of the release
# SHA-256 of the official .gz files (multi30k/dataset, data/task1/raw, the 2017 release), measured
# on the copies in ../shared/data/multi30k (gzip headers: original names, Dec 21 2017).
OFFICIAL_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


def find_split_file(folder, stem, lang):
    """``folder/stem.lang`` or ``folder/stem.lang.gz`` (searched recursively), or None."""
    for name in (f"{stem}.{lang}", f"{stem}.{lang}.gz"):
        hits = sorted(p for p in Path(folder).rglob(name) if p.is_file())
        if hits:
            return hits[0]
    return None


def extra_test_sets(folder, src, tgt):
    """Stems of the ``test_*`` pairs in ``folder`` other than test_2016_flickr (both sides present)."""
    stems = set()
    for p in Path(folder).rglob(f"test_*.{src}*"):
        stem = p.name.split(f".{src}")[0]
        if p.name in (f"{stem}.{src}", f"{stem}.{src}.gz") and stem != "test_2016_flickr":
            if find_split_file(folder, stem, tgt) is not None:
                stems.add(stem)
    return sorted(stems)


def stage(args, steps):
    """The raw files as {our split name: {lang: path}} (downloads them without ``--from``)."""
    src, tgt = args.src, args.tgt
    if args.from_path:
        folder = Path(args.from_path).expanduser().resolve()
        if not folder.is_dir():
            raise PrepError(f"--from {folder}: expected a folder holding train/val/test_2016_flickr.{{{src},{tgt}}}"
                            "[.gz] (the layout of data/task1/raw in github.com/multi30k/dataset)")
        splits = list(STANDARD_SPLITS) + [(stem, stem) for stem in extra_test_sets(folder, src, tgt)]
        files = {}
        for split, stem in splits:
            files[split] = {}
            for lang in (src, tgt):
                f = find_split_file(folder, stem, lang)
                if f is None:
                    raise PrepError(f"--from {folder}: no {stem}.{lang} or {stem}.{lang}.gz "
                                    "(expected the layout of data/task1/raw in github.com/multi30k/dataset)")
                files[split][lang] = f
        return files

    downloads = steps.work / "downloads"

    def download():
        for _, stem in STANDARD_SPLITS:
            for lang in (src, tgt):
                name = f"{stem}.{lang}.gz"
                fetch(BASE_URL + name, downloads / name, expected_sha256=OFFICIAL_SHA256.get(name),
                      checksum_file=downloads / "SHA256SUMS.json")
    steps.run("download", download)
    return {split: {lang: downloads / f"{stem}.{lang}.gz" for lang in (src, tgt)} for split, stem in STANDARD_SPLITS}


def prepare_multi30k(args):
    """Check the languages and folders, then build the data folder, owning --work meanwhile."""
    if args.src == args.tgt or args.src not in LANGS or args.tgt not in LANGS:
        raise PrepError(f"--src/--tgt must be two different task-1 languages of {LANGS}, "
                        f"got {args.src!r} {args.tgt!r}")
    check_paths(args)
    args.record = making_record(MULTI30K.name, **{"from": str(Path(args.from_path).expanduser().resolve())
                                                  if args.from_path else None},
                                src=args.src, tgt=args.tgt,
                                **({"bpe_merges": args.bpe_merges} if args.subword == "bpe"
                                   else subword.making_options(args)))
    args.record.update(subword=subword.subword_record(args), tokenizer=dict(MULTI30K.tokenizer))
    check_dest(args.dest, args.record, args.force, work=args.work)
    with work_lock(args.work):
        return build_multi30k(args)


def build_multi30k(args):
    src, tgt = args.src, args.tgt
    steps = Steps(args.work)
    files = stage(args, steps)
    raw, tok = steps.work / "raw", steps.work / "tok"
    for d in (raw, tok):
        d.mkdir(exist_ok=True)
    test_sets = [s for s in files if s not in ("train", "valid")]  # "test" first, then the extras

    def read_raw():
        for split, by_lang in files.items():
            sides = {lang: read_lines(path) for lang, path in by_lang.items()}
            if len(sides[src]) != len(sides[tgt]):
                raise PrepError(f"{split}: {by_lang[src]} has {len(sides[src])} lines but {by_lang[tgt]} "
                                f"has {len(sides[tgt])}; the two sides must be line-aligned")
            if not sides[src]:
                raise PrepError(f"{split}: {by_lang[src]} and {by_lang[tgt]} hold no lines; nothing to prepare")
            want = MULTI30K.standard_counts.get(split)
            if want is not None and len(sides[src]) != want and not args.allow_nonstandard_splits:
                raise PrepError(f"{split}: {len(sides[src]):,} pairs in {by_lang[src]}, the standard Multi30k "
                                f"split has {want:,} (incomplete or different files?). Pass "
                                "--allow-nonstandard-splits to prepare them anyway.")
            empty = [i + 1 for i, (s, t) in enumerate(zip(sides[src], sides[tgt])) if not s.strip() or not t.strip()]
            if empty:
                raise PrepError(f"{split}: {len(empty)} empty line(s) (first: line {empty[0]}) in {by_lang[src]} / "
                                f"{by_lang[tgt]}; Multi30k has none: a damaged file?")
            for lang, lines in sides.items():
                write_lines(raw / f"{split}.{lang}", lines)
                log(f"      {split}.{lang}: {len(lines):,} lines from {by_lang[lang]}")
                official = OFFICIAL_SHA256.get(Path(by_lang[lang]).name)
                if official and hashlib.sha256(Path(by_lang[lang]).read_bytes()).hexdigest() != official:
                    log(f"      note: {by_lang[lang]} differs from the official release's file")
    sources = [path for by_lang in files.values() for path in by_lang.values()]
    steps.run("read_raw", read_raw, inputs=sources,
              options={"from": str(args.from_path or BASE_URL), "src": src, "tgt": tgt,
                       "splits": sorted(files), "allow_nonstandard": bool(args.allow_nonstandard_splits)},
              outputs=[raw / f"{split}.{lang}" for split in files for lang in (src, tgt)])

    def tokenize():
        # Captions are clean text: no punctuation normalization and no length cleaning (which
        # would change the standard 29,000 training pairs); case is kept (sacreBLEU is cased).
        for split in files:
            for lang in (src, tgt):
                lines = read_lines(raw / f"{split}.{lang}")
                write_lines(tok / f"{split}.{lang}", tokenize_lines(lines, lang, workers=args.workers,
                                                                    desc=f"{split}.{lang}"))
                if split in test_sets:
                    write_lines(tok / f"{split}.raw.{lang}", lines)  # references for sacreBLEU
    steps.run("tokenize", tokenize, outputs=[tok / f"{split}.{lang}" for split in files for lang in (src, tgt)])

    if args.subword == "sentencepiece":
        prep, codes = subword.learn_and_apply_sentencepiece(steps, tok, src, tgt, args.spm_model_type,
                                                            args.spm_vocab_size, list(files))
    else:
        prep, codes = learn_and_apply_bpe(steps, tok, src, tgt, args.bpe_merges, list(files), args.workers)

    dest = Path(args.dest).absolute()

    def binarize_step():
        # built next to --dest and renamed into place; a --dest data-prep did not make is refused
        references = [tok / f"{split}.raw.{lang}" for split in test_sets for lang in (src, tgt)]
        binarize(prep, dest, src, tgt, workers=args.workers, extra_files=[codes, *references],
                 extra_test_sets=test_sets[1:], record=args.record, force=args.force)
    steps.run("binarize", binarize_step, options={"dest": str(dest)},
              outputs=[dest / f"dict.{src}.txt", dest / f"dict.{tgt}.txt", dest / codes.name,
                       *[dest / f"{split}.{src}-{tgt}.{src}.bin" for split in test_sets[1:]]])

    counts = report_counts(prep, src, tgt, MULTI30K.standard_counts, splits=tuple(files))
    manifest = {
        "dataset": MULTI30K.name, "task": "WMT16 multimodal translation task 1 (text only)",
        "source_lang": src, "target_lang": tgt,
        # binarized split name -> the release's name of that test set
        "test_sets": {split: "test_2016_flickr" if split == "test" else split for split in test_sets},
        "counts": counts, "standard_counts": dict(MULTI30K.standard_counts),
        "nonstandard": any(counts.get(k) != v for k, v in MULTI30K.standard_counts.items()),
        **subword.manifest_options(args, args.bpe_merges), "subword": args.record["subword"],
        "tokenizer": "man_recipes.data.dataprep.tokenize_lines (Moses tokenizer.perl -l LANG, cased)",
        "sources": {split: {lang: str(p) for lang, p in by_lang.items()} for split, by_lang in files.items()},
    }
    manifest_path(dest, MULTI30K.name).write_text(json.dumps(manifest, indent=1) + "\n")
    return counts


@one_line_on_ctrl_c("data-prep/prepare-multi30k.sh")  # the line of an interrupt outside the run's own handler
def main(argv=None):
    p = argparse.ArgumentParser(
        prog="data-prep/prepare-multi30k.sh",
        description="Prepare Multi30k (WMT16 multimodal task 1, text only) for fairseq: download the "
                    "official raw files or take --from FOLDER, Moses tokenization, joint BPE, fairseq-preprocess.")
    p.add_argument("--from", dest="from_path", default=None,
                   help="folder with {train,val,test_2016_flickr}.{SRC,TGT}[.gz] (no download); other "
                        "test_*.{SRC,TGT} pairs there become extra test sets")
    p.add_argument("--src", default=MULTI30K.languages[0])
    p.add_argument("--tgt", default=MULTI30K.languages[1])
    p.add_argument("--work", default=None, help="intermediate files (default data-bin/_work/multi30k.SRC-TGT)")
    p.add_argument("--dest", default=None, help="binarized output (default data-bin/multi30k.SRC-TGT)")
    p.add_argument("--workers", type=workers(), default=1)
    subword.add_options(p, f"joint BPE merges (default {MULTI30K.bpe_merges})")
    p.add_argument("--allow-nonstandard-splits", action="store_true",
                   help="accept split sizes other than "
                        + " / ".join(f"{n:,}" for n in MULTI30K.standard_counts.values()) + " (samples, tests)")
    add_force_option(p)
    args = p.parse_args(argv)
    subword.check_options(p, args)
    if args.subword == "bpe":
        args.bpe_merges = args.bpe_merges or MULTI30K.bpe_merges
    folder = MULTI30K.dest.format(src=args.src, tgt=args.tgt)
    args.work = args.work or str(REPO / "data-bin" / "_work" / folder)
    args.dest = args.dest or str(REPO / "data-bin" / folder)

    def prepare():
        prepare_multi30k(args)
        return args.dest

    return run_command(prepare)


if __name__ == "__main__":
    sys.exit(main())
