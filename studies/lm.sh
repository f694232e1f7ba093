#!/usr/bin/env bash
# The language-model study of docs/lm.md: the learning-rate sweep, then each arm at its
# best rate.
#
# Usage: studies/lm.sh [OUT]     (OUT default results/lm)
#
# The protocol is fixed in docs/lm.md and must not change once runs exist. Every run is
# one JSON named by its whole configuration, so running this script again skips what
# is finished and resumes an interrupted run from its checkpoint. One core per
# instance; two instances may share OUT (STIEFAX_CORE, STIEFAX_WORKER: studies/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/lm}
. studies/lib.sh
ARMS=(A2 B2 A2-qknorm frozen A2-sigma B2-qknorm B2-qr)
RATES=3e-4,1e-3,3e-3,1e-2,3e-2,1e-1,3e-1

# 1. The learning-rate sweep: every arm at seven rates, seeds 0 and 1, seed by seed.
for s in 0 1; do
  for arm in "${ARMS[@]}"; do
    study_add --arms "$arm" --lr "$RATES" --seeds "$s"
  done
done
# 2. Each arm at its best rate (chosen on seeds 0, 1 of the sweep), seeds 2-5.
for s in 2 3 4 5; do
  for arm in "${ARMS[@]}"; do
    study_add --arms "$arm" --lr best --seeds "$s"
  done
done
study_run lm --preset sweep --out "$OUT"
echo "lm study: every run is finished"
