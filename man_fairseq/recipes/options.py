"""Options that mean the same in every recipe command: ``--seeds`` (``scripts/reproduce.sh``,
``scripts/demo.py``), the argparse type of every count and rate (evaluate.sh, data-prep,
reproduce.sh, the demo, the lr probe), ``--precision`` and its CPU rule (train.sh, evaluate.sh,
reproduce.sh), and the comma-separated thread counts and precisions of speed.sh.

A number out of range is argparse's one usage line and exit status 2 before any work, worded as
the plugin options' (``error: argument --avg-last: invalid value '0': must be >= 1``), never a
value taken as "not given" (``--avg-last 0`` once scored the config's average with exit 0) or
handed on to fail later under another option's name or as a traceback (``--workers 0``: a
ZeroDivisionError). Standard library only: data-prep imports it without fairseq.
"""

import argparse
import math

SEEDS_HELP = ("N (seeds 1..N) or a comma-separated list such as 2,3; one seed alone: N, with the comma "
              "(default %(default)s)")


def parse_seeds(spec):
    """``"3"`` -> [1, 2, 3]; ``"2,3"`` -> [2, 3]; ``"3,"`` -> [3]. ValueError says what is wrong: an
    empty item other than the one trailing comma (``"1,,2"`` is a typo, never read as ``1,2``)."""
    spec = str(spec).strip()
    if "," not in spec:
        n = int(spec)
        if n < 1:
            raise ValueError("must be >= 1")
        return list(range(1, n + 1))
    items = spec.split(",")
    items = items[:-1] if not items[-1].strip() else items  # "3," is seed 3 alone
    if any(not x.strip() for x in items):
        raise ValueError(f"an empty item in {spec!r} (a comma too many?)")
    seeds = [int(x) for x in items]
    if not seeds or min(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise ValueError(f"a list of distinct seeds >= 1, got {spec!r}")
    return seeds


def seeds(text):
    """``--seeds`` as an argparse ``type``: :func:`parse_seeds`, its error argparse's one line."""
    try:
        return parse_seeds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {e}") from None


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


PRECISIONS = ("fp32", "fp16", "bf16")
PRECISION_HELP = "GPU precision (default fp16, as the papers trained; the CPU runs fp32 only)"


def resolve_precision(parser, precision, cpu):
    """``--precision`` (default None) for the device: fp32 on the CPU, where fairseq's --fp16 and
    --bf16 do not run (a half precision asked for there is refused, not silently dropped), fp16 by
    default on a GPU."""
    if cpu:
        if precision not in (None, "fp32"):
            parser.error(f"--precision {precision}: the CPU runs fp32 only (fairseq's --fp16/--bf16 need a GPU)")
        return "fp32"
    return precision or "fp16"


def thread_counts(text):
    """``--threads`` as an argparse ``type``: ``"1,2"`` -> [1, 2], distinct counts >= 1."""
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: a comma-separated list of thread counts") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: distinct thread counts, each >= 1")
    return counts


def precision_list(text):
    """A comma-separated ``--precision`` as an argparse ``type``: ``"bf16,fp16"`` -> ["bf16", "fp16"]."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names or len(set(names)) != len(names) or not set(names) <= set(PRECISIONS):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: distinct names of fp32, fp16, bf16")
    return names
