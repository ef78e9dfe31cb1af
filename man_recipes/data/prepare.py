"""Data preparation for IWSLT14 De-En, WMT14 En-De, CNN/DailyMail and Gigaword.

``python -m man_recipes.data.prepare DATASET [--from PATH] [--work DIR] [--dest DIR]``;
``data-prep/prepare-*.sh`` are thin wrappers. Each dataset follows the standard recipe its
papers used (see docs/reproducing.md); all steps go through :class:`steps.Steps` (idempotent,
resumable).
"""

import argparse
import json
import sys
from pathlib import Path

from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.config import REPO
from man_recipes.corpora import CORPORA, SHARED_ENTRY, corpus
from man_recipes.options import number, workers
from man_recipes.data.moses import lowercase
from man_recipes.data import subword
from man_recipes.data.binarize import bpe_and_binarize
from man_recipes.data.dataprep import (
    PrepError, check_counts, clean_pairs, log, read_lines, read_seg_lines, refuse_blank_references, report_counts,
    split_counts, tokenize_lines, write_lines,
)
from man_recipes.data.destination import add_force_option, check_dest, making_record
from man_recipes.data.downloads import find_file, staged_work
from man_recipes.data.manifest import write_manifest
from man_recipes.data.steps import check_paths, is_ours, run_command, work_lock

# --------------------------------------------------------------------------------- IWSLT14

IWSLT14_URL = "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
IWSLT14_TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                     "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012"]
# fairseq's prepare-iwslt14.sh: grep -v these metadata lines of train.tags.*, sed away the
# <title>/<description> tags (their text stays a training line).
IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")


def iwslt_train_lines(path):
    out = []
    for line in read_lines(path):
        if any(tag in line for tag in IWSLT_DROP):
            continue
        for tag in ("<title>", "</title>", "<description>", "</description>"):
            line = line.replace(tag, "")
        out.append(line)
    return out


def split_every_nth(src, tgt, n=23):
    """fairseq's IWSLT14 split: line numbers (1-based) divisible by ``n`` go to valid."""
    train = ([s for i, s in enumerate(src, 1) if i % n], [t for i, t in enumerate(tgt, 1) if i % n])
    valid = ([s for i, s in enumerate(src, 1) if not i % n], [t for i, t in enumerate(tgt, 1) if not i % n])
    return train, valid


def prepare_iwslt14(args):
    c = corpus("iwslt14")
    src, tgt = c.languages
    steps, roots, tok = staged_work(args, [IWSLT14_URL], c.archives)

    def tokenize_train():
        raw = {lang: iwslt_train_lines(find_file(roots, f"train.tags.de-en.{lang}")) for lang in (src, tgt)}
        if len(raw[src]) != len(raw[tgt]):
            raise PrepError(f"train.tags.de-en.*: {len(raw[src])} German but {len(raw[tgt])} English lines "
                            "(after dropping the <url>/<talkid>/<keywords> lines); the pair does not align")
        sides = {lang: tokenize_lines(raw[lang], lang, workers=args.workers, desc=f"train.{lang}")
                 for lang in (src, tgt)}
        s, t = clean_pairs(sides[src], sides[tgt], 1, args.max_len or c.max_len, 1.5)
        s, t = [lowercase(x) for x in s], [lowercase(x) for x in t]  # lowercase.perl after cleaning
        log(f"      train.tags: {len(sides[src])} pairs, {len(s)} after cleaning")
        (tr_s, tr_t), (va_s, va_t) = split_every_nth(s, t, 23)
        write_lines(tok / f"train.{src}", tr_s)
        write_lines(tok / f"train.{tgt}", tr_t)
        write_lines(tok / f"valid.{src}", va_s)
        write_lines(tok / f"valid.{tgt}", va_t)
    steps.run("tokenize_train", tokenize_train,
              options={"max_len": args.max_len} if args.max_len else None,  # only when given: old stamps stay
              outputs=[tok / f"{s}.{l}" for s in ("train", "valid") for l in (src, tgt)])

    def tokenize_test():
        for lang in (src, tgt):
            lines = []
            for name in IWSLT14_TEST_SETS:
                segs = read_seg_lines(find_file(roots, f"{name}.de-en.{lang}.xml"))
                lines += [seg.replace("\u2019", "'") for seg in segs]
            toks = tokenize_lines(lines, lang, lowercase=True, workers=args.workers, desc=f"test.{lang}")
            write_lines(tok / f"test.{lang}", toks)
    steps.run("tokenize_test", tokenize_test, outputs=[tok / f"test.{l}" for l in (src, tgt)])

    check_counts(split_counts(tok, src, tgt), c.standard_counts, args.allow_nonstandard_splits)
    prep = bpe_and_binarize(args, steps, tok, src, tgt, args.bpe_merges or c.bpe_merges)
    return report_counts(prep, src, tgt)


# ---------------------------------------------------------------------------------- WMT14

WMT14_URLS = [
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "http://data.statmt.org/wmt17/translation-task/dev.tgz",
    "http://statmt.org/wmt14/test-full.tgz",
]
WMT14_CORPORA = ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"]


def prepare_wmt14(args):
    c = corpus("wmt14")
    src, tgt = c.languages
    steps, roots, tok = staged_work(args, WMT14_URLS, c.archives)
    moses = dict(aggressive=True, escape=True, normalize=True, workers=args.workers)

    def tokenize_train():
        for lang in (src, tgt):
            lines = []
            for name in WMT14_CORPORA:
                part = read_lines(find_file(roots, f"{name}.{lang}"))
                log(f"      {name}.{lang}: {len(part)} lines")
                lines += part
            write_lines(tok / f"train.all.{lang}", tokenize_lines(lines, lang, desc=f"train.{lang}", **moses))
    steps.run("tokenize_train", tokenize_train, outputs=[tok / f"train.all.{l}" for l in (src, tgt)])

    def tokenize_dev_test():
        for lang in (src, tgt):
            valid = read_lines(find_file(roots, f"newstest2013.{lang}"))
            write_lines(tok / f"valid.{lang}", tokenize_lines(valid, lang, desc=f"valid.{lang}", **moses))
            kind = "src" if lang == src else "ref"
            test = read_seg_lines(find_file(roots, f"newstest2014-deen-{kind}.{lang}.sgm"))
            write_lines(tok / f"test.raw.{lang}", test)  # reference text for detokenized sacreBLEU
            test = [seg.replace("\u2019", "'") for seg in test]
            write_lines(tok / f"test.{lang}", tokenize_lines(test, lang, aggressive=True, escape=True,
                                                              workers=args.workers, desc=f"test.{lang}"))
    steps.run("tokenize_dev_test", tokenize_dev_test,
              outputs=[tok / f"{s}.{l}" for s in ("valid", "test", "test.raw") for l in (src, tgt)])

    def clean():
        s, t = clean_pairs(read_lines(tok / f"train.all.{src}"), read_lines(tok / f"train.all.{tgt}"),
                           1, args.max_len or c.max_len, 1.5)
        write_lines(tok / f"train.{src}", s)
        write_lines(tok / f"train.{tgt}", t)
    # fairseq cleans after BPE with max 250 subwords; cleaning tokens before BPE with the same
    # bounds keeps the learn-BPE input free of the junk pairs (documented deviation).
    steps.run("clean", clean, options={"max_len": args.max_len or c.max_len},
              outputs=[tok / f"train.{l}" for l in (src, tgt)])

    check_counts(split_counts(tok, src, tgt), c.standard_counts, args.allow_nonstandard_splits)
    prep = bpe_and_binarize(args, steps, tok, src, tgt, args.bpe_merges or c.bpe_merges)
    return report_counts(prep, src, tgt)


# ------------------------------------------------------------------------------- Gigaword

GIGAWORD_URLS = [
    # Rush et al. (2015) release ("sumdata"), as mirrored by the UniLM / OpenNMT recipes.
    ("https://drive.google.com/uc?export=download&id=0B6N7tANPyVeBNmlSX19Ld2xDU1E", "summary.tar.gz"),
]
GIGAWORD_FILES = {  # (folder the file must be in, article file, title file); train/valid may be .gz
    "train": (None, "train.article.txt", "train.title.txt"),
    "valid": (None, "valid.article.filter.txt", "valid.title.filter.txt"),
    # the Gigaword test set of Rush et al.: sumdata/Giga/. DUC2003/ and DUC2004/ hold files of the
    # same names (other test sets), so the folder is part of the match.
    "test": ("Giga", "input.txt", "task1_ref0.txt"),
}


GIGAWORD_TEST_NAME = "Gigaword test (Rush et al. 2015, Giga/)"
GIGAWORD_DEV_NAME = "Gigaword dev set (the release's valid.*.filter.txt as prepared; its loss picks the checkpoints)"


def prepare_gigaword(args):
    c = corpus("gigaword")
    src, tgt = c.languages
    steps, roots, tok = staged_work(args, GIGAWORD_URLS, c.archives)

    def normalize():
        # The release is already tokenized, lowercased, digits -> '#', rare words -> 'UNK' (Rush
        # et al.). Re-tokenizing with Moses would change those references ("'s" -> "&apos;s"),
        # so only whitespace and case are normalized.
        splits, counts = {}, {}
        for split, (folder, art, ttl) in GIGAWORD_FILES.items():
            gz = folder is None
            a = [" ".join(x.lower().split()) for x in read_lines(find_file(roots, art, parent=folder, gz=gz))]
            title_file = find_file(roots, ttl, parent=folder, gz=gz)
            t = [" ".join(x.lower().split()) for x in read_lines(title_file)]
            if len(a) != len(t):
                raise PrepError(f"gigaword {split}: {len(a)} articles ({art}) but {len(t)} titles ({ttl})")
            if split == "test":  # the references ROUGE scores
                refuse_blank_references([f"{title_file} line {i}" for i, x in enumerate(t, 1) if not x], len(t))
            splits[split], counts[split] = (a, t), len(a)
        # the release's sizes, before the empty / over-long training pairs are dropped
        check_counts(counts, c.standard_counts, args.allow_nonstandard_splits)
        for split, (a, t) in splits.items():
            if split == "train":
                a, t = clean_pairs(a, t, 1, args.max_len or c.max_len, ratio=None, factor_separator=False)
            write_lines(tok / f"{split}.{src}", a)
            write_lines(tok / f"{split}.{tgt}", t)
        # ROUGE's references (the release's titles as normalized above; fairseq-generate's targets
        # would show <unk> for an unseen BPE symbol) and the articles (lead baselines) of the test set
        # and of the dev set (uncleaned, as binarized: a checkpoint's ROUGE on it), copied next to the
        # binarized data
        for split in c.raw_splits:
            for lang, lines in zip((src, tgt), splits[split]):
                write_lines(tok / f"{split}.raw.{lang}", lines)
        (tok / "release_counts.json").write_text(json.dumps(counts) + "\n")
    steps.run("normalize", normalize, options={"max_len": args.max_len or c.max_len},
              outputs=[tok / f"{s}.{l}" for s in GIGAWORD_FILES for l in (src, tgt)]
              + [tok / f"{s}.raw.{l}" for s in c.raw_splits for l in (src, tgt)] + [tok / "release_counts.json"])

    merges = args.bpe_merges or c.bpe_merges
    split_counts(tok, src, tgt)  # an empty split is named here, before BPE and binarize
    bpe_and_binarize(args, steps, tok, src, tgt, merges)
    counts = report_counts(tok, src, tgt)
    write_manifest(args.dest, c.name, src, tgt, counts, json.loads((tok / "release_counts.json").read_text()),
                   dict(c.standard_counts), {"test": GIGAWORD_TEST_NAME}, source=str(args.from_path or GIGAWORD_URLS[0][0]),
                   subword=args.record["subword"], dev_sets={"valid": GIGAWORD_DEV_NAME},
                   **subword.manifest_options(args, merges),
                   max_len=args.max_len or c.max_len,
                   tokenizer="none: the release is tokenized, lowercased, digits as '#', rare words as 'UNK' "
                             "(Rush et al. 2015); whitespace and case normalized only")
    return counts


def _shared():
    """The corpora this command prepares, in declaration order."""
    return [c for c in CORPORA.values() if c.entry == SHARED_ENTRY]


def _per_corpus(field):
    """[(value, "NAME and NAME")] of this command's corpora whose ``field`` is set, a run of corpora of one value
    named together (the help texts; NAME: the first word of the display name, "IWSLT14" of "IWSLT14 De-En")."""
    groups = []
    for c in _shared():
        value = getattr(c, field)
        if value is not None:
            if groups and groups[-1][0] == value:
                groups[-1][1].append(c.display.split()[0])
            else:
                groups.append((value, [c.display.split()[0]]))
    return [(value, " and ".join(names)) for value, names in groups]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="data-prep/prepare-*.sh", description="Prepare a corpus for fairseq: download or "
                                "--from, Moses tokenization (tokenizer.perl rules), cleaning, subword-nmt BPE, "
                                "fairseq-preprocess.")
    p.add_argument("dataset", choices=sorted(c.name for c in _shared()))
    p.add_argument("--from", dest="from_path", default=None,
                   help="local archive or folder with the original files (no download)")
    p.add_argument("--work", default=None, help="intermediate files (default data-bin/_work/DATASET)")
    p.add_argument("--dest", default=None, help="binarized output (default data-bin/<standard name>)")
    p.add_argument("--workers", type=workers(), default=1)
    subword.add_options(p, "BPE merges (default " + ", ".join(f"{m} {names}" for m, names in _per_corpus("bpe_merges"))
                        + ")")
    max_len = _per_corpus("max_len")
    p.add_argument("--max-len", type=number("--max-len", low=1), default=None,
                   help=f"cleaning: max tokens per side ({', '.join(names for _, names in max_len)}; default "
                        f"{', '.join(str(n) for n, _ in max_len)})")
    truncating = " and ".join(c.display for c in _shared() if c.truncates)
    p.add_argument("--max-source-tokens", type=int, default=None,
                   help=f"{truncating}: truncate articles to this many tokens (default 400, See et al.; 0 = keep all)")
    p.add_argument("--max-target-tokens", type=int, default=None,
                   help=f"{truncating}: truncate training and validation summaries to this many tokens (test "
                        "references never; default: keep all, as fairseq's BART CNN/DM recipe; See et al. trained "
                        "on 100)")
    p.add_argument("--allow-nonstandard-splits", action="store_true",
                   help="go on when a split's size differs from the standard one (default: error)")
    add_force_option(p)
    args = p.parse_args(argv)
    subword.check_options(p, args)
    c = corpus(args.dataset)
    # an option the dataset's recipe does not read is refused: it would change nothing, with exit status 0
    unread = [flag for flag, dest in (("--max-source-tokens", "max_source_tokens"),
                                      ("--max-target-tokens", "max_target_tokens")) if getattr(args, dest) is not None]
    if not c.truncates and unread:
        p.error(f"{' and '.join(unread)}: {truncating} only; the {args.dataset} recipe cuts no sentence "
                "(--max-len drops longer pairs)")
    if c.max_len is None and args.max_len is not None:
        p.error(f"--max-len: not read by the {c.display} recipe, which drops no pair by length"
                + ("; --max-source-tokens and --max-target-tokens cut articles and summaries" if c.truncates else ""))
    if args.max_source_tokens is None:
        args.max_source_tokens = 400
    if args.max_source_tokens < 0:
        p.error(f"--max-source-tokens {args.max_source_tokens}: must be 0 (keep all) or more")
    if args.max_target_tokens is not None and args.max_target_tokens < 1:
        p.error(f"--max-target-tokens {args.max_target_tokens}: must be 1 or more (leave it out to keep all)")
    args.work = args.work or str(REPO / "data-bin" / "_work" / args.dataset)
    args.dest = args.dest or str(REPO / "data-bin" / c.dest)
    args.record = making_record(args.dataset, **making_options(args))
    # what a user of the folder needs (docs/python-api.md): its subword model and the tokenizer of its text
    # (the corpus's record; CNN/DM from See et al.'s tokenized text has none: :func:`.cnndm.prepare_cnndm` sets it)
    args.record.update(subword=subword.subword_record(args), tokenizer=dict(c.tokenizer))
    return args


def making_options(args):
    """The options that change what ``--dest`` holds (its making record, :mod:`.destination`), with the
    corpus's defaults where not given (a recipe's own fallbacks), so that the record says the same whether
    a default was given or left out."""
    c = corpus(args.dataset)
    options = {"from": str(Path(args.from_path).expanduser().resolve()) if args.from_path else None}
    if args.subword == "bpe":
        options["bpe_merges"] = args.bpe_merges or c.bpe_merges
    options.update(subword.making_options(args))
    if c.max_len is not None:
        options["max_len"] = args.max_len or c.max_len
    if c.truncates:
        options.update(max_source_tokens=args.max_source_tokens, max_target_tokens=args.max_target_tokens)
    return options


def run(argv=None):
    """Prepare one dataset; returns the binarized folder (PrepError on bad input)."""
    args = parse_args(argv)
    check_paths(args)
    check_dest(args.dest, args.record, args.force, work=args.work)
    with work_lock(args.work):
        corpus(args.dataset).prepare_function()(args)
    dest = Path(args.dest).absolute()
    if not (dest.is_dir() and is_ours(dest)):
        raise PrepError(f"{dest} was not produced (internal error: binarize step did not run)")
    return dest


@one_line_on_ctrl_c("data-prep/prepare-*.sh")  # the line of an interrupt outside the run's own handler
def main(argv=None):
    return run_command(lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
