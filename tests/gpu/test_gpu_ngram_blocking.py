"""--no-repeat-ngram-size on CUDA: the fixed fallback (a GPU where fairseq's extension was not built)
and, where it was built, fairseq's CUDA kernel ban what the CPU rule bans. Skipped without CUDA."""

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock, is_cuda_extension_usable

import man_fairseq  # noqa: F401  (applies fairseq_fixes)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _buffers(step, bsz=4, beam=3, width=20, vocab=9, seed=0):
    gen = torch.Generator().manual_seed(seed + step)
    tokens = torch.full((bsz * beam, width), 1, dtype=torch.long)
    tokens[:, 0] = 2
    tokens[:, 1: step + 1] = torch.randint(3, 6, (bsz * beam, step), generator=gen)
    return tokens, torch.zeros(bsz * beam, vocab)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_cuda_blocking_bans_what_the_cpu_rule_bans(n):
    kernel = is_cuda_extension_usable()
    for step in range(18):
        tokens, lprobs = _buffers(step)
        want = torch.isinf(NGramRepeatBlock(n, use_extension=False)(tokens, lprobs.clone(), 4, 3, step))
        fallback = NGramRepeatBlock(n, use_extension=False)(tokens.cuda(), lprobs.cuda(), 4, 3, step)
        assert torch.equal(torch.isinf(fallback).cpu(), want), (n, step)
        if kernel:
            out = NGramRepeatBlock(n)(tokens.cuda(), lprobs.cuda(), 4, 3, step)
            assert torch.equal(torch.isinf(out).cpu(), want), (n, step, "CUDA kernel")
