"""argparse types for the numeric options of the project's own commands (evaluate.sh, data-prep,
reproduce.sh, the demo, the lr probe, man-files2rouge).

A value out of range is argparse's one usage line and exit status 2 before any work, worded as
the plugin options' (``error: argument --avg-last: invalid value '0': must be >= 1``), never a
value taken as "not given" (``--avg-last 0`` once scored the config's average with exit 0) or
handed on to fail later under another option's name or as a traceback (``--workers 0``: a
ZeroDivisionError). Standard library only: data-prep imports it without fairseq.
"""

import argparse
import math


def number(flag, low=None, high=None, integer=True, low_open=False):
    """An argparse ``type``: an int (``integer``) or a finite float within ``[low, high]``
    (``low_open``: ``> low``)."""
    convert = int if integer else float
    bounds = " and ".join(b for b in (f"{'>' if low_open else '>='} {low}" if low is not None else "",
                                      f"<= {high}" if high is not None else "") if b)

    def parse(text):
        value = convert(text)  # a text it cannot read keeps argparse's "invalid int value: 'x'"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be a finite number")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {bounds}")
        return value

    parse.__name__ = convert.__name__  # argparse's "invalid int value"
    parse.flag = flag
    return parse
