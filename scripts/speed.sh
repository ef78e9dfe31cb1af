#!/usr/bin/env bash
# Each family's real cost against the Transformer on a study's own batches:
#   scripts/speed.sh multi30k-cpu|gigaword-cpu|cnndm-cpu|multi30k [--families transformer,man,...]
#       [--threads 1,2] [--repeats 3] [--updates 60] [--log-interval 10] [--decode-sentences 200]
#       [--batch-size 128] [--data DIR] [--runs-dir DIR] [--results-dir DIR] [--force]
#       [--table-only] [--update-docs] [-- fairseq options]
# Training words/s and peak memory of fairseq-train, decoding sentences/s of fairseq-generate with
# each config's settings (the study's trained checkpoint when there is one), interleaved, several
# repeats, per thread count. Records: results/speed/EXPERIMENT-threadsT.json; table:
# results/speed/EXPERIMENT.md, rebuilt from the records. Measure on an idle machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$python" -m lab.speed.study "$@"
