#!/usr/bin/env bash
# A short, time-boxed session on a borrowed GPU node without a package registry (Python with its
# own CUDA torch, no fairseq), run from the checkout's root:
#
#   BUDGET=560 OUT=results-dir lab/gpu_session.sh WHEELHOUSE [CNNDM_DATA]
#
# WHEELHOUSE holds what the node lacks of `make wheelhouse`'s folder (on the H200 nodes of
# results/gpu/: 19 packages with the folder's pins.txt and wheelhouse.json, 18 MiB, listed in
# results/gpu/2026-11-27-h200.md). CNNDM_DATA (default
# data-bin/cnndm-sub) is a small CNN/DM data folder (`python -m man_recipes.data.head_subset
# data-bin/cnndm-40k data-bin/cnndm-sub --pairs train=4000,valid=300,test=300`); Multi30k is read
# from data-bin/multi30k.de-en. Steps, most informative first, each capped by what is left of
# BUDGET seconds and bundled into $OUT/bundle.tgz as it ends:
#   1. install: requirements from WHEELHOUSE, fairseq's source built in place without ninja (with it
#      the parallel extensions share one build.ninja and fail to link; CUDA_HOME unset: no nvcc extensions);
#   2. scripts/speed.sh profile on CNN/DM sources, bf16: transformer, core, man, localness;
#   3. the flex recompilation test alone with TORCH_LOGS=recompiles (its dynamic-shape compile failed
#      on CUDA in results/gpu/2026-11-29-h200.md; the log and the warning now say why), then pytest tests/gpu (-n 16);
#   4. scripts/speed.sh on the studies of SPEED_STUDIES (default: gigaword-cpu cnndm-cpu; Multi30k's were
#      measured in the first two sessions) in bf16, training only, one repeat.
# A failing step stops the session (set -e), but for those whose failure the next step reports or
# tolerates (the install, the build, each capped measurement): their rc is logged and the session goes on.
set -euo pipefail
WH=${1:?usage: lab/gpu_session.sh WHEELHOUSE [CNNDM_DATA]}; CNNDM=${2:-data-bin/cnndm-sub}
BUDGET=${BUDGET:-560}
case $BUDGET in ''|*[!0-9]*) ok=0;; *) [ ${#BUDGET} -le 5 ] && [ "$BUDGET" -ge 1 ] && [ "$BUDGET" -le 86400 ] && ok=1 || ok=0;; esac
[ "$ok" = 1 ] || { echo "lab/gpu_session.sh: BUDGET=$BUDGET: seconds, an integer >= 1 and <= 86400 (a day)" >&2; exit 2; }
OUT=${OUT:?set OUT to the results folder}; mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( START + BUDGET - $(date +%s) )); }
log() { echo "[$(date +%T) +$(( $(date +%s) - START ))s] $*"; }
D=$(mktemp -d); W=$(mktemp -d); R=$PWD  # D: what comes back (bundled); W: the fairseq build
bundle() { { tar czf "$OUT/bundle.tgz.part" -C "$D" . 2>/dev/null && mv "$OUT/bundle.tgz.part" "$OUT/bundle.tgz"; } ||
  log "bundle failed (rc=$?); the last bundle stays"; }
exec > >(tee -a "$OUT/session.log") 2>&1
trap 'log "stopped: \`$BASH_COMMAND\` failed (rc=$?)"; bundle' ERR  # the step that stopped the session
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv,noheader; uptime

PY=$(command -v python3); export PIP_CONFIG_FILE=/dev/null PYTHONUNBUFFERED=1
log "install"
EXTRAS=$($PY -c 'import sys; sys.path[:0] = ["scripts"]; import wheelhouse; print(" ".join(wheelhouse.extras()))')  # pytest, ...
rc=0; $PY -m pip install -q --no-index --find-links "$WH" -r requirements.txt $EXTRAS > "$D/pip.log" 2>&1 || rc=$?
log "requirements rc=$rc"  # the import check below says whether the install is complete
mkdir -p "$W/fs" && tar xzf "$WH"/fairseq_fixed-*.tar.gz -C "$W/fs"
FS=$(ls -d "$W"/fs/fairseq*)
# a failing `ninja` first on PATH, so that torch's BuildExtension builds without it (dropping ninja's
# folder from PATH is not enough where /bin links to /usr/bin)
mkdir -p "$W/noninja" && printf '#!/bin/sh\nexit 1\n' > "$W/noninja/ninja" && chmod +x "$W/noninja/ninja"
rc=0; ( cd "$FS" && time env -u CUDA_HOME PATH="$W/noninja:$PATH" timeout $(( $(left) / 2 )) $PY setup.py build_ext --inplace -j 16 ) \
  > "$D/build.log" 2>&1 || rc=$?
log "fairseq build rc=$rc"; tail -3 "$D/build.log"
export PYTHONPATH=$FS:$R
mkdir -p "$W/bin"
for t in train preprocess generate; do
  printf '#!/bin/sh\nexec %s -m fairseq_cli.%s "$@"\n' "$PY" $t > "$W/bin/fairseq-$t"; chmod +x "$W/bin/fairseq-$t"
done
export PATH=$(dirname "$PY"):$W/bin:$PATH
python -c 'import torch, fairseq, man_fairseq; from fairseq.data import data_utils_fast
print("torch", torch.__version__, "fairseq", fairseq.__version__)' || { log "the install is incomplete"; bundle; exit 1; }
bundle

capped() {  # NAME RESERVE_S COMMAND...: run with what is left minus RESERVE_S, log in $D/NAME.log
  local name=$1 reserve=$2; shift 2
  local cap=$(( $(left) - reserve ))
  if [ $cap -lt 30 ]; then log "skip $name (${cap}s left for it)"; return; fi
  log "$name (cap ${cap}s)"; uptime
  local rc=0; timeout $cap "$@" > "$D/$name.log" 2>&1 || rc=$?
  log "$name rc=$rc"; bundle  # the next step runs whatever this one ended in
}
capped profile 330 python -m lab.speed profile cnndm-cpu --device cuda --precision bf16 \
  --families transformer,core,man,localness --data "$CNNDM" --output "$D/profile-cnndm-bf16.md"
if [ -f "$D/profile-cnndm-bf16.md" ]; then sed -n 5,11p "$D/profile-cnndm-bf16.md"; fi
capped flex-recompiles 300 env TORCH_LOGS=recompiles python -m pytest -q -n 2 -p no:cacheprovider \
  tests/gpu/test_gpu_backends.py -k recompiles
grep -iE 'recompil|guard|passed|failed' "$D/flex-recompiles.log" | head -40 || true  # none (or no log: skipped)
per_test=(); python -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 170)
capped tests-gpu 150 python -m pytest -v -n 16 ${per_test[@]+"${per_test[@]}"} -p no:cacheprovider tests/gpu \
  --junitxml="$D/tests-gpu.xml"
grep -E 'FAILED|ERROR|[0-9]+ (passed|failed|skipped)' "$D/tests-gpu.log" | grep -v PASSED | tail -20 || true
for exp in ${SPEED_STUDIES:-gigaword-cpu cnndm-cpu}; do
  data=(); [ $exp = cnndm-cpu ] && data=(--data "$CNNDM")
  capped speed-$exp 5 env TMPDIR="$D" python -m lab.speed study $exp --device cuda --precision bf16 \
    --repeats 1 --updates 60 --log-interval 20 --skip-decoding ${data[@]+"${data[@]}"} --results-dir "$D/results"
  grep -E '^\[speed' "$D/speed-$exp.log" | tail -8 || true
done
log done
