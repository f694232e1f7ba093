#!/usr/bin/env bash
# The QK-norm and sigmaReparam study of docs/reproduction.md ("Against QK-norm and
# sigmaReparam: the protocol").
#
# Usage: studies/qk.sh [DATA] [OUT]
#   DATA  the CIFAR-10 copy (default ../shared/data/cifar10-jpeg.tar.gz)
#   OUT   results folder (default results/patches)
#
# The protocol is fixed in docs/reproduction.md and must not change once runs exist.
# Every run is one JSON named by its whole configuration, so running this script again
# skips what is finished. It runs on one core (taskset and XLA's CPU thread settings);
# the order puts the main cell first, seed by seed, so that a partial study is paired.
# Two instances may share OUT, one per core: STIEFAX_CORE=0 STIEFAX_WORKER=0/2 and
# STIEFAX_CORE=1 STIEFAX_WORKER=1/2 (see studies/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/cifar10-jpeg.tar.gz}
OUT=${2:-results/patches}
RERUN=results/checks/patches-rerun
. studies/lib.sh

# 1. Main cell (depth 1, AdamW 1e-2, n = 10k, 40 epochs): the new arms, seeds 0-11,
#    paired with the committed A2, frozen and B2 of results/patches/main.
for s in $(seq 0 11); do
  study_add --arms A2-qknorm,A2-sigma,B2-qknorm --seeds "$s" --out "$OUT/main"
done
# 2. The rounding noise of a later commit: A2, frozen, B2 of the main cell again.
for s in 0 1 2; do
  study_add --arms A2,frozen,B2 --seeds "$s" --out "$RERUN"
done
# 3. The other three cells: A2, frozen, B2 from 3 to 6 seeds; A2-qknorm, A2-sigma at 6.
for s in 0 1 2 3 4 5; do
  for cell in "--depth 1 --adamw-lr 1e-3" "--depth 2 --adamw-lr 1e-2" "--depth 2 --adamw-lr 1e-3"; do
    # shellcheck disable=SC2086
    if ((s >= 3)); then study_add --arms A2,frozen,B2 --seeds "$s" $cell --out "$OUT/robust"; fi
    # shellcheck disable=SC2086
    study_add --arms A2-qknorm,A2-sigma --seeds "$s" $cell --out "$OUT/robust"
  done
done
study_run patches --data "$DATA"
echo "qk study: every run is finished"
