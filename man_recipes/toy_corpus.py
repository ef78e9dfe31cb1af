"""A synthetic parallel corpus whose translation needs *local* context.

Used by ``make demo`` and the end-to-end tests, so nothing has to be downloaded.

The rule (documented in docs/install.md, "The two commands"):

* the source is a sequence of words ``w0 .. w{V-1}``, length 4..``max_len``;
* the target translates each word by a fixed dictionary into one of two target words,
  chosen by the **previous** source word: ``A<i>`` if the previous word has an even index
  (or the word starts the sentence) and ``B<i>`` otherwise — a left-neighbour dependency;
* the target then swaps every adjacent pair of translated words (``x1 x0 x3 x2 ...``) —
  a local reordering.

So each target word depends only on a window of three source words around it: a model with
a good locality bias should learn it faster than one that must discover locality.
"""

import argparse
import os
import random
from typing import List, Tuple


def translate(src: List[str]) -> List[str]:
    out = []
    for i, word in enumerate(src):
        idx = int(word[1:])
        prev_even = i == 0 or int(src[i - 1][1:]) % 2 == 0
        out.append(("A" if prev_even else "B") + str(idx))
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def make_pairs(n: int, vocab: int = 24, min_len: int = 4, max_len: int = 12, seed: int = 1) -> List[Tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        src = ["w%d" % rng.randrange(vocab) for _ in range(length)]
        pairs.append((" ".join(src), " ".join(translate(src))))
    return pairs


def write_corpus(out_dir: str, train: int = 2000, valid: int = 200, test: int = 200,
                 vocab: int = 24, max_len: int = 12, seed: int = 1, src: str = "src", tgt: str = "tgt") -> str:
    """Write ``{train,valid,test}.{src,tgt}`` under ``out_dir`` and return it."""
    os.makedirs(out_dir, exist_ok=True)
    splits = {"train": train, "valid": valid, "test": test}
    for k, (split, n) in enumerate(splits.items()):
        pairs = make_pairs(n, vocab=vocab, max_len=max_len, seed=seed * 1000 + k)
        with open(os.path.join(out_dir, f"{split}.{src}"), "w") as fs, \
                open(os.path.join(out_dir, f"{split}.{tgt}"), "w") as ft:
            for s, t in pairs:
                fs.write(s + "\n")
                ft.write(t + "\n")
    return out_dir


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--vocab", type=int, default=24)
    p.add_argument("--max-len", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--force", action="store_true", help="overwrite existing corpus files in OUT_DIR")
    a = p.parse_args()
    existing = [f for split in ("train", "valid", "test") for f in (f"{split}.src", f"{split}.tgt")
                if os.path.exists(os.path.join(a.out_dir, f))]
    if existing and not a.force:
        p.error(f"{a.out_dir} already holds {', '.join(existing)}; pass --force to overwrite them")
    write_corpus(a.out_dir, a.train, a.valid, a.test, a.vocab, a.max_len, a.seed)


if __name__ == "__main__":
    main()
