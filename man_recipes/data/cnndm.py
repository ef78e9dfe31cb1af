"""CNN/DailyMail for fairseq (``data-prep/prepare-cnndm.sh``): See et al. (2017)'s non-anonymised
version, from whichever of its layouts ``--from`` holds (or the story archives, downloaded):

* ``see-text``: See et al.'s tokenized text files, one pair a line, ``{split}.article.txt[.gz]`` and
  ``{split}.abstract.tagged.txt[.gz]`` (sentences in ``<s> … </s>`` tags). Splits ``train, val,
  test`` are read as train, valid, test; ``train, dev, val`` (the ``cnndm-see`` sample, whose test
  split is absent) as train, valid and test = See et al.'s *validation* split, which the record says;
* ``see-bin``: their ``finished_files/{split}.bin`` or ``chunked/{split}_NNN.bin`` (:mod:`see_bin`);
* ``presplit``: ``{train,val,test}.source/.target``, one raw article / summary a line;
* ``stories``: ``cnn_stories.tgz`` + ``dailymail_stories.tgz`` and the URL lists ``all_*.txt``.

The first two are tokenized and lowercased already and are not tokenized again (see
:func:`see_target` for what is done to them); the last two go through Moses, as before. Every
layout ends with BPE, fairseq-preprocess and the record ``<dest>/cnndm.json``.
"""

import contextlib
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from man_recipes.data import see_bin, subword
from man_recipes.atomic import replacing
from man_recipes.corpora import corpus
from man_recipes.data.binarize import bpe_and_binarize
from man_recipes.data.dataprep import (
    PrepError, check_counts, log, read_lines, read_text, refuse_blank_references, report_counts, split_counts,
    tokenize_lines, write_lines,
)
from man_recipes.data.downloads import find_file, staged_work
from man_recipes.data.manifest import write_manifest

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


SPLITS = ("train", "valid", "test")
SEE_KINDS = ("article.txt", "abstract.tagged.txt")  # See et al.'s text files: {split}.{kind}[.gz]
SEE_TOKENIZER = ("none: See et al.'s release is PTB-tokenized (Stanford CoreNLP) and lowercased; the text is kept "
                 "as released, whitespace normalized")
SEE_SENTENCES = ("the abstract's <s> ... </s> sentences joined by spaces, tags removed; a sentence whose last token "
                 "is not '.' gets ' .' so that ROUGE (files2rouge: sentences end at ' .') ends it where the tags do")


@dataclass
class Layout:
    """What ``--from`` (or the download) holds and how its splits map onto train / valid / test."""
    kind: str            # see-text, see-bin, presplit or stories
    describe: str        # for the log and the record
    test_name: str       # the record's name of the test set
    files: dict = field(default_factory=dict)  # {split: [files read]}
    folder: Path = None


def find_see_text(roots):
    """The See et al. text-file layout under ``roots`` (a :class:`Layout`), or None."""
    hits = sorted(p for root in roots if Path(root).is_dir() for pattern in ("*.abstract.tagged.txt",
                  "*.abstract.tagged.txt.gz") for p in Path(root).rglob(pattern) if p.is_file())
    if not hits:
        return None
    folder = hits[0].parent

    def files(name):  # plain text first, then .gz
        found = [next((p for p in (folder / f"{name}.{kind}", folder / f"{name}.{kind}.gz") if p.is_file()), None)
                 for kind in SEE_KINDS]
        return found if all(found) else None
    have = {name: files(name) for name in ("train", "dev", "val", "test")}
    if have["test"] or not have["dev"]:
        names, describe = ("train", "val", "test"), "train -> train, val -> valid, test -> test"
        describe += " (dev.* not read)" if have["dev"] else ""
        test_name = "CNN/DM test split (See et al. 2017, non-anonymised)"
    else:  # cnndm-see: no test split; its validation split is the test set, dev the validation set
        names, describe = ("train", "dev", "val"), ("train -> train, dev -> valid, val -> test "
                                                    "(the standard validation split as test set)")
        test_name = "CNN/DM standard validation split (See et al. 2017, non-anonymised), used as test"
    missing = [n for n in names if not have[n]]
    if missing:
        raise PrepError(f"{folder}: has {hits[0].name} but no {missing[0]}.article.txt[.gz] and "
                        f"{missing[0]}.abstract.tagged.txt[.gz]; expected the splits train, val, test (See et al.) "
                        "or train, dev, val (cnndm-see: dev the validation split, val the test set)")
    return Layout("see-text", f"See et al.'s text files in {folder}: {describe}", test_name,
                  {split: have[name] for split, name in zip(SPLITS, names)}, folder)


def find_see_bin(roots):
    """See et al.'s ``.bin`` release under ``roots`` (whole files before chunks), or None."""
    folders = sorted({p.parent for root in roots if Path(root).is_dir() for p in Path(root).rglob("*.bin")
                      if re.match(r"^(train|val|test)(_\d+)?\.bin$", p.name)})
    if not folders:
        return None
    found = [(folder, see_bin.split_files(folder)) for folder in folders]
    for folder, files in found:
        if len(files) == len(see_bin.SPLITS):
            return Layout("see-bin", f"See et al.'s .bin files in {folder}: train -> train, val -> valid, test -> test",
                          "CNN/DM test split (See et al. 2017, non-anonymised)",
                          {split: files[name] for split, name in zip(SPLITS, see_bin.SPLITS)}, folder)
    folder, files = max(found, key=lambda f: len(f[1]))
    missing = [s for s in see_bin.SPLITS if s not in files]
    raise PrepError(f"{folder}: See et al. .bin files for {', '.join(files)} but none for {', '.join(missing)} "
                    f"(expected {missing[0]}.bin or {missing[0]}_000.bin, ...)")


def find_layout(roots):
    """The layout under ``roots``: See et al.'s text files, their .bin files, a presplit folder, or stories."""
    layout = find_see_text(roots) or find_see_bin(roots)
    if layout is not None:
        return layout
    presplit = find_file(roots, "val.source", required=False) or find_file(roots, "valid.source", required=False)
    if presplit is not None:  # one raw article / summary a line (BART / Hugging Face export)
        return Layout("presplit", f"one article / summary a line in {presplit.parent}: "
                      "{train,val,test}.source/.target", "CNN/DM test split (test.source/.target as given)",
                      folder=presplit.parent)
    return Layout("stories", "See et al.'s story archives (cnn_stories.tgz, dailymail_stories.tgz) and URL lists "
                  "all_{train,val,test}.txt", "CNN/DM test split (See et al. 2017 URL list all_test.txt)")


# ------------------------------------------------------------------ See et al.'s layouts

TAGGED = re.compile(r"<s>(.*?)</s>")


def see_target(tagged, where, stats=None):
    """The summary of a tagged abstract (``<s> sent . </s> <s> sent '' </s>``), as trained on and scored.

    The tags go and the sentences are joined by spaces. ROUGE-1.5.5 as files2rouge runs it knows
    sentences only by " ." (rouge155.split_sentences); See et al.'s fix_missing_period left a
    sentence ending in ``'``, ``''``, ``?``, ``!``, ``...`` or ``u.s.`` without one (about 5 % of
    them), which would merge it with the next one. So a sentence whose last token is not "."
    gets " ." appended, and only such a sentence: every tag boundary is then a sentence end.
    ROUGE drops every non-alphanumeric token (``s/[^A-Za-z0-9\\-]/ /g``), so the added "." changes
    no n-gram, only ROUGE-L's summary-level sentence units. A " ." inside a tagged sentence (about
    0.5 % of them: "... cnn student news . you must be ...") is kept: ROUGE splits there too.
    Empty sentences are dropped; text outside the tags is an error (untagged abstracts).
    ``stats`` (a Counter), when given, counts the ``sentences`` and the ``periods_added``.
    """
    outside = TAGGED.sub(" ", tagged).split()
    if outside:
        raise PrepError(f"{where}: text outside the <s> ... </s> sentence tags ({' '.join(outside)[:60]!r}); "
                        "expected See et al.'s tagged abstracts")
    tokens, sentences, added = [], 0, 0
    for sentence in TAGGED.findall(tagged):
        words = sentence.split()
        if not words:
            continue
        if words[-1] != ".":
            words.append(".")
            added += 1
        tokens += words
        sentences += 1
    if stats is not None:
        stats["sentences"] += sentences
        stats["periods_added"] += added
    return " ".join(tokens)


def see_pairs(layout, split):
    """(article, tagged abstract, where) of a split of a See et al. layout, in order."""
    if layout.kind == "see-text":
        art_file, abs_file = layout.files[split]
        articles, abstracts = read_lines(art_file), read_lines(abs_file)
        if len(articles) != len(abstracts):
            raise PrepError(f"cnndm {split}: {len(articles):,} articles ({art_file}) but {len(abstracts):,} "
                            f"abstracts ({abs_file})")
        for i, (article, abstract) in enumerate(zip(articles, abstracts), 1):
            yield article, abstract, f"{abs_file} line {i}"
    else:
        for path in layout.files[split]:
            for i, (article, abstract) in enumerate(see_bin.read_pairs(path), 1):
                yield article, abstract, f"{path} record {i}"


@contextlib.contextmanager
def _writing(paths):
    """Line writers for ``paths``, each renamed to its name only when all are complete."""
    with contextlib.ExitStack() as files:
        yield [lambda line, f=files.enter_context(replacing(p)): f.write(line + "\n") for p in paths]


def read_see(layout, tok, src, tgt, max_source, max_target):
    """Write ``tok/{split}.{src,tgt}`` (article cut to ``max_source`` tokens, summary of
    :func:`see_target`; training and validation summaries cut to ``max_target`` tokens, test
    references never), ``tok/test.raw.{src,tgt}`` (the whole article for lead baselines, the
    references as scored) and ``tok/see_counts.json`` (pairs read, sentences given a " .")."""
    stats = {"release": {}, "empty_train_pairs_dropped": 0, "sentences": {}, "periods_added": {}}
    for split in SPLITS:
        paths = [tok / f"{split}.{src}", tok / f"{split}.{tgt}"]
        if split == "test":
            paths += [tok / f"test.raw.{src}", tok / f"test.raw.{tgt}"]
        n, counts, blank = 0, Counter(), []
        with _writing(paths) as write:
            for article, abstract, where in see_pairs(layout, split):
                n += 1
                words, target = article.split(), see_target(abstract, where, counts)
                if split == "train" and not (words and target):
                    stats["empty_train_pairs_dropped"] += 1  # no signal (114 such stories in the standard list)
                    continue
                if split == "test":
                    blank += [] if target else [where]
                    write[2](" ".join(words))
                    write[3](target)
                elif max_target:
                    target = " ".join(target.split()[:max_target])
                write[0](" ".join(words[:max_source] if max_source else words))
                write[1](target)
            refuse_blank_references(blank, n)  # inside: no file of the split is renamed into place
        stats["release"][split] = n
        stats["sentences"][split], stats["periods_added"][split] = counts["sentences"], counts["periods_added"]
        log(f"      {split}: {n:,} pairs from {', '.join(p.name for p in layout.files[split])}; "
            f"{counts['periods_added']:,} of {counts['sentences']:,} summary sentences given a final ' .'")
    (tok / "see_counts.json").write_text(json.dumps(stats, indent=1) + "\n")


# ------------------------------------------------------------- presplit folder and stories

def make_splits(layout, roots, raw, src, tgt):
    """``raw/{split}.{src,tgt}``, untokenized, from a presplit folder or the story archives."""
    split_names = {"train": "train", "valid": "val", "test": "test"}
    if layout.kind == "presplit":
        folder = layout.folder
        for split, short in split_names.items():
            for lang in (src, tgt):
                f = folder / f"{short}.{lang}"
                f = f if f.is_file() else folder / f"{split}.{lang}"
                if not f.is_file():
                    first = "val" if (folder / "val.source").is_file() else "valid"
                    raise PrepError(f"{folder}: has {first}.source but no {short}.{lang} / {split}.{lang}")
                write_lines(raw / f"{split}.{lang}", read_lines(f))
        return
    stories = {}
    for root in roots:
        for p in Path(root).rglob("*.story"):
            stories.setdefault(p.stem, p)
    if not stories:
        raise PrepError("no *.story files and no {val,train,test}.source/.target found: expected "
                        "cnn_stories.tgz + dailymail_stories.tgz + url lists (See et al.), or See et al.'s "
                        "{split}.article.txt + {split}.abstract.tagged.txt, or their finished_files/*.bin")
    for split, short in split_names.items():
        urls = [u.strip() for u in read_lines(find_file(roots, f"all_{short}.txt")) if u.strip()]
        arts, sums, missing = [], [], []
        for url in urls:
            p = stories.get(url_hash(url))
            if p is None:
                missing.append(url)
                continue
            a, s = story_to_pair(read_text(p))  # UTF-8 or an error naming the file and line
            arts.append(a)
            sums.append(s)
        if missing:
            raise PrepError(f"{split}: {len(missing)} of {len(urls)} stories listed in all_{short}.txt "
                            f"are missing (first: {missing[0]}); incomplete story archives?")
        write_lines(raw / f"{split}.{src}", arts)
        write_lines(raw / f"{split}.{tgt}", sums)
        log(f"      {split}: {len(arts)} stories")


def tokenize(args, raw, tok, src, tgt):
    """Moses (tokenizer.perl -no-escape, lowercased) on ``raw/``; article cut to
    ``--max-source-tokens``, training and validation summaries to ``--max-target-tokens``."""
    for split in SPLITS:
        s = tokenize_lines(read_lines(raw / f"{split}.{src}"), "en", escape=False, lowercase=True,
                           workers=args.workers, desc=f"{split}.source")
        t = tokenize_lines(read_lines(raw / f"{split}.{tgt}"), "en", escape=False, lowercase=True,
                           workers=args.workers, desc=f"{split}.target")
        if split == "test":  # the references as scored, the whole articles for lead baselines
            refuse_blank_references([f"{raw / 'test.target'} line {i}" for i, x in enumerate(t, 1) if not x.strip()],
                                    len(t))
            write_lines(tok / f"test.raw.{src}", s)
            write_lines(tok / f"test.raw.{tgt}", t)
        elif args.max_target_tokens:
            t = [" ".join(x.split()[:args.max_target_tokens]) for x in t]
        if args.max_source_tokens:
            s = [" ".join(x.split()[:args.max_source_tokens]) for x in s]  # See et al.: 400
        if split == "train":
            # empty articles/summaries (114 in the train list) carry no signal; valid/test
            # keep every pair so the standard counts and references hold.
            pairs = [(a, b) for a, b in zip(s, t) if a.strip() and b.strip()]
            s, t = [a for a, _ in pairs], [b for _, b in pairs]
        write_lines(tok / f"{split}.{src}", s)
        write_lines(tok / f"{split}.{tgt}", t)


# ------------------------------------------------------------------------------- the recipe

def prepare_cnndm(args):
    c = corpus("cnndm")
    src, tgt = c.languages
    steps, roots, tok = staged_work(args, CNNDM_URLS, c.archives)
    layout = find_layout(roots)
    log(f"      layout: {layout.describe}")
    outputs = [tok / f"{s}.{l}" for s in SPLITS for l in (src, tgt)] + [tok / f"test.raw.{l}" for l in (src, tgt)]
    cut = {"max_source_tokens": args.max_source_tokens}
    if args.max_target_tokens:  # only when given: the stamps of earlier runs stay current
        cut["max_target_tokens"] = args.max_target_tokens
    if layout.kind in ("see-text", "see-bin"):
        steps.run("read_see", read_see, layout, tok, src, tgt, args.max_source_tokens, args.max_target_tokens,
                  options={**cut, "layout": layout.describe,
                           "files": {s: [str(p) for p in ps] for s, ps in layout.files.items()}},
                  outputs=outputs + [tok / "see_counts.json"])
        see_counts = json.loads((tok / "see_counts.json").read_text())
        release = see_counts["release"]
        check_counts(release, c.standard_counts, args.allow_nonstandard_splits)
        text = {"tokenizer": SEE_TOKENIZER, "summary_sentences": SEE_SENTENCES,
                "summary_sentences_given_a_period": see_counts["periods_added"],
                "summary_sentences_total": see_counts["sentences"]}
    else:
        raw = steps.work / "raw"
        raw.mkdir(exist_ok=True)
        steps.run("make_splits", make_splits, layout, roots, raw, src, tgt,
                  outputs=[raw / f"{s}.{l}" for s in SPLITS for l in (src, tgt)])
        release = check_counts(split_counts(raw, src, tgt), c.standard_counts, args.allow_nonstandard_splits, "stories")
        steps.run("tokenize", tokenize, args, raw, tok, src, tgt, options=cut, outputs=outputs)
        text = {"tokenizer": "Moses tokenizer.perl -l en -no-escape, lowercased",
                "summary_sentences": "highlights joined by spaces, ' .' after those without final punctuation "
                                     "(See et al.'s fix_missing_period)" if layout.kind == "stories" else "as given"}
    merges = args.bpe_merges or c.bpe_merges
    if layout.kind in ("see-text", "see-bin"):  # tokenized already: the record names no tokenizer
        args.record["tokenizer"] = {}
    split_counts(tok, src, tgt)  # an empty split (a zero-byte test file) is named here, before BPE and binarize
    bpe_and_binarize(args, steps, tok, src, tgt, merges)
    counts = report_counts(tok, src, tgt)
    write_manifest(args.dest, c.name, src, tgt, counts, release, dict(c.standard_counts), {"test": layout.test_name},
                   source=str(args.from_path or CNNDM_URLS[0]), layout=layout.describe,
                   files={s: [str(p) for p in ps] for s, ps in layout.files.items()},
                   subword=args.record["subword"], **subword.manifest_options(args, merges),
                   max_source_tokens=args.max_source_tokens or None, max_target_tokens=args.max_target_tokens or None,
                   **text)
    return counts
