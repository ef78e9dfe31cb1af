"""One line for a file torch cannot load as a checkpoint.

:func:`load_error` is what the plugin's ``--model-overrides`` check and the recipes' commands
(man-average-checkpoints, evaluate.sh, the analyses) print: a file that is no checkpoint at all is
named as such (torch says ``KeyError: 101`` for a text file, or advises ``weights_only=False``).
"""

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
