"""How many static flex kernels one training epoch needs (``python -m lab.flex_keys DATA``).

Where ``torch.compile`` cannot compile flex_attention with dynamic shapes, ``--attention-backend
flex`` compiles one static kernel per (batch, query length, key length) key and mod structure
(``man_fairseq/modules/flex_backend.py``), lengths bucketed and the batch padded to a power of two.
This counts those keys over the batches fairseq makes of a data folder's training split at a given
``--max-tokens`` (one epoch: the batches are the same every epoch, only their order changes), per
attention kind, with the batch padded and as it is. No model, no GPU: the number that
``FlexRunner.recompile_limit`` must leave room for, times the model's mod structures per kind.
"""

import argparse
import os
import sys
from typing import Dict, Iterable, Sequence, Set, Tuple

import numpy as np

from lab.bounds import MAX_BATCH_TOKENS, batch_tokens
from man_fairseq.modules.flex_backend import bucket_batch, bucket_length
from man_fairseq.plugin_options import MAX_DISTANCE
from man_recipes.interrupt import one_line_on_ctrl_c
from man_recipes.options import number

KINDS = ("encoder self", "decoder self", "cross")


def epoch_keys(batches: Iterable[Sequence[int]], source_sizes, target_sizes,
               pad_batch: bool) -> Dict[str, Set[Tuple[int, int, int]]]:
    """The (batch, query bucket, key bucket) keys of each attention kind over ``batches``
    (sentence indices into the size arrays), the batch padded to a power of two or not."""
    keys = {kind: set() for kind in KINDS}
    for batch in batches:
        n = bucket_batch(len(batch)) if pad_batch else len(batch)
        s = bucket_length(int(source_sizes[batch].max()))
        t = bucket_length(int(target_sizes[batch].max()))
        keys["encoder self"].add((n, s, s))
        keys["decoder self"].add((n, t, t))
        keys["cross"].add((n, t, s))
    return keys


def training_batches(data: str, source_lang: str, target_lang: str, max_tokens: int, max_source_positions: int,
                     batch_multiple: int = 8):
    """fairseq's batches of ``data``'s train split (as ``fairseq-train --truncate-source`` makes
    them) and the source and target sizes they index."""
    from fairseq.data import Dictionary, LanguagePairDataset, data_utils

    pair = f"{source_lang}-{target_lang}"
    for lang in (source_lang, target_lang):
        if not os.path.exists(f"{data}/dict.{lang}.txt"):
            raise SystemExit(f"flex_keys: {data} has no dict.{lang}.txt (not a fairseq-preprocess folder of "
                             f"{pair}? --source-lang/--target-lang)")
    src_dict = Dictionary.load(f"{data}/dict.{source_lang}.txt")
    tgt_dict = Dictionary.load(f"{data}/dict.{target_lang}.txt")
    src = data_utils.load_indexed_dataset(f"{data}/train.{pair}.{source_lang}", src_dict)
    tgt = data_utils.load_indexed_dataset(f"{data}/train.{pair}.{target_lang}", tgt_dict)
    if src is None or tgt is None:
        raise SystemExit(f"flex_keys: no train.{pair} split in {data}")
    source_sizes = np.minimum(src.sizes, max_source_positions)
    dataset = LanguagePairDataset(src, source_sizes, src_dict, tgt, tgt.sizes, tgt_dict)
    batches = dataset.batch_by_size(dataset.ordered_indices(), max_tokens=max_tokens,
                                    required_batch_size_multiple=batch_multiple)
    # a copy: the sizes are a view of the index file's memory map, closed with the dataset
    return batches, source_sizes, np.array(tgt.sizes)


@one_line_on_ctrl_c("python -m lab.flex_keys")
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a fairseq-preprocess folder")
    parser.add_argument("--source-lang", default="article")
    parser.add_argument("--target-lang", default="title")
    parser.add_argument("--max-tokens", type=batch_tokens("--max-tokens"), default=12288)
    parser.add_argument("--max-source-positions", type=number("--max-source-positions", low=1, high=MAX_DISTANCE,
                                                              ceiling="the plugin's ceiling of a distance"),
                        default=1024, help="sources truncated to this")
    # 0 divided by zero in fairseq's batching (SIGFPE)
    parser.add_argument("--required-batch-size-multiple",
                        type=number("--required-batch-size-multiple", low=1, high=MAX_BATCH_TOKENS,
                                    ceiling="no batch holds more sentences than --max-tokens' ceiling of tokens"),
                        default=8, help="as fairseq-train's (default 8)")
    args = parser.parse_args(argv)
    batches, source_sizes, target_sizes = training_batches(args.data, args.source_lang, args.target_lang,
                                                           args.max_tokens, args.max_source_positions,
                                                           args.required_batch_size_multiple)
    sizes = sorted({len(b) for b in batches})
    padded = epoch_keys(batches, source_sizes, target_sizes, pad_batch=True)
    as_is = epoch_keys(batches, source_sizes, target_sizes, pad_batch=False)
    print(f"{args.data}, max-tokens {args.max_tokens}: {len(batches)} batches of {len(sizes)} sizes "
          f"({sizes[0]}-{sizes[-1]} sentences)\n")
    print("| attention | keys, batch padded | keys, batch as is |\n|---|---|---|")
    for kind in KINDS:
        print(f"| {kind} | {len(padded[kind])} | {len(as_is[kind])} |")


if __name__ == "__main__":
    sys.exit(main())
