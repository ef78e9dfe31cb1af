"""Options that mean the same in every recipe command: ``--seeds`` (``scripts/reproduce.sh``,
``scripts/demo.py``)."""

SEEDS_HELP = ("N (seeds 1..N) or a comma-separated list such as 2,3; one seed alone: N, with the comma "
              "(default %(default)s)")


def parse_seeds(spec):
    """``"3"`` -> [1, 2, 3]; ``"2,3"`` -> [2, 3]; ``"3,"`` -> [3]. ValueError says what is wrong."""
    spec = str(spec).strip()
    if "," not in spec:
        n = int(spec)
        if n < 1:
            raise ValueError("must be >= 1")
        return list(range(1, n + 1))
    seeds = [int(x) for x in spec.split(",") if x.strip()]
    if not seeds or min(seeds) < 1 or len(set(seeds)) != len(seeds):
        raise ValueError(f"a list of distinct seeds >= 1, got {spec!r}")
    return seeds
