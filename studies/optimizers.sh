#!/usr/bin/env bash
# The optimizer-family comparison on the CIFAR-10 copy (docs/optimizers.md, "Accuracy:
# CIFAR-10"): manifold Muon, Muon on unconstrained frames, and B2 with the QR and Cayley
# retractions, each at a rate selected on validation images, then seeds 0-2 paired with
# the image-patch study's A2 and B2 (same data, model and budget: n=10k, 40 epochs,
# depth 1, AdamW 1e-2).
#
# Usage: studies/optimizers.sh [DATA] [OUT]
#   DATA  the CIFAR-10 copy (default ../shared/data/cifar10-jpeg.tar.gz)
#   OUT   results folder (default results/patches/optimizers)
#
# The protocol is fixed in docs/optimizers.md; running this script again skips finished
# runs (selection included) and continues where it stopped. One core, as
# studies/patches.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/cifar10-jpeg.tar.gz}
OUT=${2:-results/patches/optimizers}
CORE=${STIEFAX_CORE:-0}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTEROP_THREADS=1

for s in 0 1 2; do
  taskset -c "$CORE" stiefax patches --data "$DATA" --no-progress \
      --arms B2-mmuon,A2-muon,B2-qr,B2-cayley --seeds "$s" \
      --select-lr --select-seeds 0 --n-val 5000 \
      --grid "B2-mmuon=0.02:0.05:0.1:0.2,A2-muon=0.002:0.005:0.02:0.05,B2-qr=0.3:1:3,B2-cayley=0.3:1:3" \
      --out "$OUT"
done
echo "optimizer study: every run is finished"
