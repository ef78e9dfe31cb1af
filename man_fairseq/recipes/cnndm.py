"""CNN/DailyMail for fairseq (``data-prep/prepare-cnndm.sh``): See et al. (2017)'s non-anonymised
version, from the story archives and URL lists or from a folder of ``{split}.source/.target`` files.
"""

import hashlib
from pathlib import Path

from .binarize import bpe_and_binarize
from .dataprep import (
    PrepError, Steps, check_counts, log, read_lines, report_counts, split_counts, tokenize_lines, write_lines,
)
from .downloads import find_file, stage

# See et al.'s URL lists (all_train.txt, all_val.txt, all_test.txt), in pairs
STANDARD_COUNTS = {"train": 287227, "valid": 13368, "test": 11490}

CNNDM_URLS = [
    "https://huggingface.co/datasets/abisee/cnn_dailymail/resolve/main/data/cnn_stories.tgz",
    "https://huggingface.co/datasets/abisee/cnn_dailymail/resolve/main/data/dailymail_stories.tgz",
    "https://raw.githubusercontent.com/abisee/cnn-dailymail/master/url_lists/all_train.txt",
    "https://raw.githubusercontent.com/abisee/cnn-dailymail/master/url_lists/all_val.txt",
    "https://raw.githubusercontent.com/abisee/cnn-dailymail/master/url_lists/all_test.txt",
]
END_TOKENS = {".", "!", "?", "...", "'", "`", '"', "\u2019", "\u201d", ")"}


def story_to_pair(text):
    """See et al. (2017) make_datafiles.py: article lines, then '@highlight' paragraphs.

    Highlights lacking final punctuation get ' .' (fix_missing_period); returns (article, summary).
    """
    lines = [l.strip() for l in text.splitlines()]
    lines = [l if (not l or l == "@highlight" or l[-1] in END_TOKENS) else l + " ." for l in lines]
    article, highlights, next_is_highlight = [], [], False
    for line in lines:
        if not line:
            continue
        if line.startswith("@highlight"):
            next_is_highlight = True
        elif next_is_highlight:
            highlights.append(line)
        else:
            article.append(line)
    return " ".join(article), " ".join(highlights)


def url_hash(url):
    return hashlib.sha1(url.encode("utf-8")).hexdigest()


def prepare_cnndm(args):
    src, tgt = "source", "target"
    steps = Steps(args.work)
    roots = stage(args, steps, CNNDM_URLS, ["cnn_stories.tgz", "dailymail_stories.tgz"])
    raw, tok = steps.work / "raw", steps.work / "tok"
    raw.mkdir(exist_ok=True)
    tok.mkdir(exist_ok=True)
    split_names = {"train": "train", "valid": "val", "test": "test"}

    def make_splits():
        presplit = find_file(roots, "val.source", required=False) or find_file(roots, "valid.source", required=False)
        if presplit is not None:
            # already one article / one summary per line (BART / HuggingFace export)
            folder = presplit.parent
            for split, short in split_names.items():
                for lang in (src, tgt):
                    f = folder / f"{short}.{lang}"
                    f = f if f.is_file() else folder / f"{split}.{lang}"
                    if not f.is_file():
                        raise PrepError(f"{folder}: has {presplit.name} but no {short}.{lang} / {split}.{lang}")
                    write_lines(raw / f"{split}.{lang}", read_lines(f))
            return
        stories = {}
        for root in roots:
            for p in Path(root).rglob("*.story"):
                stories.setdefault(p.stem, p)
        if not stories:
            raise PrepError("no *.story files and no {val,train,test}.source/.target found: expected "
                            "cnn_stories.tgz + dailymail_stories.tgz + url lists (See et al.)")
        for split, short in split_names.items():
            urls = [u.strip() for u in read_lines(find_file(roots, f"all_{short}.txt")) if u.strip()]
            arts, sums, missing = [], [], []
            for url in urls:
                p = stories.get(url_hash(url))
                if p is None:
                    missing.append(url)
                    continue
                a, s = story_to_pair(p.read_text(encoding="utf-8", errors="replace"))
                arts.append(a)
                sums.append(s)
            if missing:
                raise PrepError(f"{split}: {len(missing)} of {len(urls)} stories listed in all_{short}.txt "
                                f"are missing (first: {missing[0]}); incomplete story archives?")
            write_lines(raw / f"{split}.{src}", arts)
            write_lines(raw / f"{split}.{tgt}", sums)
            log(f"      {split}: {len(arts)} stories")
    steps.run("make_splits", make_splits, outputs=[raw / f"{s}.{l}" for s in split_names for l in (src, tgt)])
    check_counts(split_counts(raw, src, tgt), STANDARD_COUNTS, args.allow_nonstandard_splits, "stories")

    def tokenize():
        for split in split_names:
            s = tokenize_lines(read_lines(raw / f"{split}.{src}"), "en", escape=False, lowercase=True,
                               workers=args.workers, desc=f"{split}.source")
            t = tokenize_lines(read_lines(raw / f"{split}.{tgt}"), "en", escape=False, lowercase=True,
                               workers=args.workers, desc=f"{split}.target")
            if args.max_source_tokens:
                s = [" ".join(x.split()[:args.max_source_tokens]) for x in s]  # See et al.: 400
            if split == "train":
                # empty articles/summaries (114 in the train list) carry no signal; valid/test
                # keep every pair so the standard counts and references hold.
                pairs = [(a, b) for a, b in zip(s, t) if a.strip() and b.strip()]
                s, t = [a for a, _ in pairs], [b for _, b in pairs]
            write_lines(tok / f"{split}.{src}", s)
            write_lines(tok / f"{split}.{tgt}", t)
    steps.run("tokenize", tokenize, options={"max_source_tokens": args.max_source_tokens},
              outputs=[tok / f"{s}.{l}" for s in split_names for l in (src, tgt)])

    bpe_and_binarize(args, steps, tok, src, tgt, args.bpe_merges or 32000)
    return report_counts(tok, src, tgt)
