"""``--bf16`` no longer turns on ``--tpu``.

fairseq 0.12's ``options.parse_args_and_arch`` sets ``args.tpu = True`` whenever ``--bf16`` is given
(bf16 was a TPU mode when it was written), so ``fairseq-train --bf16`` on a GPU asked torch_xla for a
device and died (``'NoneType' object has no attribute 'xla_device'``). ``--tpu`` is now set only when
given.
"""

import sys

from fairseq import options

from .install import install


def tpu_only_when_given(original):
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        """fairseq's ``parse_args_and_arch`` without its ``if args.bf16: args.tpu = True``."""
        result = original(parser, input_args, parse_known, suppress_defaults, modify_parser)
        args = result[0] if parse_known else result
        argv = sys.argv[1:] if input_args is None else input_args
        if getattr(args, "bf16", False) and "--tpu" not in argv:
            args.tpu = False
        return result

    return parse_args_and_arch


def apply():
    install(options, "parse_args_and_arch", tpu_only_when_given)
