"""``data_utils.batch_by_size`` keeps the last batch, as fairseq 0.12.2 does.

The maintained forks of fairseq 0.12 for Python >= 3.9 (``fairseq-fixed`` 0.12.3.1 and
``ve-fairseq`` 0.12.3 alike) **drop the last batch** whenever its size is not a multiple of
``--required-batch-size-multiple`` (default 8). That silently loses data: ``fairseq-generate``
translates only part of the test set (so BLEU is computed on a subset), validation skips
sentences, and since batches are formed from length-sorted indices the longest training
sentences are never seen.
"""

import numpy as np
from fairseq.data import data_utils

from .install import install


def keeping_last_batch(fork_batch_by_size):
    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1, fixed_shapes=None):
        """fairseq 0.12.2's ``batch_by_size``: every index ends up in exactly one batch."""
        if fixed_shapes is not None or required_batch_size_multiple <= 1:
            return fork_batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                      required_batch_size_multiple, fixed_shapes)
        from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec

        max_tokens = int(max_tokens) if max_tokens is not None else -1
        max_sentences = max_sentences if max_sentences is not None else -1
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        if num_tokens_vec is None:
            return batch_by_size_fn(indices, num_tokens_fn, max_tokens, max_sentences, required_batch_size_multiple)
        if not isinstance(num_tokens_vec, np.ndarray):
            num_tokens_vec = np.fromiter(num_tokens_vec, dtype=np.int64, count=-1)
        return batch_by_size_vec(indices, num_tokens_vec, max_tokens, max_sentences, required_batch_size_multiple)

    return batch_by_size


def apply():
    install(data_utils, "batch_by_size", keeping_last_batch)
