"""data-prep/prepare-*.sh run offline (--from) on small archives in the real layouts.

Fixture archives are built here: WIT3 de-en.tgz (train.tags.* + IWSLT14.TED*.xml), the WMT
training/dev/test-full tarballs (plain text + SGML), CNN/DailyMail story tarballs with See et
al.'s URL lists, and the Gigaword "sumdata" release (train/*.gz, Giga/, DUC2003/, DUC2004/).
Tests named *_real_sample* run the same recipes on ../shared/data (through the ``shared_data``
fixture, which skips when it is absent). The fixtures are far smaller than the standard splits,
so the runs pass --allow-nonstandard-splits (test_nonstandard_split_is_an_error checks the
default).
"""

import gzip
import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from pausing import pause_env, wait_for
from man_recipes.data import moses, prepare
from man_recipes.data.dataprep import PrepError
from man_recipes.data.steps import MARKER

PREP = REPO / "data-prep"
MERGES = "60"  # tiny BPE so the fixtures are quick and still get split into subwords


def run_prep(script, *args, check=True):
    args = [*args, "--allow-nonstandard-splits"]
    proc = subprocess.run(["bash", str(PREP / script), *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                               "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return proc


def prep_in_process(*argv, allow=True):
    """prepare.run() in this process: PrepError propagates, so its message can be asserted."""
    from man_recipes.data.prepare import run

    return run([*map(str, argv), *(["--allow-nonstandard-splits"] if allow else [])])


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def add_text(tar, name, text):
    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


WORDS_DE = "das haus ist klein und der hund läuft schnell über die straße heute".split()
WORDS_EN = "The house is small and the dog runs quickly across the street today".split()


def sentence(rng, words, n):
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


# ------------------------------------------------------------------------------ IWSLT14

def wit3_xml(name, lang, segs):
    body = "\n".join(f'<seg id="{i}"> {s} </seg>' for i, s in enumerate(segs, 1))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="{name}" srclang="german">\n'
            f'<doc docid="1" genre="lectures">\n<url>http://www.ted.com/talks/x.html</url>\n'
            f"<talkid>1</talkid>\n{body}\n</doc>\n</srcset>\n</mteval>\n")


def make_iwslt_archive(archive, extra_pairs=0, seed=0):
    """A WIT3 de-en.tgz; returns (pairs kept by cleaning, number of test segments)."""
    rng = random.Random(seed)
    pairs = [(sentence(rng, WORDS_DE, n), sentence(rng, WORDS_EN, n))
             for n in (rng.randint(3, 12) for _ in range(240 + extra_pairs))]
    pairs[10] = ("Ein", "One two three four five six")            # ratio > 1.5: cleaned away
    pairs[20] = (" ".join(["wort"] * 180), " ".join(["word"] * 180))  # > 175 tokens: cleaned away
    meta = ["<url>http://www.ted.com/talks/a.html</url>", "<keywords>talks</keywords>", "<talkid>1</talkid>"]
    de = meta + ["<title>Der Titel</title>", "<description>Eine Beschreibung</description>"] + [p[0] for p in pairs]
    en = meta + ["<title>The title</title>", "<description>A description</description>"] + [p[1] for p in pairs]
    test_sizes = {"IWSLT14.TED.dev2010": 7, "IWSLT14.TEDX.dev2012": 3, "IWSLT14.TED.tst2010": 5,
                  "IWSLT14.TED.tst2011": 4, "IWSLT14.TED.tst2012": 6}
    with tarfile.open(archive, "w:gz") as tar:
        add_text(tar, "de-en/train.tags.de-en.de", "\n".join(de) + "\n")
        add_text(tar, "de-en/train.tags.de-en.en", "\n".join(en) + "\n")
        add_text(tar, "de-en/README", "fixture\n")
        for name, n in test_sizes.items():
            segs = [(sentence(rng, WORDS_DE, 5), sentence(rng, WORDS_EN, 5) + " It\u2019s") for _ in range(n)]
            add_text(tar, f"de-en/{name}.de-en.de.xml", wit3_xml(name, "de", [s for s, _ in segs]))
            add_text(tar, f"de-en/{name}.de-en.en.xml", wit3_xml(name, "en", [t for _, t in segs]))
    kept = [p for i, p in enumerate(pairs) if i not in (10, 20)]
    kept = [("Der Titel", "The title"), ("Eine Beschreibung", "A description")] + kept
    return kept, sum(test_sizes.values())


@pytest.fixture(scope="module")
def iwslt_fixture(tmp_path_factory):
    archive = tmp_path_factory.mktemp("iwslt") / "de-en.tgz"
    kept, n_test = make_iwslt_archive(archive)
    return archive, kept, n_test


def test_iwslt14_from_archive(iwslt_fixture, tmp_path):
    archive, kept, n_test = iwslt_fixture
    work, dest = tmp_path / "work", tmp_path / "bin"
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--work", work, "--dest", dest,
                   "--bpe-merges", MERGES).stdout
    tok = work / "tok"
    n_clean = len(kept)
    # fairseq's split: every 23rd cleaned pair (1-based) is validation, the rest training
    assert len(lines(tok / "valid.en")) == n_clean // 23
    assert len(lines(tok / "train.en")) == n_clean - n_clean // 23
    assert len(lines(tok / "test.de")) == n_test
    expected_valid = [moses.lowercase(moses.tokenize(kept[i - 1][1], "en")) for i in range(23, n_clean + 1, 23)]
    assert lines(tok / "valid.en") == expected_valid
    assert lines(tok / "train.en")[0] == "the title"  # <title> text kept, tags and metadata dropped
    assert all(l == l.lower() for l in lines(tok / "train.de"))
    assert all("it 's" in l or "it &apos;s" in l for l in lines(tok / "test.en"))  # ’ -> ' then Moses
    assert not any("wort wort" in l for l in lines(tok / "train.de"))
    assert any("@@" in l for l in lines(work / "prep" / "train.de"))
    for f in ("dict.de.txt", "dict.en.txt", "train.de-en.de.bin", "test.de-en.en.idx", "code"):
        assert (dest / f).is_file(), f
    counts = json.loads((work / "prep" / "counts.json").read_text())
    assert counts == {"train": n_clean - n_clean // 23, "valid": n_clean // 23, "test": n_test}
    assert f"test: {n_test} pairs" in out

    assert f"binarized data: {dest}" in out


def test_iwslt14_stamps_redo_what_changed(tmp_path):
    """A stamp records options and inputs: a rerun redoes exactly the steps whose options or
    inputs changed, and everything after them."""
    archive = tmp_path / "de-en.tgz"
    make_iwslt_archive(archive)
    work, dest = tmp_path / "work", tmp_path / "bin"
    common = ["--work", work, "--bpe-merges", MERGES]
    run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest, *common)
    assert (work / MARKER).is_file() and (dest / MARKER).is_file()
    stamp = json.loads((work / ".learn_bpe.done").read_text())
    assert stamp["options"] == {"merges": int(MERGES)}

    # same inputs and options: every step skipped, outputs untouched
    mtime = (dest / "train.de-en.de.bin").stat().st_mtime_ns
    again = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest, *common).stdout
    for step in ("stage", "tokenize_train", "tokenize_test", "learn_bpe", "apply_bpe", "binarize"):
        assert f"skip  {step}" in again
    assert (dest / "train.de-en.de.bin").stat().st_mtime_ns == mtime

    # other BPE merges into the same --dest: refused before any step without --force (it would
    # replace a finished data folder); with it, tokenization is kept, BPE and binarization are redone
    codes = (dest / "code").read_text()
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest, "--work", work,
                   "--bpe-merges", "40", check=False).stdout
    assert "other options (bpe_merges 60 -> 40); refusing to replace it" in out and "start " not in out
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest, "--work", work,
                   "--bpe-merges", "40", "--force").stdout
    assert "skip  tokenize_train" in out and "skip  tokenize_test" in out
    assert "redo  learn_bpe: options changed: merges 60 -> 40" in out
    assert "redo  apply_bpe" in out and "redo  binarize" in out
    assert (dest / "code").read_text() != codes and len((dest / "code").read_text().splitlines()) == 41

    # another --dest: only binarization runs again; the final message names the new folder
    dest2 = tmp_path / "other-bin"
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest2, "--work", work,
                   "--bpe-merges", "40").stdout
    assert "skip  apply_bpe" in out and "redo  binarize: options changed: dest" in out
    assert (dest2 / "dict.de.txt").is_file() and f"binarized data: {dest2}" in out

    # another archive at the same path (one more sentence pair): everything is redone
    kept, _ = make_iwslt_archive(archive, extra_pairs=23)
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest2, "--work", work,
                   "--bpe-merges", "40").stdout
    assert f"redo  stage: input changed: {archive}" in out
    assert "redo  tokenize_train: an earlier step was redone" in out
    assert len(lines(work / "tok" / "valid.en")) == len(kept) // 23

    # an output deleted by hand: its step runs again
    (work / "tok" / "test.de").unlink()
    out = run_prep("prepare-iwslt14.sh", "--from", archive, "--dest", dest2, "--work", work,
                   "--bpe-merges", "40").stdout
    assert "redo  tokenize_test: output missing" in out and (work / "tok" / "test.de").is_file()


def test_failed_stage_reruns_once_its_input_is_fixed(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    given = tmp_path / "de-en.tgz"  # the user's archive: truncated, then a wrong one, then the right one
    work, dest = tmp_path / "work", tmp_path / "bin"
    given.write_bytes(archive.read_bytes()[:3000])
    with pytest.raises(PrepError, match="truncated or not a valid archive"):
        prep_in_process("iwslt14", "--from", given, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    assert not (work / ".stage.done").exists()
    with tarfile.open(given, "w:gz") as tar:
        add_text(tar, "de-en/README", "not the corpus\n")
    with pytest.raises(PrepError, match="cannot find train.tags.de-en.de"):
        prep_in_process("iwslt14", "--from", given, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    given.write_bytes(archive.read_bytes())
    os.utime(given, ns=(time.time_ns(), time.time_ns() + 10**9))  # a copy may keep the old second
    assert prep_in_process("iwslt14", "--from", given, "--work", work, "--dest", dest,
                           "--bpe-merges", MERGES) == dest
    assert not (work / "orig" / "de-en" / "README").read_text().startswith("not the corpus")
    assert (dest / "dict.de.txt").is_file()


def test_kill_during_binarization_then_rerun(tmp_path):
    """Killing data-prep while fairseq-preprocess writes leaves no destination folder, and the
    rerun (which used to stop with FileExistsError: dict.de.txt) completes."""
    archive = tmp_path / "de-en.tgz"
    make_iwslt_archive(archive)
    work, dest = tmp_path / "work", tmp_path / "bin"
    args = ["--from", archive, "--work", work, "--dest", dest, "--bpe-merges", MERGES]
    run_prep("prepare-iwslt14.sh", *args)
    (work / ".binarize.done").unlink()
    shutil_rmtree(dest)
    # fairseq-preprocess stops where it has written the dictionaries and logs the first split it
    # binarizes (pausing.py): data-prep is killed there, not at a moment caught by polling
    hook, reached, _ = pause_env(tmp_path, "fairseq-preprocess", "] Dictionary: ", pythonpath="")
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", **hook}  # no __pycache__ in the repository
    proc = subprocess.Popen(["bash", str(PREP / "prepare-iwslt14.sh"), *map(str, args), "--allow-nonstandard-splits"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(reached, proc)
        (partial,) = tmp_path.glob(".bin.partial-*")
        assert (partial / "dict.de.txt").is_file() and (partial / "dict.en.txt").is_file()
        assert not list(partial.glob("*.bin"))  # between the dictionaries and the binaries
        os.kill(proc.pid, signal.SIGKILL)  # the python process (the .sh execs it)
        proc.wait(timeout=60)
        preprocess = int(reached.read_text())
        deadline = time.monotonic() + 60  # fairseq-preprocess dies with it (no orphan writing on)
        while os.path.exists(f"/proc/{preprocess}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{preprocess}"), "fairseq-preprocess outlived data-prep"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not dest.exists()  # nothing half-written under the final name
    assert list(tmp_path.glob(".bin.partial-*"))  # the partial folder is where the kill left it
    stale_old = tmp_path / ".bin.old-999999999"  # a kill between the two renames (no such pid)
    stale_old.mkdir()
    (stale_old / MARKER).write_text("x\n")
    foreign = tmp_path / ".bin.partial-999999998"  # same name pattern, not ours: left alone
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x\n")
    out = run_prep("prepare-iwslt14.sh", *args).stdout
    assert "removing" in out and "start binarize" in out
    assert (dest / "dict.de.txt").is_file() and (dest / "test.de-en.en.bin").is_file()
    assert sorted(p.name for p in tmp_path.glob(".bin.*")) == [foreign.name]


def shutil_rmtree(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def test_foreign_folders_are_refused_and_inputs_untouched(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    mine = tmp_path / "my-data"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    with pytest.raises(PrepError, match="--dest .* not made by data-prep .* refusing to replace it"):
        prep_in_process("iwslt14", "--from", archive, "--work", tmp_path / "w", "--dest", mine,
                        "--bpe-merges", MERGES)
    assert (mine / "notes.txt").read_text() == "keep me\n" and len(list(mine.iterdir())) == 1
    with pytest.raises(PrepError, match="--work .* not made by data-prep .* refusing to write into it"):
        prep_in_process("iwslt14", "--from", archive, "--work", mine, "--dest", tmp_path / "b")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    with pytest.raises(PrepError, match="overlap"):
        prep_in_process("iwslt14", "--from", archive, "--work", tmp_path / "w", "--dest", tmp_path / "w" / "bin")
    size = archive.stat().st_size
    with pytest.raises(PrepError, match="overlap"):
        prep_in_process("iwslt14", "--from", archive.parent, "--work", tmp_path / "w", "--dest", archive.parent / "x")
    with pytest.raises(PrepError, match="overlap"):  # <work>/orig is emptied before staging
        prep_in_process("iwslt14", "--from", tmp_path / "w" / "orig", "--work", tmp_path / "w", "--dest", tmp_path / "b")
    with pytest.raises(PrepError, match="overlap"):  # a --from folder holding --work changes every run
        prep_in_process("iwslt14", "--from", tmp_path, "--work", tmp_path / "w", "--dest", tmp_path.parent / "b")
    assert archive.stat().st_size == size


def test_a_work_folder_in_use_is_refused_and_left_alone(iwslt_fixture, tmp_path):
    """Two preparations sharing --work (the default is one per dataset) would rewrite each other's
    intermediate files between steps: the second is refused while the first runs, and runs after."""
    from man_recipes.data import multi30k

    archive, _, _ = iwslt_fixture
    work, dest = tmp_path / "w", tmp_path / "b"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom man_recipes.data.steps import work_lock\n"
         "with work_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(300)", str(work)],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted((p.name, p.stat().st_size) for p in work.iterdir())
        with pytest.raises(PrepError, match="--work .* is in use by another preparation still running"):
            prep_in_process("iwslt14", "--from", archive, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
        assert multi30k.main(["--from", str(tmp_path / "none"), "--work", str(work), "--dest", str(dest)]) == 2
        assert not dest.exists() and sorted((p.name, p.stat().st_size) for p in work.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    assert prep_in_process("iwslt14", "--from", archive, "--work", work, "--dest", dest,
                           "--bpe-merges", MERGES) == dest.absolute()


def test_truncated_or_wrong_archive_is_a_clear_error(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    truncated = tmp_path / "de-en.tgz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    proc = run_prep("prepare-iwslt14.sh", "--from", truncated, "--work", tmp_path / "w1",
                    "--dest", tmp_path / "b1", check=False)
    assert proc.returncode == 2 and "truncated or not a valid archive" in proc.stdout
    assert "binarized data" not in proc.stdout and not (tmp_path / "b1").exists()

    wrong = tmp_path / "other.tgz"
    with tarfile.open(wrong, "w:gz") as tar:
        add_text(tar, "something/else.txt", "x\n")
    with pytest.raises(PrepError, match=r"cannot find train\.tags\.de-en\.de under .*wrong archive or folder"):
        prep_in_process("iwslt14", "--from", wrong, "--work", tmp_path / "w2", "--dest", tmp_path / "b2")


def test_prep_errors_of_the_shared_steps(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    with pytest.raises(PrepError, match=r"--from .*nowhere: no such file or folder"):
        prep_in_process("iwslt14", "--from", tmp_path / "nowhere", "--work", tmp_path / "w", "--dest", tmp_path / "b")
    text = tmp_path / "de-en.txt"
    text.write_text("x\n")
    with pytest.raises(PrepError, match=r"expected an archive \(\.tgz"):
        prep_in_process("iwslt14", "--from", text, "--work", tmp_path / "w0", "--dest", tmp_path / "b")
    # tar path traversal: a member or a link that points outside the extraction folder
    for name, member in (("evil.tgz", tarfile.TarInfo("../../escaped.txt")),
                         ("link.tgz", tarfile.TarInfo("de-en/link"))):
        if name == "link.tgz":
            member.type, member.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
        with tarfile.open(tmp_path / name, "w:gz") as tar:
            add_text(tar, "de-en/README", "x\n")
            member.size = 0
            tar.addfile(member, io.BytesIO(b""))
        with pytest.raises(PrepError, match="escapes the extraction folder"):
            prep_in_process("iwslt14", "--from", tmp_path / name, "--work", tmp_path / f"w-{name}", "--dest", tmp_path / "b")
    assert not (tmp_path.parent / "escaped.txt").exists()
    # misaligned train.tags (one English line missing)
    bad = tmp_path / "misaligned.tgz"
    with tarfile.open(archive) as src, tarfile.open(bad, "w:gz") as tar:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name.endswith("train.tags.de-en.en"):
                data = b"\n".join(data.split(b"\n")[:-2]) + b"\n"
            add_text(tar, m.name, data.decode("utf-8"))
    with pytest.raises(PrepError, match=r"train\.tags\.de-en\.\*: \d+ German but \d+ English lines"):
        prep_in_process("iwslt14", "--from", bad, "--work", tmp_path / "w3", "--dest", tmp_path / "b")


def test_an_empty_split_is_named_before_bpe(tmp_path):
    from man_recipes.data.dataprep import split_counts

    for name, text in (("train.de", "a\n"), ("train.en", "b\n"), ("valid.de", ""), ("valid.en", "")):
        (tmp_path / name).write_text(text)
    assert split_counts(tmp_path, "de", "en", ("train",)) == {"train": 1}
    with pytest.raises(PrepError, match=f"^valid: {tmp_path / 'valid.de'} and .en hold no lines; nothing to prepare$"):
        split_counts(tmp_path, "de", "en", ("train", "valid"))


def test_nonstandard_split_is_an_error(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    with pytest.raises(PrepError, match=r"train has \d+ pairs, the standard split has 160,239.*"
                                        r"--allow-nonstandard-splits"):
        prep_in_process("iwslt14", "--from", archive, "--work", tmp_path / "w", "--dest", tmp_path / "b",
                        "--bpe-merges", MERGES, allow=False)
    assert not (tmp_path / "b").exists()
    proc = run_prep("prepare-iwslt14.sh", "--from", archive, "--work", tmp_path / "w",
                    "--dest", tmp_path / "b", "--bpe-merges", MERGES)
    assert "skip  tokenize_train" in proc.stdout and "DIFFERS" in proc.stdout  # the flag: goes on


def test_iwslt14_real_samples(shared_data):
    from man_recipes.data.dataprep import read_seg_lines

    sample = shared_data / "iwslt14-sample"
    for lang in ("de", "en"):
        assert len(read_seg_lines(sample / f"IWSLT14.TED.dev2010.de-en.{lang}.xml")) == 887
    # fairseq's valid.* reproduced line for line (text and BPE): tests/test_tokenizer.py


# -------------------------------------------------------------------------------- WMT14

def sgm(setid, lang, segs, kind):
    body = "\n".join(f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segs, 1))
    return (f'<{kind}set setid="{setid}" srclang="any" trglang="{lang}">\n<doc sysid="ref" docid="d1" '
            f'genre="news" origlang="en">\n<p>\n{body}\n</p>\n</doc>\n</{kind}set>\n')


def make_wmt_folder(src_dir, en_l, de_l):
    """The five WMT14 downloads (training/dev/test-full tarballs) in ``src_dir``."""
    src_dir.mkdir()
    en_l, de_l = list(en_l), list(de_l)
    en_l[0], de_l[0] = "A well-known state-of-the-art test.", "Ein bekannter Test."
    chunks = {"training-parallel-europarl-v7.tgz": ("training/europarl-v7.de-en", 0, 100),
              "training-parallel-commoncrawl.tgz": ("commoncrawl.de-en", 100, 200),
              "training-parallel-nc-v9.tgz": ("training/news-commentary-v9.de-en", 200, 300)}
    for archive, (prefix, a, b) in chunks.items():
        with tarfile.open(src_dir / archive, "w:gz") as tar:
            add_text(tar, f"{prefix}.en", "\n".join(en_l[a:b]) + "\n")
            add_text(tar, f"{prefix}.de", "\n".join(de_l[a:b]) + "\n")
    with tarfile.open(src_dir / "dev.tgz", "w:gz") as tar:
        add_text(tar, "dev/newstest2013.en", "\n".join(en_l[:40]) + "\n")
        add_text(tar, "dev/newstest2013.de", "\n".join(de_l[:40]) + "\n")
    test_en, test_de = en_l[50:80], de_l[50:80]
    test_de[0] = "Das \u201eHaus\u201c ist gro\u00df-artig."
    with tarfile.open(src_dir / "test-full.tgz", "w:gz") as tar:
        add_text(tar, "test-full/newstest2014-deen-src.en.sgm", sgm("newstest2014", "en", test_en, "src"))
        add_text(tar, "test-full/newstest2014-deen-ref.de.sgm", sgm("newstest2014", "de", test_de, "ref"))
        add_text(tar, "test-full/newstest2014-deen-src.de.sgm", sgm("newstest2014", "de", test_de, "src"))
    return test_en, test_de


def check_wmt_run(tmp_path, src_dir, test_de):
    work, dest = tmp_path / "work", tmp_path / "bin"
    run_prep("prepare-wmt14en2de.sh", "--from", src_dir, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    tok = work / "tok"
    assert len(lines(tok / "valid.en")) == 40          # newstest2013, not a slice of train
    assert len(lines(tok / "test.de")) == 30           # newstest2014 from the SGML reference
    assert lines(tok / "train.all.en")[0] == "A well @-@ known state @-@ of @-@ the @-@ art test ."  # -a
    assert lines(dest / "test.raw.de") == test_de      # untokenized reference for sacreBLEU
    assert (dest / "dict.en.txt").read_text() == (dest / "dict.de.txt").read_text()  # joined
    assert json.loads((work / "prep" / "counts.json").read_text())["test"] == 30
    return work


def test_wmt14_from_folder_of_archives(tmp_path):
    rng = random.Random(1)
    en_l = [sentence(rng, WORDS_EN, rng.randint(3, 12)) for _ in range(300)]
    de_l = [sentence(rng, WORDS_DE, rng.randint(3, 12)) for _ in range(300)]
    de_l[5] = 'Er sagte: "Gut."'  # normalize-punctuation -l de moves the final period out of the quotes
    src_dir = tmp_path / "downloads"
    _, test_de = make_wmt_folder(src_dir, en_l, de_l)
    work = check_wmt_run(tmp_path, src_dir, test_de)
    assert lines(work / "tok" / "train.all.de")[5] == "Er sagte : &quot; Gut &quot; ."


def test_wmt14_real_sample(shared_data, tmp_path):
    """Real WMT text (the sample is Moses-tokenized: detokenized back to raw first)."""
    from sacremoses import MosesDetokenizer

    en_l = [MosesDetokenizer(lang="en").detokenize(l.split()) for l in lines(shared_data / "wmt14-sample/src-train.txt")[:300]]
    de_l = [MosesDetokenizer(lang="de").detokenize(l.split()) for l in lines(shared_data / "wmt14-sample/tgt-train.txt")[:300]]
    src_dir = tmp_path / "downloads"
    _, test_de = make_wmt_folder(src_dir, en_l, de_l)
    check_wmt_run(tmp_path, src_dir, test_de)


def test_wmt14_wrong_layout_or_truncated(tmp_path):
    rng = random.Random(3)
    en_l = [sentence(rng, WORDS_EN, 5) for _ in range(300)]
    de_l = [sentence(rng, WORDS_DE, 5) for _ in range(300)]
    src_dir = tmp_path / "downloads"
    make_wmt_folder(src_dir, en_l, de_l)
    (src_dir / "test-full.tgz").unlink()  # newstest2014 missing
    with pytest.raises(PrepError, match=r"cannot find newstest2014-deen-src\.en\.sgm under"):
        prep_in_process("wmt14", "--from", src_dir, "--work", tmp_path / "w1", "--dest", tmp_path / "b")
    data = (src_dir / "dev.tgz").read_bytes()
    (src_dir / "dev.tgz").write_bytes(data[: len(data) // 2])
    with pytest.raises(PrepError, match=r"dev\.tgz is truncated or not a valid archive"):
        prep_in_process("wmt14", "--from", src_dir, "--work", tmp_path / "w2", "--dest", tmp_path / "b")


# ----------------------------------------------------------------------------- CNN / DM

def make_cnndm_folder(src_dir):
    from man_recipes.data.cnndm import url_hash

    src_dir.mkdir()
    urls = {split: [f"http://www.cnn.com/{split}/{i}.html" if i % 2 else f"http://www.dailymail.co.uk/{split}/{i}"
                    for i in range(n)] for split, n in (("train", 12), ("val", 4), ("test", 5))}
    story = ("(CNN) -- The dog ran across the street.\n\nIt was 'fast'.\n\n@highlight\n\n"
             "Dog runs fast\n\n@highlight\n\nStreet crossed!\n")
    for name, domain in (("cnn_stories.tgz", "cnn"), ("dailymail_stories.tgz", "dailymail")):
        with tarfile.open(src_dir / name, "w:gz") as tar:
            for split_urls in urls.values():
                for u in split_urls:
                    if (domain == "cnn") == ("cnn.com" in u):
                        add_text(tar, f"{domain}/stories/{url_hash(u)}.story", story.replace("dog", f"dog {u[-6:]}"))
    for split, us in urls.items():
        (src_dir / f"all_{split}.txt").write_text("\n".join(us) + "\n")
    return story


def test_cnndm_story_archives(tmp_path):
    from man_recipes.data.cnndm import story_to_pair

    src_dir = tmp_path / "cnndm"
    story = make_cnndm_folder(src_dir)
    assert story_to_pair(story) == ("(CNN) -- The dog ran across the street. It was 'fast'.",
                                    "Dog runs fast . Street crossed!")
    work, dest = tmp_path / "work", tmp_path / "bin"
    run_prep("prepare-cnndm.sh", "--from", src_dir, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    counts = json.loads((work / "tok" / "counts.json").read_text())
    assert counts == {"train": 12, "valid": 4, "test": 5}
    assert lines(work / "tok" / "test.target")[0] == "dog runs fast . street crossed !"
    assert (dest / "test.source-target.source.bin").is_file()
    record = json.loads((dest / "cnndm.json").read_text())
    assert record["test_sets"] == {"test": "CNN/DM test split (See et al. 2017 URL list all_test.txt)"}
    assert record["release_counts"] == counts and "story archives" in record["options"]["layout"]
    assert lines(dest / "test.raw.target") == lines(work / "tok" / "test.target")


def test_cnndm_wrong_layout_or_truncated(tmp_path):
    src_dir = tmp_path / "cnndm"
    make_cnndm_folder(src_dir)
    # a story listed in the URL list but absent from the archives is an error, not a silent drop
    listed = (src_dir / "all_test.txt").read_text()
    (src_dir / "all_test.txt").write_text(listed + "http://www.cnn.com/missing.html\n")
    with pytest.raises(PrepError, match=r"test: 1 of 6 stories listed in all_test\.txt are missing "
                                        r"\(first: http://www\.cnn\.com/missing\.html\)"):
        prep_in_process("cnndm", "--from", src_dir, "--work", tmp_path / "w1", "--dest", tmp_path / "b")
    (src_dir / "all_test.txt").write_text(listed)
    data = (src_dir / "cnn_stories.tgz").read_bytes()
    (src_dir / "cnn_stories.tgz").write_bytes(data[: len(data) // 2])
    with pytest.raises(PrepError, match=r"cnn_stories\.tgz is truncated or not a valid archive"):
        prep_in_process("cnndm", "--from", src_dir, "--work", tmp_path / "w2", "--dest", tmp_path / "b")
    other = tmp_path / "other"
    other.mkdir()
    (other / "readme.txt").write_text("x\n")
    with pytest.raises(PrepError, match=r"no \*\.story files and no \{val,train,test\}\.source/\.target found"):
        prep_in_process("cnndm", "--from", other, "--work", tmp_path / "w3", "--dest", tmp_path / "b")
    (other / "val.source").write_text("a\n")
    with pytest.raises(PrepError, match=r"has val\.source but no train\.source / train\.source"):
        prep_in_process("cnndm", "--from", other, "--work", tmp_path / "w4", "--dest", tmp_path / "b")


def test_cnndm_presplit_folder_rerun_skips(tmp_path, capsys):
    """A --from folder without archives: the second run finds every stamp current."""
    rng = random.Random(5)
    folder = tmp_path / "presplit"
    folder.mkdir()
    for split, n in (("train", 30), ("val", 5), ("test", 5)):
        (folder / f"{split}.source").write_text("\n".join(sentence(rng, WORDS_EN, 12) for _ in range(n)) + "\n")
        (folder / f"{split}.target").write_text("\n".join(sentence(rng, WORDS_EN, 4) for _ in range(n)) + "\n")
    argv = ["cnndm", "--from", folder, "--work", tmp_path / "w", "--dest", tmp_path / "b", "--bpe-merges", MERGES]
    prep_in_process(*argv)
    capsys.readouterr()
    prep_in_process(*argv)
    out = capsys.readouterr().out
    for step in ("stage", "make_splits", "tokenize", "learn_bpe", "apply_bpe", "binarize"):
        assert f"skip  {step}" in out
    assert "redo  " not in out and "start " not in out


def test_cnndm_real_sample_presplit(shared_data, tmp_path):
    sample = shared_data / "cnndm-sample"
    src = lines(sample / "val.source")
    tgt = lines(sample / "val.target")
    folder = tmp_path / "presplit"
    folder.mkdir()
    # 120/40/40 real articles: Moses-tokenizing long articles dominates the run time
    for split, (a, b) in {"train": (0, 120), "val": (120, 160), "test": (160, 200)}.items():
        (folder / f"{split}.source").write_text("\n".join(src[a:b]) + "\n")
        (folder / f"{split}.target").write_text("\n".join(tgt[a:b]) + "\n")
    work = tmp_path / "work"
    run_prep("prepare-cnndm.sh", "--from", folder, "--work", work, "--dest", tmp_path / "bin",
             "--bpe-merges", MERGES, "--max-source-tokens", "50")
    tok = work / "tok"
    assert json.loads((tok / "counts.json").read_text()) == {"train": 120, "valid": 40, "test": 40}
    assert max(len(l.split()) for l in lines(tok / "test.source")) == 50
    assert max(len(l.split()) for l in lines(tmp_path / "bin" / "test.raw.source")) > 50  # for lead baselines
    assert json.loads((tmp_path / "bin" / "cnndm.json").read_text())["options"]["layout"].startswith(
        f"one article / summary a line in {folder}")
    assert lines(tok / "test.target")[0] == lines(tok / "test.target")[0].lower()


# ------------------------------------------------------------------------------ Gigaword

def make_sumdata(tmp_path, art, ttl):
    """The Rush et al. release as distributed: sumdata/train/*.txt.gz (train and valid),
    sumdata/Giga/ (the test set) and sumdata/DUC2003/, DUC2004/ (other test sets, same names)."""
    root = tmp_path / "sumdata"
    for sub in ("train", "Giga", "DUC2003", "DUC2004"):
        (root / sub).mkdir(parents=True)

    def gz(path, rows):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    gz(root / "train/train.article.txt.gz", art[:400] + [""])
    gz(root / "train/train.title.txt.gz", ttl[:400] + ["orphan title"])
    gz(root / "train/valid.article.filter.txt.gz", art[400:500])
    gz(root / "train/valid.title.filter.txt.gz", ttl[400:500])
    (root / "Giga/input.txt").write_text("\n".join(art[500:600]) + "\n")
    (root / "Giga/task1_ref0.txt").write_text("\n".join(ttl[500:600]) + "\n")
    for duc in ("DUC2003", "DUC2004"):  # sorted first: never to be taken as the Gigaword test set
        (root / duc / "input.txt").write_text("duc article\n" * 7)
        (root / duc / "task1_ref0.txt").write_text("duc title\n" * 7)
    archive = tmp_path / "summary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="sumdata")
    return archive


def check_gigaword_run(tmp_path, art, ttl):
    archive = make_sumdata(tmp_path, art, ttl)
    work = tmp_path / "work"
    out = run_prep("prepare-gigaword.sh", "--from", archive, "--work", work, "--dest", tmp_path / "bin",
                   "--bpe-merges", MERGES).stdout
    counts = json.loads((work / "tok" / "counts.json").read_text())
    assert counts == {"train": 400, "valid": 100, "test": 100}  # the empty-article pair is cleaned
    assert lines(work / "tok" / "test.title") == [" ".join(t.split()) for t in ttl[500:600]]
    # the dev set's raw text lies beside the data too, named in the record (a checkpoint's ROUGE on it)
    record = json.loads((tmp_path / "bin" / "gigaword.json").read_text())
    assert record["dev_sets"] == {"valid": prepare.GIGAWORD_DEV_NAME} and list(record["test_sets"]) == ["test"]
    assert lines(tmp_path / "bin" / record["references"]["valid"]) == [" ".join(t.split()) for t in ttl[400:500]]
    assert lines(tmp_path / "bin" / record["sources"]["valid"]) == [" ".join(a.split()) for a in art[400:500]]
    assert "standard: 1,951, DIFFERS" in out and "train: 401 pairs (standard: 3,803,957, DIFFERS)" in out


def test_gigaword_sumdata_layout(tmp_path):
    rng = random.Random(2)
    art = [sentence(rng, WORDS_EN, 20).lower() for _ in range(600)]
    ttl = [sentence(rng, WORDS_EN, 6).lower() for _ in range(600)]
    check_gigaword_run(tmp_path, art, ttl)


def test_gigaword_real_sample(shared_data, tmp_path):
    art = lines(shared_data / "gigaword-sample/valid.article.filter.4K.txt")[:600]
    ttl = lines(shared_data / "gigaword-sample/valid.title.filter.4K.txt")[:600]
    check_gigaword_run(tmp_path, art, ttl)


def test_gigaword_wrong_layout_or_truncated(tmp_path):
    rng = random.Random(4)
    art = [sentence(rng, WORDS_EN, 8).lower() for _ in range(600)]
    ttl = [sentence(rng, WORDS_EN, 3).lower() for _ in range(600)]
    make_sumdata(tmp_path, art, ttl)
    root = tmp_path / "sumdata"
    # no Giga/ folder: DUC2003/input.txt has the right name but is not the test set
    import shutil

    shutil.move(root / "Giga", tmp_path / "Giga-aside")
    with pytest.raises(PrepError, match=r"cannot find Giga/input\.txt under"):
        prep_in_process("gigaword", "--from", root, "--work", tmp_path / "w1", "--dest", tmp_path / "b")
    shutil.move(tmp_path / "Giga-aside", root / "Giga")
    # articles and titles of different lengths
    (root / "Giga/task1_ref0.txt").write_text("\n".join(ttl[500:599]) + "\n")
    with pytest.raises(PrepError, match=r"gigaword test: 100 articles \(input\.txt\) but 99 titles"):
        prep_in_process("gigaword", "--from", root, "--work", tmp_path / "w2", "--dest", tmp_path / "b")
    (root / "Giga/task1_ref0.txt").write_text("\n".join(ttl[500:600]) + "\n")
    # a truncated .gz inside the release
    data = (root / "train/train.title.txt.gz").read_bytes()
    (root / "train/train.title.txt.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(PrepError, match=r"train\.title\.txt\.gz: corrupt or truncated gzip data \(EOFError"):
        prep_in_process("gigaword", "--from", root, "--work", tmp_path / "w3", "--dest", tmp_path / "b")
    # the standard sizes are enforced without --allow-nonstandard-splits
    (tmp_path / "fresh").mkdir()
    archive = make_sumdata(tmp_path / "fresh", art, ttl)
    with pytest.raises(PrepError, match=r"test has 100 pairs, the standard split has 1,951"):
        prep_in_process("gigaword", "--from", archive, "--work", tmp_path / "w4",
                        "--dest", tmp_path / "b", allow=False)


def test_download_path_against_a_local_http_server(iwslt_fixture, tmp_path):
    """fetch(): size check, SHA-256 recorded then enforced, truncated download refused.

    Served from localhost: the real mirrors are out of reach here, the code path is the same.
    """
    import functools
    import http.server
    import threading

    from man_recipes.data.downloads import fetch

    archive, _, _ = iwslt_fixture
    served = tmp_path / "served"
    served.mkdir()
    (served / "de-en.tgz").write_bytes(archive.read_bytes())
    (served / "broken.tgz").write_bytes(archive.read_bytes()[:200])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sums = tmp_path / "dl" / "SHA256SUMS.json"
        got = fetch(f"{base}/de-en.tgz", tmp_path / "dl" / "de-en.tgz", checksum_file=sums)
        assert got.read_bytes() == archive.read_bytes()
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        assert json.loads(sums.read_text()) == {"de-en.tgz": digest}
        fetch(f"{base}/de-en.tgz", got, checksum_file=sums)  # present and matching: kept
        got.write_bytes(got.read_bytes()[:-10] + b"0123456789")
        with pytest.raises(PrepError, match="SHA-256 differs"):
            fetch(f"{base}/de-en.tgz", got, checksum_file=sums)
        with pytest.raises(PrepError, match="truncated or not a valid archive"):
            fetch(f"{base}/broken.tgz", tmp_path / "dl" / "broken.tgz", checksum_file=sums)
        assert not (tmp_path / "dl" / "broken.tgz").exists()  # so a rerun downloads it again
        with pytest.raises(PrepError, match="does not match the expected"):
            fetch(f"{base}/de-en.tgz", tmp_path / "dl2" / "de-en.tgz", expected_sha256="0" * 64)
    finally:
        server.shutdown()


def test_binarize_adds_extra_test_sets_inside_the_atomic_build_and_a_failure_leaves_nothing(tmp_path):
    from man_recipes.data.binarize import binarize

    prep = tmp_path / "prep"
    prep.mkdir()
    words = ["ein", "hund", "läuft", "a", "dog", "runs", "zwei", "two"]
    rng = random.Random(0)
    for split, n in [("train", 40), ("valid", 5), ("test", 5), ("test_2017", 4)]:
        for lang in ("de", "en"):
            (prep / f"{split}.{lang}").write_text(
                "".join(" ".join(rng.choices(words, k=5)) + "\n" for _ in range(n)), encoding="utf-8")
    dest = binarize(prep, tmp_path / "bin", "de", "en", extra_test_sets=["test_2017"])
    for name in ("test.de-en.de.bin", "test_2017.de-en.de.bin", "test_2017.de-en.en.idx", "dict.en.txt"):
        assert (dest / name).is_file(), name
    assert not list(dest.glob("_*")) and not list(tmp_path.glob(".bin.partial-*"))

    # a test set that cannot be binarized: an error, the finished --dest untouched, no leftovers
    before = sorted(p.name for p in dest.iterdir())
    with pytest.raises(PrepError, match="fairseq-preprocess failed for missing"):
        binarize(prep, dest, "de", "en", extra_test_sets=["missing"])
    assert sorted(p.name for p in dest.iterdir()) == before
    assert not list(tmp_path.glob(".bin.partial-*"))
