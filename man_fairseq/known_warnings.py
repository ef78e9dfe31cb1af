"""The one place where warnings known to be harmless are silenced (in every process that loads the
plugin: fairseq's CLIs import it through ``--user-dir``). Each is narrow: its exact message and
category, nothing else.

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


def silence():
    for message, category in KNOWN:
        warnings.filterwarnings("ignore", message=message, category=category)
