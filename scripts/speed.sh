#!/usr/bin/env bash
# The one speed command (lab/speed/, results/speed/README.md):
#   scripts/speed.sh [study] EXPERIMENT [options]  a study's real batches (fairseq-train, fairseq-generate)
#   scripts/speed.sh synthetic [options]           random batches at the papers' widths
#   scripts/speed.sh profile EXPERIMENT [options]  one update per family by op; --passes: calibration's by phase
# Each mode's options: scripts/speed.sh MODE --help. Measure on an idle machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
case "${1:-}" in study|synthetic|profile|-h|--help) ;; *) set -- study "$@" ;; esac
exec "$python" -m lab.speed "$@"
