"""--no-repeat-ngram-size on CUDA: the fixed fallback (a GPU where fairseq's extension was not built)
and, where it was built, fairseq's CUDA kernel ban what the kernel's rule written as loops bans
(``tests/test_ngram_blocking.py``). Skipped without CUDA."""

import sys
from pathlib import Path

import pytest
import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock, is_cuda_extension_usable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_ngram_blocking import bans_of, generator_buffer, kernel_bans  # noqa: E402  (applies the patches)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_cuda_blocking_bans_what_the_kernel_rule_bans(n):
    gen = torch.Generator().manual_seed(n)
    bsz, beam, vocab, width = 4, 3, 9, 20
    blockers = [NGramRepeatBlock(n, use_extension=False)] + ([NGramRepeatBlock(n)] if is_cuda_extension_usable() else [])
    for step in range(width - 2):
        tokens = generator_buffer(bsz * beam, width, step, gen).cuda()
        want = kernel_bans(tokens.cpu(), step, n)
        for blocker in blockers:
            got = bans_of(blocker(tokens, torch.zeros(bsz * beam, vocab, device="cuda"), bsz, beam, step).cpu())
            assert got == want, (n, step, "fallback" if not blocker.use_extension else "CUDA kernel")
