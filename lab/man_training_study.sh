#!/usr/bin/env bash
# Controlled runs behind docs/man.md, "Training speed against the Transformer": one model per call, the
# issue's Multi30k setting (d=256, 3+3 layers, FFN 1024, lr 1e-3, warm-up 300, 3 epochs, seed 1), run
# under the sublayer gradient recorder (fairseq-train's own loop). Usage:
#   lab/man_training_study.sh NAME ARCH [fairseq options that make this run differ ...]
# Writes runs/STUDY/NAME/{train.log,command.txt,sublayer_grads.json,.png}; then
#   python lab/man_training_study.py --study STUDY  ->  results/STUDY/ (small records) + docs PNG.
# STUDY (default man-training-study), THREADS (default 1) and EPOCHS (default 3) come from the environment;
# SAVE=1 keeps the last checkpoint (runs/STUDY/NAME/checkpoints/checkpoint_last.pt, for the analysis commands).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
[ $# -ge 2 ] || { echo "usage: $0 NAME ARCH [fairseq options ...]" >&2; exit 2; }
name=$1; arch=$2; shift 2
bounded THREADS "${THREADS:-1}" "$(nproc)" "the CPU cores here"
bounded EPOCHS "${EPOCHS:-3}" 1000 "the study trains 3"
data="${DATA:-$repo/data-bin/multi30k.de-en}"
[ -f "$data/dict.de.txt" ] || { echo "no Multi30k data-bin at $data: run data-prep/prepare-multi30k.sh" >&2; exit 2; }
out="$repo/runs/${STUDY:-man-training-study}/$name"
mkdir -p "$out"
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1}
args=("$data" --user-dir "$repo/man_fairseq" --task translation --arch "$arch" --source-lang de --target-lang en
  --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-08 --clip-norm 0.0 --lr 1e-3
  --lr-scheduler inverse_sqrt --warmup-updates 300 --warmup-init-lr 1e-07
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --dropout 0.3 --weight-decay 0.0001
  --share-all-embeddings --max-tokens 4096 --max-epoch "${EPOCHS:-3}" --log-format simple
  --log-interval 25 --num-workers 0 --seed 1 --cpu
  --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-layers 3 --decoder-layers 3
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 "$@")
if [ "${SAVE:-0}" = 1 ]; then
  # fairseq would resume from an earlier run's checkpoint_last.pt instead of training from scratch
  [ ! -e "$out/checkpoints" ] || { echo "$out/checkpoints exists (an earlier run): use another NAME" >&2; exit 2; }
  args+=(--save-dir "$out/checkpoints" --no-epoch-checkpoints --no-save-optimizer-state)
else
  args+=(--no-save)
fi
{ printf '%q ' "$python" -m lab.sublayer_grads --out "$out" -- "${args[@]}"; echo
  echo "threads=$OMP_NUM_THREADS commit=$(git -C "$repo" rev-parse --short HEAD) started=$(date -u +%FT%TZ)"; } > "$out/command.txt"
"$python" -m lab.sublayer_grads --out "$out" --title "$name" -- "${args[@]}" > "$out/train.log" 2>&1
echo "finished=$(date -u +%FT%TZ)" >> "$out/command.txt"
