"""Small helpers of every results table (the studies', the paper rows', the demo's, the analyses'
file names): mean and sample standard deviation, and a label made safe as a file name."""

import math
import re


def mean_std(values):
    """(mean, sample standard deviation or None for one value)."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return mean, std


def slug(label: str) -> str:
    """``label`` as a file or folder name: runs of other characters than letters, digits, ``_.-``
    become one ``_`` (``model`` when nothing is left)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "model"
