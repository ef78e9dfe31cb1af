"""The random token batches every model of a run sees, batched as ``fairseq-train`` batches."""

from pathlib import Path


def write_dictionary(directory: str, size: int):
    """Joined src/tgt dictionary with ``size`` symbols in total (fairseq adds 4 specials)."""
    words = "".join(f"w{i} {size - i}\n" for i in range(size - 4))
    for lang in ("src", "tgt"):
        Path(directory, f"dict.{lang}.txt").write_text(words)


def make_batches(spec, dictionary):
    """Random sentences batched as fairseq-train does (sorted by length, --max-tokens)."""
    import numpy as np
    import torch
    from fairseq.data import LanguagePairDataset

    rng = np.random.RandomState(spec["seed"])
    n_train_batches = spec["warmup"] + spec["iters"]
    mean, std = spec["len_mean"], spec["len_std"]
    max_len = spec["len_max"]

    def sentences(n):
        src_len = np.clip(np.round(rng.normal(mean, std, n)), 2, max_len).astype(int)
        tgt_len = np.clip(np.round(src_len * rng.uniform(0.8, 1.25, n)), 2, max_len).astype(int)
        lo, hi = dictionary.nspecial, len(dictionary)

        def sent(length):
            toks = rng.randint(lo, hi, size=length - 1).tolist() + [dictionary.eos()]
            return torch.tensor(toks, dtype=torch.long)

        src = [sent(length) for length in src_len]
        tgt = [sent(length) for length in tgt_len]
        return src, tgt

    # a pool a few times bigger than what is used, so batches mix lengths like an epoch does
    pool = int(3 * n_train_batches * spec["max_tokens"] / mean) + 16
    src, tgt = sentences(pool)
    ds = LanguagePairDataset(
        src, np.array([len(s) for s in src]), dictionary, tgt, np.array([len(t) for t in tgt]), dictionary,
        left_pad_source=True, left_pad_target=False, shuffle=True,
    )
    with _numpy_seed(spec["seed"]):
        order = ds.ordered_indices()
    batches = ds.batch_by_size(order, max_tokens=spec["max_tokens"], required_batch_size_multiple=8)
    rng.shuffle(batches)
    train = [ds.collater([ds[int(i)] for i in b]) for b in batches[:n_train_batches]]
    if len(train) < n_train_batches:
        raise RuntimeError("not enough random sentences for the requested batches")

    dsrc, dtgt = sentences(spec["decode_sentences"])
    dds = LanguagePairDataset(
        dsrc, np.array([len(s) for s in dsrc]), dictionary, dtgt, np.array([len(t) for t in dtgt]),
        dictionary, left_pad_source=True, left_pad_target=False,
    )
    decode = dds.collater([dds[i] for i in range(len(dds))])
    return train, decode


class _numpy_seed:
    def __init__(self, seed):
        self.seed = seed

    def __enter__(self):
        from fairseq.data import data_utils

        self.ctx = data_utils.numpy_seed(self.seed)
        self.ctx.__enter__()

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)

