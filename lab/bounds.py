"""The ceilings of the lab instruments' counts, as argparse ``type``s (:func:`man_recipes.options.number`):
every numeric option of the lab is bounded where it is parsed, so that no value hangs, exhausts or
overflows the machine (``--repeats 10^12`` hung, ``--threads 1000000`` segfaulted,
``--required-batch-size-multiple 0`` died on SIGFPE) and a value beyond is argparse's one line naming
the bound."""

from man_recipes.options import number

# interleaved repeats of a measurement (lab.speed.fused_bias, speed.sh study): 20 x the usual 5
MAX_REPEATS = 100
# updates of one measurement's training run (speed.sh study, lab.lr_probe, lab.gpu_check): minutes to hours
# at the studies' sizes, where 10^12 never ended
MAX_UPDATES = 1_000_000
# tokens of one batch (lab.flex_keys, lab.lr_probe --max-tokens): 80 x the 12,288 of the Gigaword
# config's batches; fairseq's batching holds such counts in int64 (10^30 overflowed)
MAX_BATCH_TOKENS = 1_000_000
# a wall-clock limit in seconds (lab.gpu_check --timeout): a borrowed GPU node's whole day
MAX_SECONDS = 86_400


def positive(flag, high, ceiling):
    """An int 1 .. ``high``, ``ceiling`` saying what ``high`` is in the refusal."""
    return number(flag, low=1, high=high, ceiling=ceiling)


def repeats(flag):
    return positive(flag, MAX_REPEATS, "20 x a measurement's usual 5 repeats")


def updates(flag):
    return positive(flag, MAX_UPDATES, "the ceiling of a measurement's training run")


def batch_tokens(flag):
    return positive(flag, MAX_BATCH_TOKENS, "80 x the Gigaword config's 12,288 tokens a batch")
