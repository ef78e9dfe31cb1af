"""The first pairs of each split of a prepared data folder, as a data folder of their own.

For moving a study's real batches where a whole folder does not fit (CNN/DM's 84 MiB to a GPU node
that takes 64 MiB): ``python -m man_recipes.data.head_subset data-bin/cnndm-40k
data-bin/cnndm-sub --pairs train=4000,valid=300,test=300``. The binarized sentences are copied
unchanged (both sides, in order), the dictionaries too, the first lines of the raw text files its
record names for scoring (references, articles), and the folder's record (``<dataset>.json``) with
the new counts and where they came from, so that ``scripts/speed.sh --data`` reads it as it reads the original.
A folder that exists is never replaced.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from man_recipes.logging_setup import quiet_logging
from man_recipes.data.dataprep import PrepError


def find_manifest(data: Path) -> Path:
    records = [p for p in sorted(data.glob("*.json")) if "counts" in json.loads(p.read_text(encoding="utf-8"))]
    if len(records) != 1:
        raise PrepError(f"{data}: expected one data record (<dataset>.json), found {len(records) or 'none'}")
    return records[0]


def head_subset(data, dest, pairs):
    """Write ``dest`` with the first ``pairs[split]`` pairs of each split of ``data``; returns ``dest``."""
    from fairseq.data import Dictionary, indexed_dataset

    data, dest = Path(data), Path(dest)
    if dest.exists():
        raise PrepError(f"{dest} exists; it is not replaced")
    record_path = find_manifest(data)
    record = json.loads(record_path.read_text(encoding="utf-8"))
    src, tgt, counts = record["source_lang"], record["target_lang"], record["counts"]
    for split, n in pairs.items():
        if split not in counts:
            raise PrepError(f"--pairs: {data} has no split {split!r} (it has {', '.join(counts)})")
        if n > counts[split]:
            raise PrepError(f"--pairs: {split}={n} but {data} has {counts[split]:,} {split} pairs")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))  # a new name: nothing replaced
    for lang in (src, tgt):
        shutil.copy(data / f"dict.{lang}.txt", partial)
    for split, n in pairs.items():
        for lang in (src, tgt):
            prefix = f"{split}.{src}-{tgt}.{lang}"
            dataset = indexed_dataset.make_dataset(str(data / prefix), impl="mmap")
            builder = indexed_dataset.make_builder(str(partial / f"{prefix}.bin"), impl="mmap",
                                                   vocab_size=len(Dictionary.load(str(data / f"dict.{lang}.txt"))))
            for i in range(n):
                builder.add_item(dataset[i])
            builder.finalize(str(partial / f"{prefix}.idx"))
    for kind in ("references", "sources"):
        for split, name in (record.get(kind) or {}).items():
            if split in pairs and (data / name).is_file():
                with open(data / name, encoding="utf-8", newline="") as f:
                    head = [line for _, line in zip(range(pairs[split]), f)]
                (partial / name).write_text("".join(head), encoding="utf-8", newline="")
    record["counts"] = {split: pairs.get(split, 0) for split in counts}
    record["head_subset"] = {"of": str(data.resolve()), "first_pairs": dict(pairs)}
    (partial / record_path.name).write_text(json.dumps(record, indent=1) + "\n")
    partial.rename(dest)
    return dest


def parse_pairs(text):
    pairs = {}
    for item in filter(None, text.split(",")):
        split, _, n = item.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: expected SPLIT=N with N >= 1")
        pairs[split] = int(n)
    if not pairs:
        raise argparse.ArgumentTypeError("expected SPLIT=N[,SPLIT=N...]")
    return pairs


def main(argv=None):
    quiet_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                prog="python -m man_recipes.data.head_subset")
    p.add_argument("data", help="a prepared data folder (with its <dataset>.json)")
    p.add_argument("dest", help="the new folder (must not exist)")
    p.add_argument("--pairs", type=parse_pairs, required=True, help="e.g. train=4000,valid=300,test=300")
    args = p.parse_args(argv)
    try:
        head_subset(args.data, args.dest, args.pairs)
    except PrepError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    print(f"wrote {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
