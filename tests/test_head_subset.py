"""``man_recipes.data.head_subset``: the first pairs of each split, copied unchanged, with the
folder's record; bad input gets one line and replaces nothing."""

import json
import shutil

import pytest
from fairseq.data import indexed_dataset

from man_recipes.data.head_subset import main


def items(data, prefix):
    ds = indexed_dataset.make_dataset(str(data / prefix), impl="mmap")
    return [ds[i].tolist() for i in range(len(ds))]


def test_the_first_pairs_with_their_record(gigaword_like_bin, tmp_path):
    source = tmp_path / "data"
    shutil.copytree(gigaword_like_bin, source)
    references = "".join(f"reference {i}\n" for i in range(20))
    (source / "test.raw.title").write_text(references)  # the file the record names for scoring
    dest = tmp_path / "sub"
    assert main([str(source), str(dest), "--pairs", "train=7,test=3"]) == 0
    assert (dest / "test.raw.title").read_text() == "reference 0\nreference 1\nreference 2\n"
    assert not (dest / "test.raw.article").exists()  # named, but the source folder has none
    for split, n in (("train", 7), ("test", 3)):
        for lang in ("article", "title"):
            prefix = f"{split}.article-title.{lang}"
            assert items(dest, prefix) == items(source, prefix)[:n]
    assert not list(dest.glob("valid.*"))
    record = json.loads((dest / "gigaword.json").read_text())
    original = json.loads((source / "gigaword.json").read_text())
    assert record["counts"] == {"train": 7, "valid": 0, "test": 3}
    assert record["head_subset"]["first_pairs"] == {"train": 7, "test": 3}
    assert record["test_sets"] == original["test_sets"]
    assert (dest / "dict.article.txt").read_text() == (source / "dict.article.txt").read_text()
    assert record["references"] == original["references"]


@pytest.mark.parametrize("pairs, message", [
    ("train=100000", "but"), ("nosuch=3", "has no split 'nosuch'"), ("train=0", "expected SPLIT=N"),
])
def test_bad_input_gets_one_line(gigaword_like_bin, tmp_path, capsys, pairs, message):
    dest = tmp_path / "sub"
    with pytest.raises(SystemExit) as e:
        main([str(gigaword_like_bin), str(dest), "--pairs", pairs])
    assert e.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not dest.exists()


def test_an_existing_folder_is_not_replaced(gigaword_like_bin, tmp_path, capsys):
    dest = tmp_path / "sub"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit) as e:
        main([str(gigaword_like_bin), str(dest), "--pairs", "train=2"])
    assert e.value.code == 2 and "exists; it is not replaced" in capsys.readouterr().err
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]
