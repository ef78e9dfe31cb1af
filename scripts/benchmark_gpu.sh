#!/usr/bin/env bash
# The full GPU benchmark: every family against fairseq's transformer, widths small, base and big,
# every attention backend, bf16 as fairseq-train --bf16 (whole model cast), realistic batches.
# Writes a Markdown report (and the raw JSON) to $OUT_DIR; paste the table into
# docs/benchmarks.md with the device.
# Usage: scripts/benchmark_gpu.sh [OUT_DIR] [extra benchmark.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-benchmark-gpu-$(date -u +%Y%m%d-%H%M)}
shift || true
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT_DIR/device.csv" || true
for dtype in bf16; do
  python scripts/benchmark.py --device cuda --dtype "$dtype" --width small,base,big \
    --backend auto,sdpa,flex,explicit --max-tokens 8192 --iters 30 --warmup 10 \
    --decode-sentences 128 --decode-len 40 --decode-iters 5 --memory-iters 3 \
    --output "$OUT_DIR/benchmark-$dtype.md" --json "$OUT_DIR/benchmark-$dtype.json" "$@" \
    2> >(tee "$OUT_DIR/benchmark-$dtype.log" >&2)
done
echo "report: $OUT_DIR/benchmark-bf16.md"
