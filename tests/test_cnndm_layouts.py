"""CNN/DailyMail in the layouts users have: See et al.'s text files (``cnndm-see/``) and their
``finished_files`` ``.bin`` release, read by :mod:`man_recipes.data.see_bin` without TensorFlow.

The ``.bin`` decoder is checked on records encoded here (a tiny protobuf encoder below; the
protobuf library, where installed, cross-checks both directions) and on See et al.'s own chunk
files in ``../shared/data/cnndm-see/finished_files_sample``. The recipe runs on slices of the
shared ``cnndm-see`` files (the whole folder takes minutes; timed by hand in docs/data-prep.md).
"""

import gzip
import json
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest

from man_recipes.data.dataprep import PrepError
from man_recipes.data.see_bin import decode_example, read_pairs, split_files

MERGES = "60"  # tiny BPE: the runs stay quick and the text still gets split into subwords


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


# ------------------------------------------------------------------- protobuf, by hand

def varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number, payload):
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(features, extra=b""):
    """A serialized tf.train.Example of bytes_list features ({name: [bytes, ...]}); ``extra`` is
    appended inside each Feature (other kinds, unknown fields)."""
    entries = b"".join(
        field(1, field(1, name.encode()) + field(2, field(1, b"".join(field(1, v) for v in values)) + extra))
        for name, values in features.items())
    return field(1, entries)


def record(data):
    return struct.pack("<q", len(data)) + data


def write_bin(path, pairs):
    path.write_bytes(b"".join(record(example({"article": [a.encode()], "abstract": [b.encode()]}))
                              for a, b in pairs))


def protobuf_example_class():
    """tf.train.Example built from its .proto text with the protobuf library (skips without it)."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="tf_example_test.proto", package="tftest", syntax="proto3")

    def message(name, *fields):
        m = fd.message_type.add(name=name)
        for fname, number, typ, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=typ, label=label)
            if type_name:
                f.type_name = type_name
        return m
    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, F.TYPE_BYTES, rep, None))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, rep, None))
    message("Int64List", ("value", 1, F.TYPE_INT64, rep, None))
    feature = message("Feature", ("bytes_list", 1, F.TYPE_MESSAGE, opt, ".tftest.BytesList"),
                      ("float_list", 2, F.TYPE_MESSAGE, opt, ".tftest.FloatList"),
                      ("int64_list", 3, F.TYPE_MESSAGE, opt, ".tftest.Int64List"))
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", ("feature", 1, F.TYPE_MESSAGE, rep, ".tftest.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=opt, type_name=".tftest.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, F.TYPE_MESSAGE, opt, ".tftest.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tftest.Example"))


# ------------------------------------------------------------------------ the decoder

def test_decoder_reads_hand_encoded_records(tmp_path):
    article = "-lrb- cnn -rrb- caf\u00e9 owner says `` yes '' . " * 40  # > 127 bytes: multi-byte lengths
    data = example({"article": [article.encode()], "abstract": [b"<s> a . </s> <s> b ! </s>"],
                    "empty": [b""], "two": [b"x", b"y"]},
                   extra=field(7, b"unknown") + varint(9 << 3 | 0) + varint(300) + varint(10 << 3 | 5) + b"\0" * 4)
    assert decode_example(data) == {"article": [article.encode()], "abstract": [b"<s> a . </s> <s> b ! </s>"],
                                    "empty": [b""], "two": [b"x", b"y"]}
    write_bin(tmp_path / "val_000.bin", [(article, "<s> one . </s>"), ("second", "<s> two . </s>")])
    assert list(read_pairs(tmp_path / "val_000.bin")) == [(article, "<s> one . </s>"), ("second", "<s> two . </s>")]


def test_decoder_agrees_with_the_protobuf_library():
    Example = protobuf_example_class()
    ex = Example()
    ex.features.feature["article"].bytes_list.value.append("na\u00efve article".encode())
    ex.features.feature["abstract"].bytes_list.value.append(b"<s> s . </s>")
    ex.features.feature["n"].int64_list.value.extend([-5, 1 << 40])
    ex.features.feature["f"].float_list.value.extend([1.5, 2.5])
    assert decode_example(ex.SerializeToString()) == {"article": ["na\u00efve article".encode()],
                                                      "abstract": [b"<s> s . </s>"]}
    mine = Example()
    mine.ParseFromString(example({"article": [b"a b c"], "abstract": [b"<s> d . </s>"]}))
    assert {k: list(v.bytes_list.value) for k, v in mine.features.feature.items()} == \
        {"article": [b"a b c"], "abstract": [b"<s> d . </s>"]}


def test_truncated_or_foreign_bin_files_are_clear_errors(tmp_path):
    good = tmp_path / "train_000.bin"
    write_bin(good, [("first article", "<s> a . </s>"), ("second article", "<s> b . </s>")])
    data = good.read_bytes()
    first = 8 + struct.unpack("<q", data[:8])[0]
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:-3])  # inside record 2's Example
    with pytest.raises(PrepError, match=rf"cut\.bin: record 2 \(byte {first}\) says \d+ bytes but \d+ are left: "
                                        "the file is truncated"):
        list(read_pairs(cut))
    cut.write_bytes(data[:first + 5])  # inside record 2's length
    with pytest.raises(PrepError, match=rf"cut\.bin: truncated: record 2 \(byte {first}\) has 5 of the 8 bytes"):
        list(read_pairs(cut))
    text = tmp_path / "text.bin"
    text.write_text("this is a text file, not a .bin release\n" * 3)
    left = text.stat().st_size - 8
    with pytest.raises(PrepError, match=rf"text\.bin: record 1 \(byte 0\) says [\d,]+ bytes but {left} are left"):
        list(read_pairs(text))
    # a length that fits but bytes that are no Example: the record's payload is cut inside a field
    bad = tmp_path / "bad.bin"
    bad.write_bytes(record(field(1, field(1, b"x"))[:-1]) + data)
    with pytest.raises(PrepError, match=r"bad\.bin: record 1 \(byte 0\) is not a tf\.train\.Example "
                                        r"\(field 1 runs past the end"):
        list(read_pairs(bad))
    other = tmp_path / "other.bin"
    other.write_bytes(data + record(example({"article": [b"x"], "summary": [b"y"]})))
    with pytest.raises(PrepError, match=r"other\.bin: record 3 \(byte \d+\) has no 'abstract' text \(bytes "
                                        r"features: article, summary\)"):
        list(read_pairs(other))


def test_chunks_are_read_in_numeric_order_without_gaps(tmp_path):
    for n in (0, 1, 2, 10):  # as text, "train_10.bin" sorts before "train_2.bin"
        write_bin(tmp_path / f"train_{n}.bin", [(f"a{n}", "<s> s . </s>")])
    with pytest.raises(PrepError, match=r"train chunk 003 is missing \(found 4 chunks numbered 0\.\.10\)"):
        split_files(tmp_path)
    for n in range(3, 10):
        write_bin(tmp_path / f"train_{n}.bin", [(f"a{n}", "<s> s . </s>")])
    files = split_files(tmp_path)["train"]
    assert [next(read_pairs(p))[0] for p in files] == [f"a{n}" for n in range(11)]
    write_bin(tmp_path / "train_001x.bin", [])  # not a chunk name: ignored
    write_bin(tmp_path / "train_001.bin", [])
    with pytest.raises(PrepError, match=r"two train chunks are numbered 1 \(train_001\.bin, train_1\.bin\)"):
        split_files(tmp_path)
    (tmp_path / "train_001.bin").unlink()
    write_bin(tmp_path / "train.bin", [("whole", "<s> s . </s>")])  # the whole file wins over its chunks
    assert split_files(tmp_path)["train"] == [tmp_path / "train.bin"]


def test_decoder_on_see_et_al_chunk_files(shared_data):
    chunked = shared_data / "cnndm-see" / "finished_files_sample" / "chunked"
    files = split_files(chunked)
    assert {s: [p.name for p in ps] for s, ps in files.items()} == {
        "train": ["train_000.bin", "train_001.bin"], "val": ["val_000.bin"]}
    pairs = {s: [pair for p in ps for pair in read_pairs(p)] for s, ps in files.items()}
    assert {s: len(v) for s, v in pairs.items()} == {"train": 20, "val": 10}
    for article, abstract in pairs["train"] + pairs["val"]:
        assert article.strip() and abstract.startswith("<s> ") and abstract.endswith(" </s>")
    # the same pairs as the first lines of the text release (whose articles are cut to 400 tokens)
    see = shared_data / "cnndm-see"
    with gzip.open(see / "val.article.txt.gz", "rt", encoding="utf-8") as f:
        articles = [next(f).rstrip("\n") for _ in range(10)]
    with gzip.open(see / "val.abstract.tagged.txt.gz", "rt", encoding="utf-8") as f:
        abstracts = [next(f).rstrip("\n") for _ in range(10)]
    assert [" ".join(a.split()[:400]) for a, _ in pairs["val"]] == articles
    assert [b for _, b in pairs["val"]] == abstracts
    try:
        Example = protobuf_example_class()
    except pytest.skip.Exception:
        return  # the comparison with the text release above has checked the decoder
    data = files["val"][0].read_bytes()
    ex = Example()
    ex.ParseFromString(data[8:8 + struct.unpack("<q", data[:8])[0]])
    assert (ex.features.feature["article"].bytes_list.value[0].decode(),
            ex.features.feature["abstract"].bytes_list.value[0].decode()) == pairs["val"][0]


# ---------------------------------------------------------------- what is done to the text

def test_see_target_ends_every_tagged_sentence_for_rouge():
    from man_recipes.data.cnndm import see_target
    from man_recipes.rouge155 import split_sentences

    stats = Counter()
    tagged = ("<s> he said `` yes '' </s> <s> it works . </s> <s>  </s> <s> why ? </s> "
              "<s> cnn student news . you must be a teacher . </s> <s> made in the u.s. </s>")
    target = see_target(tagged, "x line 1", stats)
    assert target == ("he said `` yes '' . it works . why ? . cnn student news . you must be a teacher . "
                      "made in the u.s. .")
    assert stats == {"sentences": 5, "periods_added": 3}  # the empty <s> </s> is no sentence
    # ROUGE's sentences: one per tag, plus the split inside the 4th tagged sentence
    assert split_sentences(target).splitlines() == [
        "he said `` yes '' .", " it works .", " why ? .", " cnn student news .", " you must be a teacher .",
        " made in the u.s. ."]
    assert see_target("", "x line 2") == ""
    with pytest.raises(PrepError, match=r"x line 3: text outside the <s> \.\.\. </s> sentence tags \('an untagged "
                                        r"summary \.'\); expected See et al.'s tagged abstracts"):
        see_target("an untagged summary .", "x line 3")
    with pytest.raises(PrepError, match=r"x line 4: text outside .*\('<s> b \.'\)"):
        see_target("<s> a . </s> <s> b .", "x line 4")


# ------------------------------------------------------------------------------ layouts

def write_see_text(folder, splits, n=4, gz=False, abstracts=None):
    """See et al.'s text files ``{split}.article.txt`` / ``{split}.abstract.tagged.txt`` (``n`` pairs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        abss = (abstracts or {}).get(split) or [f"<s> {split} summary {i} . </s> <s> it said `` no '' </s>"
                                                for i in range(n)]
        arts = [f"{split} article {i} " + " ".join(f"w{j}" for j in range(30)) + " ." for i in range(len(abss))]
        for kind, rows in (("article.txt", arts), ("abstract.tagged.txt", abss)):
            text = "".join(r + "\n" for r in rows)
            if gz:
                with gzip.open(folder / f"{split}.{kind}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
            else:
                (folder / f"{split}.{kind}").write_text(text, encoding="utf-8")


def test_layout_detection_and_split_mapping(tmp_path):
    from man_recipes.data.cnndm import find_layout

    see = tmp_path / "a" / "cnndm-see"
    write_see_text(see, ("train", "dev", "val"), gz=True)
    (see / "finished_files" / "chunked").mkdir(parents=True)
    for split in ("train", "val", "test"):  # See et al.'s .bin files next to the text files: not read
        write_bin(see / "finished_files" / "chunked" / f"{split}_000.bin", [("a", "<s> b . </s>")])
    layout = find_layout([tmp_path / "a"])
    assert layout.kind == "see-text" and layout.folder == see
    assert {s: [p.name for p in ps] for s, ps in layout.files.items()} == {
        "train": ["train.article.txt.gz", "train.abstract.tagged.txt.gz"],
        "valid": ["dev.article.txt.gz", "dev.abstract.tagged.txt.gz"],
        "test": ["val.article.txt.gz", "val.abstract.tagged.txt.gz"]}
    assert layout.test_name == "CNN/DM standard validation split (See et al. 2017, non-anonymised), used as test"
    assert "dev -> valid, val -> test (the standard validation split as test set)" in layout.describe
    # with a test split the release's own names hold, dev or not; plain files come before .gz
    write_see_text(see, ("test",))
    layout = find_layout([tmp_path / "a"])
    assert [p.name for p in layout.files["valid"]] == ["val.article.txt.gz", "val.abstract.tagged.txt.gz"]
    assert [p.name for p in layout.files["test"]] == ["test.article.txt", "test.abstract.tagged.txt"]
    assert layout.test_name == "CNN/DM test split (See et al. 2017, non-anonymised)"
    assert layout.describe.endswith("train -> train, val -> valid, test -> test (dev.* not read)")
    (see / "test.abstract.tagged.txt").unlink()
    (see / "dev.article.txt.gz").unlink()
    with pytest.raises(PrepError, match=r"cnndm-see: has dev\.abstract\.tagged\.txt\.gz but no test\.article\.txt"
                                        r"\[\.gz\] and test\.abstract\.tagged\.txt\[\.gz\]; expected the splits "
                                        r"train, val, test \(See et al\.\) or train, dev, val"):
        find_layout([tmp_path / "a"])
    # the .bin release: whole files before chunks; an incomplete set is named
    shutil.rmtree(see)
    chunked = tmp_path / "b" / "finished_files" / "chunked"
    chunked.mkdir(parents=True)
    for split in ("train", "val", "test"):
        write_bin(chunked / f"{split}_000.bin", [("a", "<s> b . </s>")])
        write_bin(chunked.parent / f"{split}.bin", [("a", "<s> b . </s>")])
    layout = find_layout([tmp_path / "b"])
    assert layout.kind == "see-bin" and layout.files == {
        s: [chunked.parent / f"{name}.bin"] for s, name in (("train", "train"), ("valid", "val"), ("test", "test"))}
    for split in ("train", "val", "test"):
        (chunked.parent / f"{split}.bin").unlink()
    assert find_layout([tmp_path / "b"]).files["valid"] == [chunked / "val_000.bin"]
    (chunked / "test_000.bin").unlink()
    with pytest.raises(PrepError, match=r"chunked: See et al\. \.bin files for train, val but none for test "
                                        r"\(expected test\.bin or test_000\.bin, \.\.\.\)"):
        find_layout([tmp_path / "b"])


def read_see_folder(tmp_path, layout, max_source=400, max_target=None):
    from man_recipes.data.cnndm import read_see

    tok = tmp_path / "tok"
    tok.mkdir(parents=True)
    read_see(layout, tok, "source", "target", max_source, max_target)
    return tok


def test_read_see_cuts_sources_and_training_summaries_never_references(tmp_path):
    from man_recipes.data.cnndm import find_layout

    write_see_text(tmp_path / "see", ("train", "val", "test"), abstracts={
        "train": ["<s> a b c d e . </s>", "", "<s> f g h ! </s> <s> i . </s>"],
        "test": ["<s> one two three four five six ? </s>", "<s> seven . </s>"]})
    layout = find_layout([tmp_path / "see"])
    (tmp_path / "see" / "train.article.txt").write_text("a1 a2 a3 a4\nempty summary\nb1   b2 b3\none too many\n")
    with pytest.raises(PrepError, match=r"cnndm train: 4 articles \(.*train\.article\.txt\) but 3 abstracts"):
        read_see_folder(tmp_path / "x", layout)
    (tmp_path / "see" / "train.article.txt").write_text("a1 a2 a3 a4\nempty summary\nb1   b2 b3\n")
    tok = read_see_folder(tmp_path, layout, max_source=3, max_target=4)
    # the pair with an empty summary leaves the training set; train and valid summaries cut at 4
    assert lines(tok / "train.source") == ["a1 a2 a3", "b1 b2 b3"]
    assert lines(tok / "train.target") == ["a b c d", "f g h !"]
    assert all(len(t.split()) == 4 for t in lines(tok / "valid.target"))
    # test: sources cut (the model's input), references whole, the raw sources whole
    assert lines(tok / "test.target") == lines(tok / "test.raw.target") == [
        "one two three four five six ? .", "seven ."]
    assert [len(s.split()) for s in lines(tok / "test.source")] == [3, 3]
    assert [len(s.split()) for s in lines(tok / "test.raw.source")] == [34, 34]
    counts = json.loads((tok / "see_counts.json").read_text())
    assert counts["release"] == {"train": 3, "valid": 4, "test": 2}
    assert counts["empty_train_pairs_dropped"] == 1
    assert counts["periods_added"] == {"train": 1, "valid": 4, "test": 1}
    # a bad abstract names its file and line
    (tmp_path / "see" / "test.abstract.tagged.txt").write_text("<s> fine . </s>\nno tags here\n")
    with pytest.raises(PrepError, match=r"see/test\.abstract\.tagged\.txt line 2: text outside the <s>"):
        read_see_folder(tmp_path / "y", layout)


def test_known_subset_is_named_in_the_record(tmp_path):
    from man_recipes.corpora import CNNDM
    from man_recipes.data.manifest import write_manifest

    release = {"train": 40000, "valid": 1000, "test": 13368}
    path = write_manifest(tmp_path, "cnndm", "source", "target", release, release, CNNDM.standard_counts, {"test": "t"})
    record = json.loads(path.read_text())
    assert record["nonstandard"] and record["subset"].startswith("cnndm-see: 40,000 pairs")
    release["train"] = 39999
    path = write_manifest(tmp_path, "cnndm", "source", "target", release, release, CNNDM.standard_counts, {"test": "t"})
    assert json.loads(path.read_text())["subset"] == "a nonstandard sample"


# ----------------------------------------------------------------------- whole runs

def prep_in_process(*argv, allow=True):
    """prepare.run() in this process: a PrepError propagates, so its message can be asserted."""
    from man_recipes.data.prepare import run

    return run([*map(str, argv), *(["--allow-nonstandard-splits"] if allow else [])])


def head_gz(path, n):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def test_cnndm_see_folder(shared_data, tmp_path, capsys):
    """The first 300 pairs of each file of ../shared/data/cnndm-see, in its layout (with its .bin
    sample folder, which the text files take precedence over)."""
    from man_recipes.data.cnndm import see_target

    see = tmp_path / "cnndm-see"
    shutil.copytree(shared_data / "cnndm-see" / "finished_files_sample", see / "finished_files_sample")
    rows = {}
    for path in sorted((shared_data / "cnndm-see").glob("*.txt.gz")):
        rows[path.name] = head_gz(path, 300)
        with gzip.open(see / path.name, "wt", encoding="utf-8") as f:
            f.write("".join(r + "\n" for r in rows[path.name]))
    work, dest = tmp_path / "work", tmp_path / "bin"
    argv = ["cnndm", "--from", see, "--work", work, "--dest", dest, "--bpe-merges", MERGES,
            "--max-source-tokens", "100"]
    with pytest.raises(PrepError, match=r"train has 300 pairs, the standard split has 287,227; valid has 300 pairs, "
                                        r"the standard split has 13,368; test has 300 pairs, the standard split has "
                                        r"11,490\. .* Pass --allow-nonstandard-splits"):
        prep_in_process(*argv, allow=False)
    prep_in_process(*argv)
    record = json.loads((dest / "cnndm.json").read_text())
    assert record["test_sets"] == {"test": "CNN/DM standard validation split (See et al. 2017, non-anonymised), "
                                           "used as test"}
    assert record["counts"] == record["release_counts"] == {"train": 300, "valid": 300, "test": 300}
    assert record["nonstandard"] and record["subset"] == "a nonstandard sample"
    assert (record["references"], record["sources"]) == ({"test": "test.raw.target"}, {"test": "test.raw.source"})
    options = record["options"]
    assert (options["max_source_tokens"], options["max_target_tokens"], options["bpe_merges"]) == (100, None, 60)
    assert "dev -> valid, val -> test" in options["layout"] and options["tokenizer"].startswith("none: ")
    assert options["files"]["test"] == [str(see / "val.article.txt.gz"), str(see / "val.abstract.tagged.txt.gz")]
    # the references: the tagged abstracts as released, tags out, one " ." more where a sentence lacked it
    val_abstracts = rows["val.abstract.tagged.txt.gz"]
    refs = lines(dest / "test.raw.target")
    assert refs == [see_target(a, "") for a in val_abstracts] == lines(work / "tok" / "test.target")
    assert lines(work / "tok" / "valid.target") == [see_target(a, "") for a in rows["dev.abstract.tagged.txt.gz"]]
    assert sum(options["summary_sentences_given_a_period"].values()) > 0
    checked = 0
    for abstract, ref in zip(val_abstracts, refs):
        released = [t for t in abstract.split() if t not in ("<s>", "</s>")]
        assert [t for t in ref.split() if t != "."] == [t for t in released if t != "."]  # no re-tokenization
        sentences = [s.split() for s in abstract.replace("</s>", "").split("<s>") if s.split()]
        if not any(t.startswith(".") for s in sentences for t in s[:-1]) and not any(s[-1] == "..." for s in sentences):
            assert ref.endswith(" .") and ref.count(" .") == len(sentences)  # ROUGE's sentences are the tags'
            checked += 1
    assert checked > 250
    # the model reads articles cut to --max-source-tokens; lead baselines get them whole
    assert max(len(s.split()) for s in lines(work / "tok" / "test.source")) == 100
    assert lines(dest / "test.raw.source") == [" ".join(a.split()) for a in rows["val.article.txt.gz"]]
    assert (dest / "test.source-target.source.bin").is_file()
    capsys.readouterr()
    prep_in_process(*argv)
    out = capsys.readouterr().out
    for step in ("stage", "read_see", "learn_bpe", "apply_bpe", "binarize"):
        assert f"skip  {step}" in out
    assert "redo  " not in out and "start " not in out


def test_cnndm_see_bin_chunks(shared_data, tmp_path):
    """See et al.'s chunk files (the shared sample: train 2 x 10 records, val 10; its val chunk
    stands in for the absent test chunk)."""
    from man_recipes.data.cnndm import see_target

    sample = shared_data / "cnndm-see" / "finished_files_sample" / "chunked"
    chunked = tmp_path / "finished_files" / "chunked"
    shutil.copytree(sample, chunked)
    shutil.copy(sample / "val_000.bin", chunked / "test_000.bin")
    work, dest = tmp_path / "work", tmp_path / "bin"
    prep_in_process("cnndm", "--from", tmp_path / "finished_files", "--work", work, "--dest", dest,
                    "--bpe-merges", MERGES, "--max-target-tokens", "12")
    record = json.loads((dest / "cnndm.json").read_text())
    assert record["test_sets"] == {"test": "CNN/DM test split (See et al. 2017, non-anonymised)"}
    assert record["counts"] == record["release_counts"] == {"train": 20, "valid": 10, "test": 10}
    assert ".bin files in" in record["options"]["layout"] and record["options"]["max_target_tokens"] == 12
    assert [Path(p).name for p in record["options"]["files"]["train"]] == ["train_000.bin", "train_001.bin"]
    # the same references as from the text release, whose first val lines these records are
    abstracts, articles = (head_gz(shared_data / "cnndm-see" / f"val.{kind}.gz", 10)
                           for kind in ("abstract.tagged.txt", "article.txt"))
    assert lines(dest / "test.raw.target") == [see_target(a, "") for a in abstracts]
    assert [" ".join(s.split()[:400]) for s in lines(dest / "test.raw.source")] == articles
    assert max(len(s.split()) for s in lines(dest / "test.raw.source")) > 400  # the release's articles are whole
    assert max(len(s.split()) for s in lines(work / "tok" / "test.source")) == 400
    assert max(len(s.split()) for s in lines(work / "tok" / "train.target")) == 12
    assert max(len(s.split()) for s in lines(work / "tok" / "test.target")) > 12  # references are never cut


def test_length_options_are_checked(capsys):
    from man_recipes.data.prepare import parse_args

    for option, value, message in (("--max-target-tokens", "0", "must be 1 or more (leave it out to keep all)"),
                                   ("--max-source-tokens", "-1", "must be 0 (keep all) or more")):
        with pytest.raises(SystemExit) as e:
            parse_args(["cnndm", option, value])
        assert e.value.code == 2 and f"{option} {value}: {message}" in capsys.readouterr().err
    assert parse_args(["cnndm", "--max-target-tokens", "100"]).max_target_tokens == 100
    assert parse_args(["cnndm"]).max_source_tokens == 400
    # an option the dataset's recipe does not read changes nothing: refused, not ignored
    for argv, message in ((["gigaword", "--max-source-tokens", "50"], "--max-source-tokens: CNN/DM only"),
                          (["iwslt14", "--max-source-tokens", "50", "--max-target-tokens", "5"],
                           "--max-source-tokens and --max-target-tokens: CNN/DM only"),
                          (["cnndm", "--max-len", "100"], "--max-len: not read by the CNN/DM recipe")):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
