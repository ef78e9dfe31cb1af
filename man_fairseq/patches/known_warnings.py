"""Warnings known to be harmless are silenced, each narrowly: its exact message and category.

- fairseq's ``train_step`` enters ``torch.cuda.amp.autocast(enabled=False)`` on every update when
  AMP is off; torch deprecates that spelling (FutureWarning), the behaviour is the same.
- fairseq's own ``MultiheadAttention`` (the Transformer baseline) passes a boolean key padding mask
  with a float attention mask; torch converts the boolean one and warns that mixing them is
  deprecated (UserWarning). The result is the same.
- fairseq's epoch iterator always asks its ``DataLoader`` for ``pin_memory=True``; on a machine
  without an accelerator torch ignores it and warns once per run (UserWarning). Nothing to pin there.
"""

import warnings

KNOWN = [
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning),
]


def apply():
    """Idempotent: ``warnings.filterwarnings`` does not add a filter it already has."""
    for message, category in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category)
