"""Let fairseq load its own checkpoints under torch >= 2.6 safe loading.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True`` and refuses any class it does
not know. fairseq checkpoints hold, besides tensors and plain containers, an
``argparse.Namespace`` (``state["args"]``, older checkpoints and every ``--user-dir`` model's
args), fairseq's meter objects in ``extra_state["metrics"]``, and numpy scalars / dtypes
(losses saved as ``np.float64``, e.g. ``extra_state["best"]``). We allow-list exactly those
classes; safe loading stays on for everything else.

:func:`load_error` is the one line the plugin's own commands (man-average-checkpoints,
evaluate.sh, the analyses) print for a file torch cannot load: a file that is no checkpoint at all
is named as such (torch says ``KeyError: 101`` for a text file, or advises ``weights_only=False``).
fairseq's own commands (fairseq-generate, ...) load a checkpoint before any plugin code runs when
``--user-dir man_fairseq`` is left out, so their message stays torch's (``Unsupported global:
GLOBAL argparse.Namespace``); the docs say what it means.
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


# The first bytes of what torch.save writes: a zip archive (torch >= 1.6), or a pickle (protocol 2+,
# the legacy format)
_CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80")


def is_torch_file(path) -> bool:
    """Whether ``path`` starts as a file written by torch.save does (read: its first 4 bytes)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return any(head.startswith(magic) for magic in _CHECKPOINT_MAGIC)


def load_error(path, error: BaseException) -> str:
    """One line for the checkpoint ``path`` that torch.load could not read (``error``)."""
    try:
        torch_file = is_torch_file(path)
    except OSError:
        torch_file = True  # unreadable: torch's own error says why
    if not torch_file:
        return (f"cannot read checkpoint {path}: not a PyTorch checkpoint (neither the zip archive torch.save writes "
                "nor a pickle); give a checkpoint*.pt written by fairseq-train")
    lines = str(error).strip().splitlines()
    said = next((line.strip() for line in lines if "Unsupported global" in line), lines[0] if lines else "")
    return f"cannot read checkpoint {path}: {type(error).__name__}: {said}"
