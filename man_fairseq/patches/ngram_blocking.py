"""``--no-repeat-ngram-size`` blocks n-grams without fairseq's CUDA kernel too (on CPU, and on a GPU
where the extension was not built).

Since fairseq commit 8ca4813 the Python fallback of ``NGramRepeatBlock`` compares the last n-1
entries of the whole (padded) token buffer with the earlier n-grams, which never match (fairseq
issues 4709, 5206), so beam search repeated n-grams freely and exited 0. The fallback now bans what
the CUDA kernel bans: every token that would complete an n-gram already in the hypothesis (its
leading end-of-sentence included).
"""

import math

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from .install import install


def banned_ngram_completions(tokens, step, n):
    """(rows, tokens) to ban at ``step`` under ``--no-repeat-ngram-size n``: for each row of
    ``tokens`` (the generator's buffer; positions ``0..step`` are the hypothesis so far, from its
    leading end-of-sentence), the token that followed each earlier occurrence of its last n-1
    tokens. The rule of fairseq's CUDA kernel (``ngram_repeat_block_cuda_kernel.cu``)."""
    start = step + 2 - n  # where the n-gram that the next token would complete begins
    if start <= 0:
        return tokens.new_empty(0), tokens.new_empty(0)
    hyp = tokens[:, : step + 1]
    if n == 1:
        matches = torch.ones(hyp.size(0), start, dtype=torch.bool, device=hyp.device)
    else:
        earlier = hyp.unfold(1, n - 1, 1)[:, :start]  # (rows, start, n-1): the (n-1)-grams at 0..start-1
        matches = (earlier == hyp[:, start:].unsqueeze(1)).all(-1)
    rows, at = matches.nonzero(as_tuple=True)
    return rows, hyp[rows, at + n - 1]


def banning_as_the_kernel(fork_fallback):
    def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        """``NGramRepeatBlock``'s fallback, banning what the CUDA kernel bans (:func:`banned_ngram_completions`)."""
        rows, banned = banned_ngram_completions(tokens, step, self.no_repeat_ngram_size)
        lprobs[rows, banned] = -math.inf
        return lprobs

    return _no_repeat_ngram


def apply():
    install(NGramRepeatBlock, "_no_repeat_ngram", banning_as_the_kernel)
