"""A user's text that is not UTF-8 is an error naming the file and its first bad line, in every
command that reads it (data-prep, the demo's --data, evaluation's raw references, analysis
input); nothing is replaced by U+FFFD."""

import gzip
import io
import sys
import tarfile
from types import SimpleNamespace

import pytest
from conftest import REPO, call_entry_point

from man_recipes import textfile
from man_recipes.data.dataprep import PrepError, read_lines

LATIN1 = ["Ein Hund läuft.", "Zwei Männer stehen.", "Ein Mädchen spielt."]
FIRST_BAD = 1  # "läuft": the first line has a byte that is not UTF-8


def write_latin1(path, lines=LATIN1):
    data = ("\n".join(lines) + "\n").encode("latin-1")
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def test_reader_returns_utf8_lines_as_written(tmp_path):
    plain = tmp_path / "a.de"
    plain.write_bytes("Ein Hund läuft.\r\nZwei\n\nÜber\n".encode("utf-8"))
    assert textfile.read_lines(plain) == ["Ein Hund läuft.", "Zwei", "", "Über"]
    packed = tmp_path / "a.de.gz"
    with gzip.open(packed, "wb") as f:
        f.write("x\u2028y\nz".encode("utf-8"))  # split at "\n" only, no final newline needed
    assert textfile.read_lines(packed) == ["x\u2028y", "z"]
    assert textfile.read_text(plain) == "Ein Hund läuft.\r\nZwei\n\nÜber\n"


@pytest.mark.parametrize("name", ["val.de", "val.de.gz"])
def test_text_that_is_not_utf8_names_the_file_and_first_bad_line(tmp_path, name):
    path = write_latin1(tmp_path / name, ["all ascii", "still ascii", *LATIN1])
    with pytest.raises(textfile.NotUtf8Error) as info:
        textfile.read_lines(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 3 is not UTF-8 text (0xe4 at byte 11 of the line)")
    assert "iconv" in message and info.value.line == 3
    with pytest.raises(textfile.NotUtf8Error, match=r": line 3 is not UTF-8 text \(0xe4 at byte 11 "):
        textfile.read_text(path)


def test_data_prep_reader_refuses_it_as_a_prep_error(tmp_path):
    path = write_latin1(tmp_path / "train.de")
    with pytest.raises(PrepError, match=rf"{path}: line {FIRST_BAD} is not UTF-8"):
        read_lines(path)


def test_multi30k_with_a_latin1_file_stops_naming_it_and_writes_nothing(tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    from test_multi30k import synthetic_release

    from man_recipes.data import multi30k

    folder = synthetic_release(tmp_path / "raw")
    write_latin1(folder / "val.de", LATIN1 * 10)  # as many lines as val.en, only the encoding differs
    dest = tmp_path / "data-bin"
    proc = call_entry_point(multi30k.main, ["--from", folder, "--work", tmp_path / "work", "--dest", dest,
                                            "--allow-nonstandard-splits"], prog="prepare-multi30k.sh")
    assert proc.returncode == 2
    assert f"ERROR: {folder / 'val.de'}: line {FIRST_BAD} is not UTF-8 text" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not dest.exists()
    assert not list((tmp_path / "work").rglob("val.de"))  # no replaced copy left behind


def test_cnndm_story_that_is_not_utf8_is_named(tmp_path):
    from man_recipes.data.cnndm import url_hash
    from man_recipes.data.prepare import run

    src = tmp_path / "cnndm"
    src.mkdir()
    urls = {split: [f"http://www.cnn.com/{split}/{i}.html" if i % 2 else f"http://www.dailymail.co.uk/{split}/{i}"
                    for i in range(n)] for split, n in (("train", 3), ("val", 2), ("test", 2))}
    story = "(CNN) -- The dog ran.\n\n@highlight\n\nDog runs\n"
    bad = url_hash(urls["val"][1])
    for name, domain in (("cnn_stories.tgz", "cnn"), ("dailymail_stories.tgz", "dailymail")):
        with tarfile.open(src / name, "w:gz") as tar:
            for u in (u for split_urls in urls.values() for u in split_urls if (domain == "cnn") == ("cnn.com" in u)):
                text = story.replace("ran", "ran to Zürich") if url_hash(u) == bad else story
                data = text.encode("latin-1")
                info = tarfile.TarInfo(f"{domain}/stories/{url_hash(u)}.story")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    for split, us in urls.items():
        (src / f"all_{split}.txt").write_text("\n".join(us) + "\n")
    with pytest.raises(PrepError, match=rf"{bad}\.story: line 1 is not UTF-8 text \(0xfc at byte 26 "):
        run(["cnndm", "--from", str(src), "--work", str(tmp_path / "work"), "--dest", str(tmp_path / "bin"),
             "--allow-nonstandard-splits"])
    assert not (tmp_path / "bin").exists()


def test_demo_user_data_that_is_not_utf8_is_named(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import demo

    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.de").write_text("a b\nc\nd\n", encoding="utf-8")
        (tmp_path / f"{split}.en").write_text("x\ny z\nw\n", encoding="utf-8")
    write_latin1(tmp_path / "valid.de")
    with pytest.raises(SystemExit, match=rf"demo: {tmp_path / 'valid.de'}: line {FIRST_BAD} is not UTF-8"):
        demo.check_user_data(tmp_path, "de", "en")


def test_raw_references_that_are_not_utf8_stop_scoring_naming_the_file(tmp_path):
    from man_recipes.evaluation.evaluate import score_decoded

    refs = write_latin1(tmp_path / "test.raw.de")
    cfg = {"eval": {"metric": "bleu_wmt", "gen_subset": "test"}, "target_lang": "de"}
    hyps = ["Ein Hund läuft .", "Zwei Männer stehen .", "Ein Mädchen spielt ."]
    with pytest.raises(textfile.NotUtf8Error, match=rf"{refs}: line {FIRST_BAD} is not UTF-8"):
        score_decoded(cfg, tmp_path, "test", hyps, hyps, tmp_path)
    refs.write_text("\n".join(LATIN1) + "\n", encoding="utf-8")
    scores, details = score_decoded(cfg, tmp_path, "test", hyps, hyps, tmp_path)
    # sacreBLEU read the raw references: the detokenized hypotheses are their lines
    assert (tmp_path / "test.detok.hyp").read_text().splitlines() == LATIN1
    assert details["sacrebleu_references"] == f"raw references {refs}" and scores["sacrebleu"] == 100.0


def test_analysis_input_pairs_that_are_not_utf8_are_named(tmp_path):
    from man_recipes.analysis.utils import sentence_pairs_dataset

    pairs = write_latin1(tmp_path / "pairs.txt", ["a b ||| x y", "Männer ||| men"])
    task = SimpleNamespace(source_dictionary=None, target_dictionary=None)
    with pytest.raises(SystemExit, match=rf"{pairs}: line 2 is not UTF-8"):
        sentence_pairs_dataset(task, str(pairs))
