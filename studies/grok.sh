#!/usr/bin/env bash
# The paper-scale grokking runs on a CPU: the five arms of Table 4 at `--preset paper`,
# seed 0, one at a time (about 95 minutes per arm on two cores, 5-7 hours on one loaded
# core). A2 and B2 come first; of the controls, B2-frz (frames frozen at their
# orthonormal init) comes first, the row that separates the constraint from the step
# rule; then B2m (the matched Euclidean moment) and B2m-can (the canonical metric).
#
# Usage: studies/grok.sh [WORK] [OUT]
#   WORK  where runs train, with their Orbax checkpoints and locks (default
#         ~/.cache/stiefax/studies/grok): outside the repository, so an interrupted
#         run resumes from its last checkpoint when this script runs again
#   OUT   where finished runs' JSON is copied for the repository (default results/grok)
#
# STIEFAX_CORE (default 0) is the core list for taskset: one core runs XLA on one
# thread; a list such as 0,1 leaves XLA its default threads.
#
# A run longer than the machine it started on lasts is carried in the repository:
# `studies/carry.sh save grok` copies the checkpoints in WORK to studies/carry/grok,
# this script copies them back into a WORK that lacks them, and removes a carried
# checkpoint once its run's JSON is in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-$HOME/.cache/stiefax/studies/grok}
OUT=${2:-results/grok}
CARRY=studies/carry/grok
CORE=${STIEFAX_CORE:-0}
if [[ $CORE != *,* && $CORE != *-* ]]; then
  export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
fi
mkdir -p "$WORK" "$OUT"
# Finished runs already in OUT are skipped: the store finds them by their whole
# configuration's hash (-n: nothing in WORK is overwritten).
cp -n "$OUT"/*.json "$WORK"/ 2>/dev/null || true
for c in "$CARRY"/*.ckpt; do
  if [[ -d $c && ! -e $WORK/$(basename "$c") ]]; then
    cp -r "$c" "$WORK"/ && echo "grok study: resuming from the carried $(basename "$c")"
  fi
done
for arm in A2 B2 B2-frz B2m B2m-can; do
  taskset -c "$CORE" stiefax grok --preset paper --arms "$arm" --seeds 0 \
      --checkpoint-every 500 --out "$WORK"
  cp -n "$WORK"/*.json "$OUT"/ 2>/dev/null || true
done
for c in "$CARRY"/*.ckpt; do
  if [[ -d $c && -e $OUT/$(basename "$c" .ckpt).json ]]; then rm -r "$c"; fi
done
echo "grok study: every run is finished"
