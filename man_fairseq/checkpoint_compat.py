"""Let fairseq load its own checkpoints under torch >= 2.6 safe loading.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True`` and refuses any class it does
not know. fairseq checkpoints hold, besides tensors and plain containers, an
``argparse.Namespace`` (``state["args"]``, older checkpoints and every ``--user-dir`` model's
args), fairseq's meter objects in ``extra_state["metrics"]``, and numpy scalars / dtypes
(losses saved as ``np.float64``, e.g. ``extra_state["best"]``). We allow-list exactly those
classes; safe loading stays on for everything else.
"""

import argparse
import collections

import numpy as np
import torch


def _numpy_globals():
    # numpy>=2 moved ``numpy.core`` to ``numpy._core``; pickles name the one they were made with
    out = [np.dtype, np.ndarray]
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            m = __import__(mod, fromlist=["scalar", "_reconstruct"])
        except ImportError:
            continue
        for name in ("scalar", "_reconstruct"):
            fn = getattr(m, name, None)
            if fn is not None:
                out.append((fn, f"{mod}.{name}"))
    # dtype classes (np.dtypes.Float64DType, ...) appear in pickles of numpy>=1.25 dtypes
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    return out


def fairseq_checkpoint_globals():
    from fairseq.logging import meters

    classes = [argparse.Namespace, collections.OrderedDict, collections.defaultdict]
    classes += [getattr(meters, n) for n in (
        "Meter", "AverageMeter", "SumMeter", "ConcatTensorMeter", "TimeMeter", "StopwatchMeter", "MetersDict",
    ) if hasattr(meters, n)]
    return classes + _numpy_globals()


def register_safe_globals():
    """Idempotent; a no-op on torch versions without ``add_safe_globals``."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(fairseq_checkpoint_globals())
