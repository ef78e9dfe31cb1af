"""CNN/DailyMail in the layouts users have: See et al.'s text files (``cnndm-see/``) and their
``finished_files`` ``.bin`` release, read by :mod:`man_fairseq.recipes.see_bin` without TensorFlow.

The ``.bin`` decoder is checked on records encoded here (a tiny protobuf encoder below; the
protobuf library, where installed, cross-checks both directions) and on See et al.'s own chunk
files in ``../shared/data/cnndm-see/finished_files_sample``. The recipe runs on slices of the
shared ``cnndm-see`` files (the whole folder takes minutes; timed by hand in docs/data-prep.md).
"""

import gzip
import json
import shutil
import struct
from pathlib import Path

import pytest

from man_fairseq.recipes.dataprep import PrepError
from man_fairseq.recipes.see_bin import decode_example, read_pairs, split_files

MERGES = "60"  # tiny BPE: the runs stay quick and the text still gets split into subwords


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
