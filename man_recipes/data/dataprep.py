"""Building blocks of the data-preparation recipes (``data-prep/prepare-*.sh``): text-file IO,
tokenization, corpus cleaning, BPE and split-size checks, and the recipes' error.

The stamped, resumable steps and the folders data-prep owns are :mod:`.steps`; getting the source
files is :mod:`man_recipes.data.downloads`, fairseq-preprocess :mod:`man_recipes.data.binarize`.
"""

import json
import re
import shutil
import time
from multiprocessing import Pool
from pathlib import Path

from man_recipes.data import moses
from man_recipes.atomic import replacing
from man_recipes import textfile


class PrepError(RuntimeError):
    """A user-facing error: bad input archive, missing files, failed download."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------- text processing

def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _read(read, path):
    """``read(path)`` (:mod:`.textfile`) with its errors as PrepErrors naming the file."""
    try:
        return read(path)
    except (textfile.NotUtf8Error, textfile.CorruptFileError) as e:
        raise PrepError(str(e)) from None
    except OSError as e:
        raise PrepError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def read_lines(path):
    """Lines of a UTF-8 text file (``*.gz``: gunzipped), without line ends; text that is not
    UTF-8 (nothing is replaced) or a damaged or truncated .gz is a PrepError naming the file."""
    return _read(textfile.read_lines, Path(path))


def read_text(path):
    """The whole of a UTF-8 text file, checked as by :func:`read_lines`."""
    return _read(textfile.read_text, Path(path))


def write_lines(path, lines):
    with replacing(path) as f:  # a half-written file never carries the final name
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")


_TOK = {}


def _ignore_ctrl_c():
    """In a worker process: Ctrl-C is the parent's to handle (it ends the pool), not a traceback per worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tok_init(lang, aggressive, escape, normalize, lowercase, worker=False):
    global _TOK
    if worker:
        _ignore_ctrl_c()
    _TOK = {"lang": lang, "aggressive": aggressive, "escape": escape, "normalize": normalize,
            "lowercase": lowercase}


def _tok_line(line):
    lang = _TOK["lang"]
    if _TOK["normalize"]:
        # normalize-punctuation.perl then remove-non-printing-char.perl, as fairseq's WMT recipe
        line = moses.remove_non_printing(moses.normalize_punctuation(line, lang))
    out = moses.tokenize(line, lang, aggressive=_TOK["aggressive"], escape=_TOK["escape"])
    return moses.lowercase(out) if _TOK["lowercase"] else out


def tokenize_lines(lines, lang, aggressive=False, escape=True, normalize=False, lowercase=False,
                   workers=1, desc=""):
    """tokenizer.perl -l LANG [-a] [-no-escape] (then lowercase.perl), in ``workers`` processes.

    The rules are in :mod:`man_recipes.data.moses` (byte-identical to the Perl scripts)."""
    args = (lang, aggressive, escape, normalize, lowercase)
    total = len(lines)
    out = []
    chunk = 2000
    if workers <= 1:
        _tok_init(*args)
        it = map(_tok_line, lines)
        pool = None
    else:
        pool = Pool(workers, initializer=_tok_init, initargs=(*args, True))
        it = pool.imap(_tok_line, lines, chunksize=256)
    last = time.time()
    try:
        for i, line in enumerate(it, 1):
            out.append(line)
            if time.time() - last > 10 or (i % (50 * chunk) == 0):
                log(f"      tokenize {desc}: {i}/{total}")
                last = time.time()
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    return out


def clean_pairs(src, tgt, min_len=1, max_len=175, ratio=1.5, max_word_length=1000, factor_separator=True):
    """clean-corpus-n.perl [-ratio R] CORPUS L1 L2 OUT MIN MAX: keep pairs with min_len <= tokens
    <= max_len on both sides, a token-count ratio <= ``ratio`` both ways (``ratio=None``:
    -ignore-ratio) and no word longer than ``max_word_length`` characters. As the Perl script,
    it removes "|" unless the first pair has one (factored corpus; ``factor_separator=False``:
    "|" is plain text and stays) and squeezes whitespace."""
    if len(src) != len(tgt):
        raise PrepError(f"clean-corpus: {len(src)} source but {len(tgt)} target lines")
    keep_s, keep_t = [], []
    factored = not factor_separator or (bool(src) and ("|" in src[0] or "|" in tgt[0]))
    for s, t in zip(src, tgt):
        if not factored:
            s, t = s.replace("|", ""), t.replace("|", "")
        ws, wt = s.split(), t.split()
        if not ws or not wt:
            continue
        ns, nt = len(ws), len(wt)
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
            continue
        if ratio is not None and (ns / nt > ratio or nt / ns > ratio):
            continue
        if max(map(len, ws + wt)) > max_word_length:
            continue
        keep_s.append(" ".join(ws))
        keep_t.append(" ".join(wt))
    return keep_s, keep_t


# -------------------------------------------------------------------------------------- BPE

def learn_bpe(train_files, codes_path, merges):
    """subword-nmt learn_bpe on the concatenation of ``train_files`` (joint BPE)."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    joined = Path(codes_path).with_name("bpe-train.tmp")
    with open(joined, "w", encoding="utf-8") as out:
        for fname in train_files:
            with open(fname, encoding="utf-8") as f:
                shutil.copyfileobj(f, out)
    with open(joined, encoding="utf-8") as inp, replacing(codes_path) as out:
        _learn(inp, out, merges, min_frequency=2, verbose=False, is_dict=False, total_symbols=False)
    joined.unlink()


_BPE = None


def _bpe_init(codes_path, worker=False):
    global _BPE
    from subword_nmt.apply_bpe import BPE

    if worker:
        _ignore_ctrl_c()
    with open(codes_path, encoding="utf-8") as f:
        _BPE = BPE(f)


def _bpe_line(line):
    return _BPE.process_line(line)


def apply_bpe_lines(lines, codes_path, workers=1):
    if workers <= 1:
        _bpe_init(codes_path)
        return [_bpe_line(l) for l in lines]
    with Pool(workers, initializer=_bpe_init, initargs=(str(codes_path), True)) as pool:
        return list(pool.imap(_bpe_line, lines, chunksize=512))


# ----------------------------------------------------------------------------- split sizes

def split_counts(folder, src, tgt, splits=("train", "valid", "test")):
    """{split: pairs} of ``folder/SPLIT.{src,tgt}``; a line-count mismatch is a PrepError."""
    counts = {}
    for split in splits:
        ns = count_lines(Path(folder) / f"{split}.{src}")
        nt = count_lines(Path(folder) / f"{split}.{tgt}")
        if ns != nt:
            raise PrepError(f"{split}: {ns} source lines but {nt} target lines")
        if ns == 0:  # BPE would fail on it with a bare ValueError from subword-nmt
            raise PrepError(f"{split}: {Path(folder) / f'{split}.{src}'} and .{tgt} hold no lines; nothing to prepare")
        counts[split] = ns
    return counts


def check_counts(counts, expected, allow_nonstandard=False, what="pairs"):
    """Compare split sizes with the standard ones; a difference is an error unless allowed."""
    wrong = []
    for split, n in counts.items():
        want = (expected or {}).get(split)
        note = ""
        if want is not None:
            note = f" (standard: {want:,})" if want == n else f" (standard: {want:,}, DIFFERS)"
            if want != n:
                wrong.append(f"{split} has {n:,} {what}, the standard split has {want:,}")
        log(f"{split:>5}: {n:,} {what}{note}")
    if wrong and not allow_nonstandard:
        raise PrepError("; ".join(wrong) + ". Incomplete or different release? Pass "
                        "--allow-nonstandard-splits to go on with these splits anyway.")
    return counts


def refuse_blank_references(blank, total):
    """Refuse a test split with blank references before BPE: ROUGE cannot score one (files2rouge
    stops on it, an average would count it as 0). ``blank``: where each is (file and line or record)."""
    if blank:
        raise PrepError(f"test: {len(blank):,} of {total:,} references are blank (first: {blank[0]}); ROUGE cannot "
                        "score a blank reference. Fix or remove those pairs in the input and run again.")


def report_counts(prep_dir, src, tgt, expected=None, splits=("train", "valid", "test"),
                  allow_nonstandard=True):
    """Print pair counts per split (and the standard counts when known), write counts.json."""
    counts = check_counts(split_counts(prep_dir, src, tgt, splits), expected, allow_nonstandard)
    (Path(prep_dir) / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    return counts


# --------------------------------------------------------------------- WIT3 / WMT segments

SEG_RE = re.compile(r'<seg id="?\d+"?>\s*(.*?)\s*</seg>\s*$')


def read_seg_lines(xml_or_sgm_path):
    """Segments of a WIT3 .xml / WMT .sgm file, one per ``<seg id=...>`` line, in order.

    Same as the recipes' ``grep '<seg id' | sed -e 's/<seg id="[0-9]*">\\s*//g' -e 's/\\s*<\\/seg>\\s*//g'``.
    """
    out = []
    for line in read_lines(xml_or_sgm_path):
        if "<seg id" in line:
            m = SEG_RE.search(line)
            if not m:
                raise PrepError(f"{xml_or_sgm_path}: cannot parse segment line: {line[:200]}")
            out.append(m.group(1))
    return out
