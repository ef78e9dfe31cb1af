"""Losses from fairseq-train's simple log, NaN and inf included.

fairseq prints ``loss=9.93,`` in the per-update (``train_inner``) lines and ``| loss 9.93 |`` in
the epoch summaries (``train``, ``valid on 'valid' subset``). A digits-only pattern skips ``nan``
and ``inf`` silently; ``nll_loss`` does not match (no word boundary) nor does fp16's ``loss scale
to: 64``.
"""

import re
from typing import List

VALUE = r"(-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf))\b"
LOSS_RE = re.compile(r"\bloss[= ]" + VALUE, re.I)
TRAIN_INNER_RE = re.compile(r"\| train_inner \| .*?\bloss=" + VALUE, re.I)
VALID_RE = re.compile(r"valid on '[^']+' subset \| loss " + VALUE, re.I)


def losses(text: str) -> List[float]:
    """Every loss fairseq printed: per-update, epoch and validation."""
    return [float(v) for v in LOSS_RE.findall(text)]


def train_inner_losses(text: str) -> List[float]:
    return [float(v) for v in TRAIN_INNER_RE.findall(text)]


def valid_losses(text: str) -> List[float]:
    return [float(v) for v in VALID_RE.findall(text)]
