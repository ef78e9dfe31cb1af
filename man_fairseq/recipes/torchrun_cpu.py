"""``torchrun -m man_fairseq.recipes.torchrun_cpu <fairseq-train args>``: multi-process CPU training.

fairseq 0.12 recognises torchrun's environment but then sets
``device_id = rank % torch.cuda.device_count()``, a division by zero without a GPU. This entry
point hands fairseq the rank, world size and ``env://`` rendezvous explicitly (so fairseq's
inference step is skipped) and then runs the normal ``fairseq_cli.train`` main; everything else
(gloo process group, gradient all-reduce, checkpointing on rank 0) is fairseq's own code.
"""

import os
import sys


def main():
    rank = os.environ["RANK"]
    world = os.environ["WORLD_SIZE"]
    local_rank = os.environ.get("LOCAL_RANK", "0")
    sys.argv = [sys.argv[0]] + sys.argv[1:] + [
        "--distributed-init-method", "env://",
        "--distributed-world-size", world,
        "--distributed-rank", rank,
        "--device-id", local_rank,
        "--distributed-no-spawn",
    ]
    if "--cpu" not in sys.argv:
        sys.argv.append("--cpu")
    from fairseq_cli.train import cli_main

    cli_main()


if __name__ == "__main__":
    main()
