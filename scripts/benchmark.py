#!/usr/bin/env python
"""Speed and memory of the man-fairseq families against fairseq's own Transformer.

For every case (a family's arch + options) and for fairseq's ``transformer`` of the same width,
on the SAME random token batches, this measures

* training target tokens/s: forward + backward + optimizer step with the family's criterion
  (``label_smoothed_cross_entropy`` or ``calibrated_label_smoothed_cross_entropy``) and
  fairseq's Adam, median over the timed iterations after warm-up iterations; ``--dtype
  fp16|bf16`` is the recipes' precision, ``fairseq-train --fp16|--bf16``: the whole model cast,
  fp32 master weights in fairseq's ``FP16Optimizer`` (not autocast);
* peak training memory: on CPU the peak resident set size (VmHWM, reset through
  ``/proc/self/clear_refs`` after the model is built) minus the RSS just before the first
  update, i.e. gradients + Adam state + activations + allocator slack; on CUDA
  ``torch.cuda.max_memory_allocated`` minus the memory allocated before the first update;
* beam-search decoding sentences/s with fairseq's ``SequenceGenerator`` (beam 4) on one source
  batch; ``min_len = max_len_b`` forces every hypothesis to the same length, so untrained models
  that emit EOS at different times are compared on the same number of decoder steps.

Every model is built through fairseq's own path (``options.get_training_parser`` ->
``parse_args_and_arch`` -> ``convert_namespace_to_omegaconf`` -> ``tasks.setup_task`` ->
``task.build_model`` / ``task.build_criterion`` / ``optim.build_optimizer``) with
``--user-dir man_fairseq --share-all-embeddings`` on a temporary joined dictionary, and runs in a
subprocess of its own (so peak memory is per model and one model's allocator state does not
leave garbage for the next). It prints (and with ``--output`` writes) a Markdown table with the
absolute numbers, the case/baseline ratios, and each case's target. The logic lives in
``man_fairseq/bench/`` (cases, batching, model, workers, report, cli).

Examples::

    python scripts/benchmark.py                                 # CPU, base width, all cases
    python scripts/benchmark.py --cases man --iters 5 --output bench.md
    python scripts/benchmark.py --device cuda --dtype fp16 --max-tokens 4096 --iters 20
    python scripts/benchmark.py --device cuda --dtype bf16 --width small,base,big \
        --backend auto,sdpa,flex,explicit --max-tokens 8192 --output bench-gpu.md   # scripts/benchmark_gpu.sh

Each family runs with ``--attention-backend`` set to every backend of ``--backend``; fairseq's
``transformer`` is measured again next to each (width, backend) group, in the same process, on
the same batches. The project's targets are checked on CPU at base width and on CUDA at every
width, including peak memory for MAN. With ``flex`` the number of graphs
dynamo compiled during each model's steps is reported (bucketed lengths keep it small).
"""

import sys
from pathlib import Path

# this checkout's package, whatever else is installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.speed.synthetic import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1]))
