"""A fixed sample of a test set, for a study whose whole test set takes too long to decode on its
device (``eval.test_sample: N`` in a config: CNN/DM's 13,368 validation articles on a CPU).

The sample is ``N`` sentence ids drawn without replacement with a fixed seed, kept in their
original order: the same articles for every run, every family and the lead baseline. The
binarized sentences of those ids are copied into a small data folder of their own (the data
folder's dictionaries linked), so fairseq-generate decodes exactly them, numbered 0..N-1 in
sample order.
"""

import json
import os
import random
import shutil
from pathlib import Path

SAMPLE_SEED = 1


def sample_ids(n_total, n, seed=SAMPLE_SEED):
    """``n`` of the ids ``0..n_total-1`` (all of them when ``n >= n_total``), drawn with ``seed``, sorted."""
    if n >= n_total:
        return list(range(n_total))
    return sorted(random.Random(seed).sample(range(n_total), n))


def describe(n, n_total, seed=SAMPLE_SEED):
    """The sample as a table says it."""
    return f"{n:,} of its {n_total:,} pairs sampled (Python random.Random({seed}).sample, kept in order)"


def sampled_split(data, subset, src, tgt, ids, dest):
    """A data folder ``dest`` whose ``subset`` holds the sentences ``ids`` of ``data``'s ``subset``
    (both sides), the dictionaries linked from ``data``; rebuilt unless its stamp says it holds
    exactly these. Returns ``dest``."""
    from fairseq.data import Dictionary, indexed_dataset

    data, dest = Path(data).resolve(), Path(dest)
    stamp = {"data": str(data), "subset": subset, "ids": ids,
             "sizes": {lang: os.path.getsize(data / f"{subset}.{src}-{tgt}.{lang}.bin") for lang in (src, tgt)}}
    stamp_path = dest / "sample.json"
    if stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return dest
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for lang in (src, tgt):
        dictionary = data / f"dict.{lang}.txt"
        os.symlink(dictionary, partial / dictionary.name)
        prefix = f"{subset}.{src}-{tgt}.{lang}"
        dataset = indexed_dataset.make_dataset(str(data / prefix), impl="mmap")
        builder = indexed_dataset.make_builder(str(partial / f"{prefix}.bin"), impl="mmap",
                                               vocab_size=len(Dictionary.load(str(dictionary))))
        for i in ids:
            builder.add_item(dataset[i])
        builder.finalize(str(partial / f"{prefix}.idx"))
    (partial / stamp_path.name).write_text(json.dumps(stamp))
    shutil.rmtree(dest, ignore_errors=True)  # a sample of other ids or data: ours, under the run's eval/
    partial.rename(dest)
    return dest
