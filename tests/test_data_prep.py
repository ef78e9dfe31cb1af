"""data-prep/prepare-*.sh run offline (--from) on small archives in the real layouts.

Fixture archives are built here: WIT3 de-en.tgz (train.tags.* + IWSLT14.TED*.xml), the WMT
training/dev/test-full tarballs (plain text + SGML), CNN/DailyMail story tarballs with See et
al.'s URL lists, and the Gigaword "sumdata" folder. Real samples from ../shared/data are used
when present.
"""

import hashlib
import io
import json
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, SHARED_DATA

PREP = REPO / "data-prep"
MERGES = "60"  # tiny BPE so the fixtures are quick and still get split into subwords


def run_prep(script, *args, check=True):
    proc = subprocess.run(["bash", str(PREP / script), *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                               "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"})
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return proc


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


@pytest.fixture(scope="module")
def iwslt_fixture(tmp_path_factory):
    rng = random.Random(0)
    tmp = tmp_path_factory.mktemp("iwslt")
    pairs = [(sentence(rng, WORDS_DE, n), sentence(rng, WORDS_EN, n))
             for n in (rng.randint(3, 12) for _ in range(240))]
    pairs[10] = ("Ein", "One two three four five six")            # ratio > 1.5: cleaned away
    pairs[20] = (" ".join(["wort"] * 180), " ".join(["word"] * 180))  # > 175 tokens: cleaned away
    meta = ["<url>http://www.ted.com/talks/a.html</url>", "<keywords>talks</keywords>",
            "<speaker>Someone</speaker>", "<talkid>1</talkid>"]
    de = meta + ["<title>Der Titel</title>", "<description>Eine Beschreibung</description>"] + [p[0] for p in pairs]
    en = meta + ["<title>The title</title>", "<description>A description</description>"] + [p[1] for p in pairs]
    test_sizes = {"IWSLT14.TED.dev2010": 7, "IWSLT14.TEDX.dev2012": 3, "IWSLT14.TED.tst2010": 5,
                  "IWSLT14.TED.tst2011": 4, "IWSLT14.TED.tst2012": 6}
    archive = tmp / "de-en.tgz"
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
    return archive, kept, sum(test_sizes.values())


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
    from sacremoses import MosesTokenizer

    mt = MosesTokenizer(lang="en")
    expected_valid = [mt.tokenize(kept[i - 1][1], return_str=True).lower() for i in range(23, n_clean + 1, 23)]
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

    # idempotent: a second run skips every step and leaves the outputs alone
    mtime = (dest / "train.de-en.de.bin").stat().st_mtime_ns
    again = run_prep("prepare-iwslt14.sh", "--from", archive, "--work", work, "--dest", dest,
                     "--bpe-merges", MERGES).stdout
    for step in ("stage", "tokenize_train", "tokenize_test", "learn_bpe", "apply_bpe", "binarize"):
        assert f"skip  {step}" in again
    assert (dest / "train.de-en.de.bin").stat().st_mtime_ns == mtime

    # resumable: drop the last stamp, only that step runs again
    (work / ".binarize.done").unlink()
    third = run_prep("prepare-iwslt14.sh", "--from", archive, "--work", work, "--dest", dest,
                     "--bpe-merges", MERGES).stdout
    assert "start binarize" in third and "skip  apply_bpe" in third


def test_truncated_or_wrong_archive_is_a_clear_error(iwslt_fixture, tmp_path):
    archive, _, _ = iwslt_fixture
    truncated = tmp_path / "de-en.tgz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    proc = run_prep("prepare-iwslt14.sh", "--from", truncated, "--work", tmp_path / "w1",
                    "--dest", tmp_path / "b1", check=False)
    assert proc.returncode == 2 and "truncated or not a valid archive" in proc.stdout

    wrong = tmp_path / "other.tgz"
    with tarfile.open(wrong, "w:gz") as tar:
        add_text(tar, "something/else.txt", "x\n")
    proc = run_prep("prepare-iwslt14.sh", "--from", wrong, "--work", tmp_path / "w2",
                    "--dest", tmp_path / "b2", check=False)
    assert proc.returncode == 2 and "cannot find train.tags.de-en.de" in proc.stdout


def test_iwslt14_real_samples(shared_data):
    from man_fairseq.recipes.dataprep import apply_bpe_lines, read_seg_lines

    sample = shared_data / "iwslt14-sample"
    for lang in ("de", "en"):
        assert len(read_seg_lines(sample / f"IWSLT14.TED.dev2010.de-en.{lang}.xml")) == 887
    # our BPE application with fairseq's recipe codes reproduces fairseq's valid.en exactly
    valid = lines(sample / "valid.en")[:1500]
    plain = [l.replace("@@ ", "") for l in valid]
    assert apply_bpe_lines(plain, sample / "code") == valid


# -------------------------------------------------------------------------------- WMT14

def sgm(setid, lang, segs, kind):
    body = "\n".join(f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segs, 1))
    return (f'<{kind}set setid="{setid}" srclang="any" trglang="{lang}">\n<doc sysid="ref" docid="d1" '
            f'genre="news" origlang="en">\n<p>\n{body}\n</p>\n</doc>\n</{kind}set>\n')


def test_wmt14_from_folder_of_archives(tmp_path):
    rng = random.Random(1)
    src_dir = tmp_path / "downloads"
    src_dir.mkdir()
    if SHARED_DATA.is_dir():  # real WMT text (detokenized back to raw) when the sample is present
        from sacremoses import MosesDetokenizer

        en_l = lines(SHARED_DATA / "wmt14-sample/src-train.txt")[:300]
        de_l = lines(SHARED_DATA / "wmt14-sample/tgt-train.txt")[:300]
        en_l = [MosesDetokenizer(lang="en").detokenize(l.split()) for l in en_l]
        de_l = [MosesDetokenizer(lang="de").detokenize(l.split()) for l in de_l]
    else:
        en_l = [sentence(rng, WORDS_EN, rng.randint(3, 12)) for _ in range(300)]
        de_l = [sentence(rng, WORDS_DE, rng.randint(3, 12)) for _ in range(300)]
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
    work, dest = tmp_path / "work", tmp_path / "bin"
    run_prep("prepare-wmt14en2de.sh", "--from", src_dir, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    tok = work / "tok"
    assert len(lines(tok / "valid.en")) == 40          # newstest2013, not a slice of train
    assert len(lines(tok / "test.de")) == 30           # newstest2014 from the SGML reference
    assert lines(tok / "train.all.en")[0] == "A well @-@ known state @-@ of @-@ the @-@ art test ."  # -a
    assert lines(dest / "test.raw.de") == test_de      # untokenized reference for sacreBLEU
    assert (dest / "dict.en.txt").read_text() == (dest / "dict.de.txt").read_text()  # joined
    assert json.loads((work / "prep" / "counts.json").read_text())["test"] == 30


# ----------------------------------------------------------------------------- CNN / DM

def test_cnndm_story_archives(tmp_path):
    from man_fairseq.recipes.prepare import story_to_pair, url_hash

    src_dir = tmp_path / "cnndm"
    src_dir.mkdir()
    urls = {split: [f"http://www.cnn.com/{split}/{i}.html" if i % 2 else f"http://www.dailymail.co.uk/{split}/{i}"
                    for i in range(n)] for split, n in (("train", 12), ("val", 4), ("test", 5))}
    story = ("(CNN) -- The dog ran across the street.\n\nIt was 'fast'.\n\n@highlight\n\n"
             "Dog runs fast\n\n@highlight\n\nStreet crossed!\n")
    assert story_to_pair(story) == ("(CNN) -- The dog ran across the street. It was 'fast'.",
                                    "Dog runs fast . Street crossed!")
    for name, domain in (("cnn_stories.tgz", "cnn"), ("dailymail_stories.tgz", "dailymail")):
        with tarfile.open(src_dir / name, "w:gz") as tar:
            for split_urls in urls.values():
                for u in split_urls:
                    if (domain == "cnn") == ("cnn.com" in u):
                        add_text(tar, f"{domain}/stories/{url_hash(u)}.story", story.replace("dog", f"dog {u[-6:]}"))
    for split, us in urls.items():
        (src_dir / f"all_{split}.txt").write_text("\n".join(us) + "\n")
    work, dest = tmp_path / "work", tmp_path / "bin"
    run_prep("prepare-cnndm.sh", "--from", src_dir, "--work", work, "--dest", dest, "--bpe-merges", MERGES)
    counts = json.loads((work / "tok" / "counts.json").read_text())
    assert counts == {"train": 12, "valid": 4, "test": 5}
    assert lines(work / "tok" / "test.target")[0] == "dog runs fast . street crossed !"
    assert (dest / "test.source-target.source.bin").is_file()

    # a story listed in the URL list but absent from the archives is an error, not a silent drop
    (src_dir / "all_test.txt").write_text("http://www.cnn.com/missing.html\n")
    proc = run_prep("prepare-cnndm.sh", "--from", src_dir, "--work", tmp_path / "w2",
                    "--dest", tmp_path / "b2", check=False)
    assert proc.returncode == 2 and "missing" in proc.stdout


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
    assert lines(tok / "test.target")[0] == lines(tok / "test.target")[0].lower()


# ------------------------------------------------------------------------------ Gigaword

def test_gigaword_sumdata_layout(tmp_path):
    if SHARED_DATA.is_dir():
        art = lines(SHARED_DATA / "gigaword-sample/valid.article.filter.4K.txt")[:600]
        ttl = lines(SHARED_DATA / "gigaword-sample/valid.title.filter.4K.txt")[:600]
    else:
        rng = random.Random(2)
        art = [sentence(rng, WORDS_EN, 20).lower() for _ in range(600)]
        ttl = [sentence(rng, WORDS_EN, 6).lower() for _ in range(600)]
    root = tmp_path / "sumdata"
    (root / "train").mkdir(parents=True)
    (root / "Giga").mkdir()
    (root / "train/train.article.txt").write_text("\n".join(art[:400] + [""]) + "\n")
    (root / "train/train.title.txt").write_text("\n".join(ttl[:400] + ["orphan title"]) + "\n")
    (root / "train/valid.article.filter.txt").write_text("\n".join(art[400:500]) + "\n")
    (root / "train/valid.title.filter.txt").write_text("\n".join(ttl[400:500]) + "\n")
    (root / "Giga/input.txt").write_text("\n".join(art[500:600]) + "\n")
    (root / "Giga/task1_ref0.txt").write_text("\n".join(ttl[500:600]) + "\n")
    archive = tmp_path / "summary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="sumdata")
    work = tmp_path / "work"
    out = run_prep("prepare-gigaword.sh", "--from", archive, "--work", work, "--dest", tmp_path / "bin",
                   "--bpe-merges", MERGES).stdout
    counts = json.loads((work / "tok" / "counts.json").read_text())
    assert counts == {"train": 400, "valid": 100, "test": 100}  # the empty-article pair is cleaned
    assert lines(work / "tok" / "test.title") == [" ".join(t.split()) for t in ttl[500:600]]
    assert "standard: 1,951 — differs" in out


def test_download_path_against_a_local_http_server(iwslt_fixture, tmp_path):
    """fetch(): size check, SHA-256 recorded then enforced, truncated download refused.

    Served from localhost: the real mirrors are out of reach here, the code path is the same.
    """
    import functools
    import http.server
    import threading

    from man_fairseq.recipes.dataprep import PrepError, fetch

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
