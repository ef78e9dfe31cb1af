"""Getting a recipe's source files: download (resumable, size and SHA-256 checked), verify and
extract archives, stage a local ``--from`` file or folder, and find the input files in it.

Downloads resume from ``*.part`` files, are checked against the server's size and a recorded
SHA-256, and archives are read to the end before use, so a truncated or wrong archive fails with
a message that says which file and what to do.
"""

import gzip
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

from man_recipes.data.dataprep import PrepError, log
from man_recipes.atomic import write_text
from man_recipes.data.steps import Steps


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
        write_text(checksum_file, json.dumps(sums, indent=1, sort_keys=True) + "\n")
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
            if m.issym() or m.islnk():
                target = (root / m.name).parent / m.linkname if m.issym() else root / m.linkname
                if not target.resolve().is_relative_to(root):
                    raise PrepError(f"{archive}: link {m.name} -> {m.linkname} escapes the extraction folder")
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


def find_file(roots, name, required=True, parent=None, gz=False):
    """First file called ``name`` (or ``name.gz`` when ``gz``) under ``roots``.

    ``parent`` restricts the hits to files directly inside a folder of that name, for releases
    where several folders hold files of the same name (Gigaword: Giga/, DUC2003/, DUC2004/ all
    have input.txt).
    """
    names = [name, name + ".gz"] if gz else [name]
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        hits = sorted(p for n in names for p in root.rglob(n)
                      if p.is_file() and (parent is None or p.parent.name == parent))
        if hits:
            return hits[0]
    if required:
        where = f"{parent}/{name}" if parent else name
        raise PrepError(f"cannot find {where}{' (or .gz)' if gz else ''} under {', '.join(map(str, roots))}: "
                        "wrong archive or folder? (see docs/reproducing.md, '1. Data', for the expected layout)")
    return None


def stage(args, steps, urls, archive_names):
    """The dataset recipes' first step (a :class:`steps.Steps` step): download ``urls`` into
    ``<work>/downloads`` and extract them, or take ``--from``; returns the folders to search for the raw files."""
    orig = steps.work / "orig"

    def fresh_orig():
        # orig/ lives in our --work folder and only ever holds what we extracted: a new source
        # must not be mixed with the files of the previous one
        if orig.exists():
            shutil.rmtree(orig)
        orig.mkdir(parents=True)
    if args.from_path:
        src = Path(args.from_path).expanduser().resolve()
        if not src.exists():
            raise PrepError(f"--from {src}: no such file or folder")

        def stage():
            fresh_orig()
            stage_source(src, orig, archive_names)
        steps.run("stage", stage, inputs=[src], options={"from": str(src)}, outputs=[orig])
        return [orig] if src.is_file() else [src, orig]

    def download():
        fresh_orig()
        for url in urls:
            url, name = url if isinstance(url, tuple) else (url, url.rsplit("/", 1)[-1].split("?")[0])
            fetch(url, steps.work / "downloads" / name, checksum_file=steps.work / "downloads" / "SHA256SUMS.json")
            if name.endswith((".tgz", ".tar.gz", ".zip", ".tar")):
                extract(steps.work / "downloads" / name, orig / name.split(".")[0])
    steps.run("download", download, options={"urls": [str(u) for u in urls]}, outputs=[orig])
    return [orig, steps.work / "downloads"]


def staged_work(args, urls, archive_names):
    """How a recipe from a released archive starts: its :class:`~.steps.Steps` in ``--work``, the
    folders of the staged release (:func:`stage`) and the work folder ``tok/`` (made) its tokenized
    splits go to; returns (steps, roots, tok)."""
    steps = Steps(args.work)
    roots = stage(args, steps, urls, archive_names)
    tok = steps.work / "tok"
    tok.mkdir(exist_ok=True)
    return steps, roots, tok
