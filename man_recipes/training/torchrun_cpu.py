"""``torchrun -m man_recipes.training.torchrun_cpu <fairseq-train args>``: multi-process CPU training.

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
    import torch.distributed as dist
    from fairseq_cli.train import cli_main

    cli_main()
    # fairseq ends with a barrier but leaves the gloo group alive; a process exiting with live
    # gloo threads can abort at interpreter teardown (SIGABRT, "terminate called without an
    # active exception"). All ranks passed fairseq's barrier: tear the group down explicitly.
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
