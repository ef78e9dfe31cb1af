"""--no-repeat-ngram-size (the summarization configs' trigram blocking) bans what fairseq's CUDA
kernel bans, on CPU too, where the fork's Python fallback banned nothing (man_fairseq/patches/ngram_blocking.py)."""

import pytest
import torch
from conftest import TINY_MODEL, USER_DIR, run_cli

import man_fairseq  # noqa: F401  (applies the patches)
from fairseq.ngram_repeat_block import NGramRepeatBlock


def kernel_bans(tokens, step, n):
    """ngram_repeat_block_cuda_kernel.cu written as loops: thread i < step-n+2 compares the
    (n-1)-gram at i with the one at step-n+2 and bans the token at i+n-1 when they are equal."""
    start = step + 2 - n
    bans = set()
    for row in range(tokens.size(0)):
        t = tokens[row].tolist()
        for i in range(max(start, 0)):
            if all(t[i + k] == t[start + k] for k in range(n - 1)):
                bans.add((row, t[i + n - 1]))
    return bans


def generator_buffer(rows, width, step, gen):
    """The sequence generator's token buffer at ``step``: end-of-sentence first, a hypothesis of three
    word types (so n-grams repeat) up to ``step``, padding after it."""
    tokens = torch.full((rows, width), 1, dtype=torch.long)
    tokens[:, 0] = 2
    tokens[:, 1: step + 1] = torch.randint(3, 6, (rows, step), generator=gen)
    return tokens


def bans_of(lprobs):
    """The (row, token) pairs set to -inf."""
    return {tuple(x) for x in torch.isinf(lprobs).nonzero().tolist()}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_cpu_blocking_bans_what_the_cuda_kernel_bans(n):
    gen = torch.Generator().manual_seed(n)
    bsz, beam, vocab, width = 3, 2, 6, 14
    blocker = NGramRepeatBlock(n, use_extension=False)
    banned_any = False
    for step in range(width - 1):
        tokens = generator_buffer(bsz * beam, width, step, gen)
        got = bans_of(blocker(tokens, torch.zeros(bsz * beam, vocab), bsz, beam, step))
        assert got == kernel_bans(tokens, step, n), (n, step)
        banned_any |= bool(got)
    assert banned_any  # three word types repeat: the test sees bans, not only their absence


def test_cpu_blocking_bans_nothing_before_a_full_ngram():
    tokens = torch.tensor([[2, 5, 5, 1, 1]])
    out = NGramRepeatBlock(3, use_extension=False)(tokens, torch.zeros(1, 7), 1, 1, 0)
    assert not torch.isinf(out).any()
    out = NGramRepeatBlock(3, use_extension=False)(tokens, torch.zeros(1, 7), 1, 1, 2)
    assert out[0].tolist() == [0, 0, 0, 0, 0, 0, 0]  # (5, 5) occurred only as the last 2 tokens
    tokens = torch.tensor([[2, 5, 5, 5, 1]])
    out = NGramRepeatBlock(3, use_extension=False)(tokens, torch.zeros(1, 7), 1, 1, 3)
    assert torch.isinf(out[0, 5]) and torch.isinf(out).sum() == 1  # 5 5 5 5 would repeat 5 5 5


def _hypotheses(data, checkpoint, *extra):
    proc = run_cli(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test",
                    "--beam", "4", "--max-len-a", "0", "--max-len-b", "25", "--batch-size", "8", "--cpu", *extra])
    return [line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-")]


def _repeats_a_trigram(words):
    trigrams = list(zip(words, words[1:], words[2:]))
    return len(trigrams) != len(set(trigrams))


def test_fairseq_generate_blocks_trigrams_on_cpu(toy_data_bin, tmp_path):
    """The real fairseq-generate with --user-dir: a barely trained model repeats itself, and with
    --no-repeat-ngram-size 3 no hypothesis holds a trigram twice."""
    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer", *TINY_MODEL,
             "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "400", "--max-update", "3",
             "--share-all-embeddings", "--save-dir", tmp_path, "--no-epoch-checkpoints", "--cpu",
             "--num-workers", "0", "--seed", "1", "--disable-validation"])
    free = _hypotheses(toy_data_bin, tmp_path / "checkpoint_last.pt")
    blocked = _hypotheses(toy_data_bin, tmp_path / "checkpoint_last.pt", "--no-repeat-ngram-size", "3")
    assert len(free) == len(blocked) == 20
    assert sum(map(_repeats_a_trigram, free)) > 0  # otherwise this test could not fail
    assert [h for h in blocked if _repeats_a_trigram(h)] == []
