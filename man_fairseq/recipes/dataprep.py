"""Building blocks of the data-preparation recipes (``data-prep/prepare-*.sh``).

Every step is idempotent: it writes its outputs, then a stamp file ``.<step>.done`` in the work
directory; a second run skips stamped steps, and an interrupted step (no stamp) is redone from
its inputs. Downloads resume from ``*.part`` files, are checked against the server's size and a
recorded SHA-256, and archives are read to the end before use, so a truncated or wrong archive
fails with a message that says which file and what to do.
"""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from multiprocessing import Pool
from pathlib import Path


class PrepError(RuntimeError):
    """A user-facing error: bad input archive, missing files, failed download."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------- steps

class Steps:
    def __init__(self, work_dir):
        self.work = Path(work_dir)
        self.work.mkdir(parents=True, exist_ok=True)

    def done(self, name):
        return (self.work / f".{name}.done").is_file()

    def run(self, name, fn, *args, **kwargs):
        if self.done(name):
            log(f"skip  {name} (done; delete {self.work / ('.' + name + '.done')} to redo)")
            return None
        log(f"start {name}")
        t0 = time.time()
        out = fn(*args, **kwargs)
        (self.work / f".{name}.done").write_text(time.strftime("%Y-%m-%d %H:%M:%S") + "\n")
        log(f"done  {name} ({time.time() - t0:.1f}s)")
        return out


# ------------------------------------------------------------------------------- downloads

def sha256_of(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def verify_archive(path, name=None):
    """Read an archive to its end (gzip CRC / tar structure / zip CRC) or raise PrepError.

    ``name`` (default: the file name) decides the format, so a ``*.part`` file can be checked
    before it takes its final name.
    """
    path = Path(path)
    name = name or path.name
    try:
        if name.endswith((".tgz", ".tar.gz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz")):
            with tarfile.open(path) as tar:
                members = 0
                for member in tar:
                    if member.isfile():
                        f = tar.extractfile(member)
                        while f.read(1 << 20):
                            pass
                    members += 1
            if members == 0:
                raise PrepError(f"{path}: archive is empty")
        elif name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
                if bad:
                    raise PrepError(f"{path}: corrupt member {bad}")
        elif name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
    except PrepError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, gzip.BadGzipFile) as e:
        raise PrepError(
            f"{path} is truncated or not a valid archive ({type(e).__name__}: {e}). "
            "Delete it and download it again (or point --from at a complete copy).") from e


def fetch(url, dest, expected_sha256=None, checksum_file=None):
    """Download ``url`` to ``dest`` with resume, size check and SHA-256 check.

    The first successful download records its SHA-256 in ``checksum_file`` (JSON); later runs
    verify the file against it (and against ``expected_sha256`` when the recipe knows it).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sums = {}
    if checksum_file and Path(checksum_file).is_file():
        sums = json.loads(Path(checksum_file).read_text())
    want = expected_sha256 or sums.get(dest.name)
    if dest.is_file():
        if want and sha256_of(dest) != want:
            raise PrepError(f"{dest}: SHA-256 differs from the recorded one; delete it to re-download")
        log(f"have  {dest.name}")
        return dest
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": "man-fairseq-data-prep"})
    if start:
        req.add_header("Range", f"bytes={start}-")
    try:
        resp = urllib.request.urlopen(req, timeout=60)
    except Exception as e:
        raise PrepError(f"cannot download {url}: {e}. Without internet, fetch it elsewhere and "
                        f"pass --from <folder or archive>.") from e
    if "text/html" in resp.headers.get("Content-Type", "") and not url.endswith((".html", ".txt")):
        raise PrepError(f"{url} returned a web page instead of the file (a login or Google Drive "
                        "confirmation page?). Download it in a browser and pass --from <file>.")
    resumed = start and resp.status == 206
    length = resp.headers.get("Content-Length")
    total = (int(length) + (start if resumed else 0)) if length else None
    done = start if resumed else 0
    last = time.time()
    with open(part, "ab" if resumed else "wb") as out:
        while True:
            block = resp.read(1 << 20)
            if not block:
                break
            out.write(block)
            done += len(block)
            if time.time() - last > 5:
                pct = f"{100 * done / total:.1f}%" if total else "?%"
                log(f"      {dest.name}: {done / 2**20:.1f} MiB {pct}")
                last = time.time()
    if total is not None and done != total:
        raise PrepError(f"{url}: got {done} bytes, server announced {total}; run again to resume")
    digest = sha256_of(part)
    if want and digest != want:
        part.unlink()
        raise PrepError(f"{url}: SHA-256 {digest} does not match the expected {want}")
    try:
        verify_archive(part, name=dest.name)
    except PrepError:
        part.unlink()  # a broken download must not survive as the finished file
        raise
    os.replace(part, dest)
    if checksum_file:
        sums[dest.name] = digest
        Path(checksum_file).write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n")
    log(f"got   {dest.name} ({done / 2**20:.1f} MiB, sha256 {digest[:16]}...)")
    return dest


ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip", ".tar.bz2", ".tbz2", ".tar.xz")


def extract(archive, dest):
    """Verify then extract ``archive`` into ``dest`` (refusing paths that escape it)."""
    archive, dest = Path(archive), Path(dest)
    verify_archive(archive)
    dest.mkdir(parents=True, exist_ok=True)
    log(f"extract {archive.name} -> {dest}")
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
        return
    with tarfile.open(archive) as tar:
        root = dest.resolve()
        for m in tar.getmembers():
            if not (root / m.name).resolve().is_relative_to(root):
                raise PrepError(f"{archive}: member {m.name} escapes the extraction folder")
        tar.extractall(dest, filter="data") if sys.version_info >= (3, 12) else tar.extractall(dest)


def stage_source(from_path, orig_dir, archive_names=()):
    """Make a local archive or folder available under ``orig_dir``.

    A file is verified and extracted; a folder is searched as is and any archive named in
    ``archive_names`` inside it is extracted (so ``--from`` may hold the original downloads).
    Returns the folders to search for input files.
    """
    src = Path(from_path).expanduser().resolve()
    if not src.exists():
        raise PrepError(f"--from {src}: no such file or folder")
    if src.is_file():
        if not src.name.endswith(ARCHIVE_SUFFIXES):
            raise PrepError(f"--from {src}: expected an archive ({', '.join(ARCHIVE_SUFFIXES)}) or a folder")
        extract(src, orig_dir)
        return [Path(orig_dir)]
    for name in archive_names:
        for hit in sorted(src.rglob(name)):
            extract(hit, Path(orig_dir) / hit.name.split(".")[0])
    return [src, Path(orig_dir)]


def find_file(roots, name, required=True):
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        hits = sorted(p for p in root.rglob(name) if p.is_file())
        if hits:
            return hits[0]
    if required:
        raise PrepError(f"cannot find {name} under {', '.join(map(str, roots))}: wrong archive "
                        "or folder? (see 'Reproducing the papers' in README.md for the expected layout)")
    return None


# ------------------------------------------------------------------------- text processing

def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_lines(path):
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def write_lines(path, lines):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")
    os.replace(tmp, path)  # a half-written file never carries the final name


_TOK = {}


def _tok_init(lang, aggressive, escape, normalize, lowercase):
    global _TOK
    _TOK = {"lang": lang, "aggressive": aggressive, "escape": escape, "normalize": normalize,
            "lowercase": lowercase}


def _tok_line(line):
    from . import moses

    lang = _TOK["lang"]
    if _TOK["normalize"]:
        # normalize-punctuation.perl then remove-non-printing-char.perl, as fairseq's WMT recipe
        line = moses.remove_non_printing(moses.normalize_punctuation(line, lang))
    out = moses.tokenize(line, lang, aggressive=_TOK["aggressive"], escape=_TOK["escape"])
    return moses.lowercase(out) if _TOK["lowercase"] else out


def tokenize_lines(lines, lang, aggressive=False, escape=True, normalize=False, lowercase=False,
                   workers=1, desc=""):
    """tokenizer.perl -l LANG [-a] [-no-escape] (then lowercase.perl), in ``workers`` processes.

    The rules are in :mod:`man_fairseq.recipes.moses` (byte-identical to the Perl scripts)."""
    args = (lang, aggressive, escape, normalize, lowercase)
    total = len(lines)
    out = []
    chunk = 2000
    if workers <= 1:
        _tok_init(*args)
        it = map(_tok_line, lines)
        pool = None
    else:
        pool = Pool(workers, initializer=_tok_init, initargs=args)
        it = pool.imap(_tok_line, lines, chunksize=256)
    last = time.time()
    for i, line in enumerate(it, 1):
        out.append(line)
        if time.time() - last > 10 or (i % (50 * chunk) == 0):
            log(f"      tokenize {desc}: {i}/{total}")
            last = time.time()
    if pool is not None:
        pool.close()
        pool.join()
    return out


def clean_pairs(src, tgt, min_len=1, max_len=175, ratio=1.5, max_word_length=1000):
    """clean-corpus-n.perl [-ratio R] CORPUS L1 L2 OUT MIN MAX: keep pairs with min_len <= tokens
    <= max_len on both sides, a token-count ratio <= ``ratio`` both ways (``ratio=None``:
    -ignore-ratio) and no word longer than ``max_word_length`` characters. As the Perl script,
    it removes "|" unless the first pair has one (factored corpus) and squeezes whitespace."""
    if len(src) != len(tgt):
        raise PrepError(f"clean-corpus: {len(src)} source but {len(tgt)} target lines")
    keep_s, keep_t = [], []
    factored = bool(src) and ("|" in src[0] or "|" in tgt[0])
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
    tmp = Path(str(codes_path) + ".tmp")
    with open(joined, encoding="utf-8") as inp, open(tmp, "w", encoding="utf-8") as out:
        _learn(inp, out, merges, min_frequency=2, verbose=False, is_dict=False, total_symbols=False)
    os.replace(tmp, codes_path)
    joined.unlink()


_BPE = None


def _bpe_init(codes_path):
    global _BPE
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as f:
        _BPE = BPE(f)


def _bpe_line(line):
    return _BPE.process_line(line)


def apply_bpe_lines(lines, codes_path, workers=1):
    if workers <= 1:
        _bpe_init(codes_path)
        return [_bpe_line(l) for l in lines]
    with Pool(workers, initializer=_bpe_init, initargs=(str(codes_path),)) as pool:
        return list(pool.imap(_bpe_line, lines, chunksize=512))


# -------------------------------------------------------------------------------- binarize

def binarize(prep_dir, dest_dir, src, tgt, workers=1, joined=True, splits=("train", "valid", "test")):
    """fairseq-preprocess on ``prep_dir/{train,valid,test}.{src,tgt}``."""
    cmd = ["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", str(dest_dir), "--workers", str(workers)]
    for split in splits:
        cmd += [f"--{split}pref", str(Path(prep_dir) / split)]
    if joined:
        cmd += ["--joined-dictionary"]
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    log("+ " + " ".join(cmd))
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise PrepError(f"fairseq-preprocess failed:\n{proc.stdout[-3000:]}")


def report_counts(prep_dir, src, tgt, expected=None, splits=("train", "valid", "test")):
    """Print pair counts per split (and the standard counts when known); returns the counts."""
    counts = {}
    for split in splits:
        ns = count_lines(Path(prep_dir) / f"{split}.{src}")
        nt = count_lines(Path(prep_dir) / f"{split}.{tgt}")
        if ns != nt:
            raise PrepError(f"{split}: {ns} source lines but {nt} target lines")
        counts[split] = ns
        note = ""
        if expected and expected.get(split) is not None:
            note = " (standard: {:,}{})".format(expected[split], "" if expected[split] == ns else " — differs")
        log(f"{split:>5}: {ns:,} pairs{note}")
    (Path(prep_dir) / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    return counts


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
