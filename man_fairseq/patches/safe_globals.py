"""torch >= 2.6 safe loading (``torch.load(weights_only=True)``, its default) accepts fairseq's own
checkpoints: the classes they hold are allow-listed, and safe loading stays on for everything else.

Besides tensors and plain containers, a fairseq checkpoint holds an ``argparse.Namespace``
(``state["args"]``: older checkpoints and every ``--user-dir`` model's args), fairseq's meter objects
(``extra_state["metrics"]``) and numpy scalars and dtypes (losses saved as ``np.float64``, e.g.
``extra_state["best"]``); torch refuses each (``Unsupported global``). fairseq's own commands load a
checkpoint before any plugin code runs when ``--user-dir man_fairseq`` is left out, so their message
stays torch's; the docs say what it means.
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


def apply():
    """Idempotent (torch keeps a set); a no-op on torch versions without ``add_safe_globals``."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add(fairseq_checkpoint_globals())
