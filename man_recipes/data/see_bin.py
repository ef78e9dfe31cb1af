"""See et al. (2017)'s CNN/DailyMail release files (``finished_files/*.bin``), read without TensorFlow.

``make_datafiles.py`` (github.com/abisee/cnn-dailymail) writes ``finished_files/{train,val,test}.bin``
and ``finished_files/chunked/{split}_NNN.bin`` (1,000 records a chunk). A record is an 8-byte
little-endian length (``struct.pack('q', n)``) followed by ``n`` bytes of a serialized
``tf.train.Example``, whose ``bytes_list`` features ``article`` and ``abstract`` hold the text::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   // each map entry: string key = 1; Feature value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }

Only the protobuf wire format these messages need is decoded here (varint keys, length-delimited
fields; fields of other wire types are skipped, as protobuf skips unknown fields). A truncated or
foreign file, text that is not UTF-8 (never replaced) or an empty (zero-byte) file is a
:class:`PrepError` naming the file and the record, the last one when the layout is found, before
any step.
"""

import re
import struct
from pathlib import Path

from man_recipes.data.dataprep import PrepError

SPLITS = ("train", "val", "test")
_CHUNK = re.compile(r"^(train|val|test)_(\d+)\.bin$")


class _Malformed(ValueError):
    """Bytes that are not the protobuf messages above (reported with the file and record)."""


def _varint(buf, pos, end):
    result = shift = 0
    while True:
        if pos >= end:
            raise _Malformed("a varint runs past the end of its message")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed("a varint is longer than 10 bytes")


def _fields(buf, start, end):
    """(field number, wire type, value) of the message in ``buf[start:end]``; a length-delimited
    value is its (start, end) in ``buf``, fixed-size values are None."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            value, pos = (pos, pos + n), pos + n
        elif wire in (1, 5):
            value, pos = None, pos + (8 if wire == 1 else 4)
        else:
            raise _Malformed(f"field {field} has wire type {wire}, which these messages never use")
        if field == 0:
            raise _Malformed("field number 0")
        if pos > end:
            raise _Malformed(f"field {field} runs past the end of its message")
        yield field, wire, value


def _submessages(buf, span, field_no):
    """The spans of the length-delimited fields ``field_no`` of the message at ``span``."""
    return [value for field, wire, value in _fields(buf, *span) if field == field_no and wire == 2]


def decode_example(data):
    """A serialized ``tf.train.Example`` -> {feature name: [bytes, ...]} for its ``bytes_list``
    features (float and int64 features are left out). Raises ValueError on malformed bytes."""
    out = {}
    whole = (0, len(data))
    for features in _submessages(data, whole, 1):            # Example.features
        for entry in _submessages(data, features, 1):         # Features.feature (map entries)
            key, value = None, None
            for field, wire, span in _fields(data, *entry):
                if wire != 2:
                    continue
                if field == 1:
                    try:
                        key = data[span[0]:span[1]].decode("utf-8")
                    except UnicodeDecodeError:
                        raise _Malformed("a feature name that is not UTF-8") from None
                elif field == 2:
                    value = span
            if key is None:
                raise _Malformed("a feature map entry without its name")
            lists = _submessages(data, value, 1) if value is not None else []   # Feature.bytes_list
            if lists:
                out[key] = [data[a:b] for span in lists for a, b in _submessages(data, span, 1)]
    return out


def read_records(path):
    """(record number from 1, byte offset, serialized Example) of each record of ``path``."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        number = 0
        while True:
            offset = f.tell()
            head = f.read(8)
            if not head:
                return
            number += 1
            if len(head) < 8:
                raise PrepError(f"{path}: truncated: record {number} (byte {offset:,}) has {len(head)} of the 8 "
                                "bytes of its length. Replace the file with a complete copy.")
            (n,) = struct.unpack("<q", head)
            left = size - offset - 8
            if n < 0 or n > left:
                raise PrepError(f"{path}: record {number} (byte {offset:,}) says {n:,} bytes but {left:,} are left: "
                                "the file is truncated or not a See et al. .bin file. Replace it with a complete copy.")
            yield number, offset, f.read(n)


def read_pairs(path):
    """(article, abstract) text of each record of a See et al. ``.bin`` file, in order."""
    for number, offset, data in read_records(path):
        try:
            features = decode_example(data)
        except _Malformed as e:
            raise PrepError(f"{path}: record {number} (byte {offset:,}) is not a tf.train.Example ({e}); "
                            "not a See et al. .bin file?") from None
        texts = []
        for name in ("article", "abstract"):
            values = features.get(name)
            if values is None or len(values) != 1:
                have = ", ".join(sorted(features)) or "none"
                raise PrepError(f"{path}: record {number} (byte {offset:,}) has "
                                f"{'no' if values is None else len(values)} '{name}' text"
                                f"{'' if values is None else 's'} (bytes features: {have}); expected one "
                                "article and one abstract per record (See et al.'s make_datafiles.py)")
            try:
                texts.append(values[0].decode("utf-8"))
            except UnicodeDecodeError as e:  # nothing is replaced: the text layouts refuse the same
                bad = " ".join(f"0x{b:02x}" for b in values[0][e.start:e.end])
                raise PrepError(f"{path}: record {number} (byte {offset:,}): its {name} text is not UTF-8 ({bad} at "
                                f"byte {e.start + 1} of the text); the release is UTF-8: replace the file with a "
                                "complete copy, or convert the text to UTF-8 first") from None
        yield tuple(texts)


def split_files(folder):
    """{split: [.bin files in reading order]} of a ``finished_files`` or ``chunked`` folder: the
    whole ``{split}.bin`` where present, else the chunks ``{split}_NNN.bin`` in numeric order,
    which must be numbered from 0 without a gap (a missing chunk would lose its records)."""
    folder = Path(folder)
    chunks = {}
    for p in folder.iterdir():
        m = _CHUNK.match(p.name)
        if m and p.is_file():
            chunks.setdefault(m.group(1), []).append((int(m.group(2)), p))
    out = {}
    for split in SPLITS:
        whole = folder / f"{split}.bin"
        if whole.is_file():
            out[split] = [whole]
        elif split in chunks:
            numbered = sorted(chunks[split])
            numbers = [n for n, _ in numbered]
            if len(set(numbers)) != len(numbers):
                twice = next(n for n in numbers if numbers.count(n) > 1)
                raise PrepError(f"{folder}: two {split} chunks are numbered {twice} "
                                f"({', '.join(p.name for n, p in numbered if n == twice)})")
            if numbers != list(range(len(numbers))):
                missing = min(set(range(numbers[-1] + 1)) - set(numbers))
                raise PrepError(f"{folder}: {split} chunk {missing:03d} is missing (found {len(numbers)} chunks "
                                f"numbered {numbers[0]}..{numbers[-1]}); the chunks must be {split}_000.bin, "
                                f"{split}_001.bin, ... without a gap")
            out[split] = [p for _, p in numbered]
    for files in out.values():
        for path in files:
            if path.stat().st_size == 0:  # would make an empty or short split, found only after BPE
                raise PrepError(f"{path}: empty (0 bytes); a See et al. .bin file holds records. Replace it with "
                                "a complete copy")
    return out
