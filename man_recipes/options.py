"""Options that mean the same in every recipe command: ``--seeds`` (``scripts/reproduce.sh``,
``scripts/demo.py``), the argparse type of every count and rate (evaluate.sh, data-prep,
reproduce.sh, the demo, the lr probe), ``--precision``, its CPU rule and fairseq flags, and the GPUs
in view (train.sh, evaluate.sh, reproduce.sh), and the comma-separated thread counts and precisions of speed.sh.

A number out of range is argparse's one usage line and exit status 2 before any work, worded as
the plugin options' (``error: argument --avg-last: invalid value '0': must be >= 1``), never a
value taken as "not given" (``--avg-last 0`` once scored the config's average with exit 0) or
handed on to fail later under another option's name or as a traceback (``--workers 0``: a
ZeroDivisionError). Standard library only: data-prep imports it without fairseq.
"""

import argparse
import math
import os

SEEDS_HELP = ("N (seeds 1..N) or a comma-separated list such as 2,3; one seed alone: N, with the comma "
              "(default %(default)s)")


def comma_items(spec):
    """The items of a comma-separated list, one trailing comma allowed (``"3,"``: one item); ValueError
    for an empty item elsewhere (``"1,,2"`` is a typo, never read as ``1,2``)."""
    items = str(spec).split(",")
    items = items[:-1] if len(items) > 1 and not items[-1].strip() else items
    if any(not x.strip() for x in items):
        raise ValueError(f"an empty item in {spec!r} (a comma too many?)")
    return items


# At most this many seeds, each a training run (``--seeds 1000000000000`` built a list of 10^12 seeds).
MAX_SEEDS = 1000


def parse_seeds(spec):
    """``"3"`` -> [1, 2, 3]; ``"2,3"`` -> [2, 3]; ``"3,"`` -> [3]. ValueError says what is wrong: an
    empty item other than the one trailing comma (``"1,,2"`` is a typo, never read as ``1,2``), more
    than :data:`MAX_SEEDS` seeds."""
    spec = str(spec).strip()
    if "," not in spec:
        n = int(spec)
        if n < 1 or n > MAX_SEEDS:
            raise ValueError(f"must be >= 1 and <= {MAX_SEEDS} (each seed is a training run)")
        return list(range(1, n + 1))
    too_many = f"more than {MAX_SEEDS} seeds (each seed is a training run)"
    if spec.count(",") > MAX_SEEDS:  # counted before the items are read
        raise ValueError(too_many)
    seeds = [int(x) for x in comma_items(spec)]
    if len(seeds) > MAX_SEEDS:
        raise ValueError(too_many)
    if not seeds or min(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise ValueError(f"a list of distinct seeds >= 1, got {spec!r}")
    return seeds


def seeds(text):
    """``--seeds`` as an argparse ``type``: :func:`parse_seeds`, its error argparse's one line."""
    try:
        return parse_seeds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {e}") from None


def cpu_cores():
    """The CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def number(flag, low=None, high=None, integer=True, low_open=False, ceiling=None):
    """An argparse ``type``: an int (``integer``) or a finite float within ``[low, high]``
    (``low_open``: ``> low``). ``ceiling``: what ``high`` is, named in the refusal (``"the CPU cores
    here"``), so that no value exhausts the machine (``--workers 1000000`` opened a million processes)."""
    convert = int if integer else float
    bounds = " and ".join(b for b in (f"{'>' if low_open else '>='} {low}" if low is not None else "",
                                      f"<= {high}" if high is not None else "") if b)
    bounds += f" ({ceiling})" if ceiling else ""

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


def precision_args(device: str, precision: str):
    """fairseq flags for the device and precision (fp16/bf16 apply on GPU only)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be fp32, fp16 or bf16, got {precision!r}")
    if device == "cpu":
        return ["--cpu"]
    return {"fp16": ["--fp16"], "bf16": ["--bf16"], "fp32": []}[precision]


def visible_gpus():
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: treat as CPU
        return 0


def thread_counts(text):
    """``--threads`` as an argparse ``type``: ``"1,2"`` -> [1, 2], distinct counts from 1 to the cores,
    an empty item refused as ``--seeds``' (``"1,,2"``)."""
    try:
        items = comma_items(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {e}") from None
    try:
        counts = [int(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: a comma-separated list of thread counts") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: distinct thread counts, each >= 1")
    cores = cpu_cores()
    if max(counts) > cores:  # more threads than cores measures the contention, not the model
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: each <= {cores} "
                                         f"(the {cores} CPU core(s) this process may use)")
    return counts


def precision_list(text):
    """A comma-separated ``--precision`` as an argparse ``type``: ``"bf16,fp16"`` -> ["bf16", "fp16"]."""
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    if not names or len(set(names)) != len(names) or not set(names) <= set(PRECISIONS):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: distinct names of fp32, fp16, bf16")
    return names


def workers(flag="--workers"):
    """``--workers`` (processes) or ``--threads`` as an argparse ``type``: 1 .. the CPU cores this process
    may use; more only contend for them (``--workers 1000000`` opened a million processes)."""
    cores = cpu_cores()
    return number(flag, low=1, high=cores, ceiling=f"the {cores} CPU core(s) this process may use")


# The ceiling of a generated corpus (scripts/demo.py --train-size/--eval-size, speed.sh synthetic
# --sentences), in sentence pairs: 30 x the demo's default, and no more memory than a small corpus's.
MAX_GENERATED_PAIRS = 1_000_000


def generated_pairs(flag):
    return number(flag, low=1, high=MAX_GENERATED_PAIRS, ceiling="the ceiling of a generated corpus")


# fairseq-generate's sentences per batch (--batch-size): more than any test set here holds (CNN/DM's 11,490);
# fairseq's batching holds it in int64 (--batch-size 10^30 was an OverflowError naming no option)
MAX_BATCH_SENTENCES = 1_000_000


def batch_size(flag="--batch-size"):
    return number(flag, low=1, high=MAX_BATCH_SENTENCES, ceiling="sentences per batch: more than any test set holds")


# The ceiling of every resampling count (--bootstrap-samples; ROUGE-1.5.5's -r): 10 x the field's 1000,
# a p-value resolution of 1e-4; the paired bootstrap holds samples x documents indices in memory
# (10^12 asked for 728 TiB).
MAX_RESAMPLES = 10_000


def resamples(flag):
    """A resampling count as an argparse ``type``: 1 .. :data:`MAX_RESAMPLES`."""
    return number(flag, low=1, high=MAX_RESAMPLES, ceiling="10 x the field's 1000 resamples")
