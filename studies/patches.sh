#!/usr/bin/env bash
# The image-patch study of docs/reproduction.md ("Image-patch claims at full protocol").
#
# Usage: studies/patches.sh [DATA] [OUT]
#   DATA  the CIFAR-10 copy (default ../shared/data/cifar10-jpeg.tar.gz)
#   OUT   results folder (default results/patches)
#
# The protocol is fixed in docs/reproduction.md and must not change once runs exist:
# a different protocol is a different study in a different folder. Every run is one
# JSON named by its whole configuration, so running this script again skips what is
# finished and continues where it stopped. It runs on one core (taskset and XLA's CPU
# thread settings), so the rest of the machine stays usable; the order puts the
# runs that decide the headline claims first, seed by seed, so that a partial study
# is already paired.
#
# Two instances may share OUT, one per core: STIEFAX_CORE=0 STIEFAX_WORKER=0/2 and
# STIEFAX_CORE=1 STIEFAX_WORKER=1/2. Worker k of K first runs the commands whose index
# is k modulo K (no two commands share a run); then every command in order with
# --no-wait, which skips finished runs, trains the runs no instance holds and leaves
# the held ones to their instance; then every command once more, waiting for the runs
# another instance is training; so no core waits while a free run is left, and each
# instance ends only when the whole study is finished.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/cifar10-jpeg.tar.gz}
OUT=${2:-results/patches}
CORE=${STIEFAX_CORE:-1}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTEROP_THREADS=1

WORKER=${STIEFAX_WORKER:-0/1}

# The study is a list of commands, collected here and run at the end.
study=()
patches() { study+=("$(printf '%q ' "$@")"); }

# 1. Table 6 core: A2, frozen, B2 (n=10k, 40 epochs, depth 1, AdamW 1e-2), seeds 0-11.
for s in $(seq 0 11); do
  patches --arms A2,frozen,B2 --seeds "$s" --out "$OUT/main"
done
# 2. Robustness of the frozen result: the other three cells of depth {1,2} x AdamW
#    rate {1e-3, 1e-2}; the main study is the (1, 1e-2) cell.
for s in 0 1 2; do
  patches --arms A2,frozen,B2 --seeds "$s" --depth 1 --adamw-lr 1e-3 --out "$OUT/robust"
  patches --arms A2,frozen,B2 --seeds "$s" --depth 2 --adamw-lr 1e-2 --out "$OUT/robust"
  patches --arms A2,frozen,B2 --seeds "$s" --depth 2 --adamw-lr 1e-3 --out "$OUT/robust"
done
# 3. Tables 6-7: B2-SGD (PA16), Grassmann-projector and elementwise-moment Adam.
for s in $(seq 0 11); do
  patches --arms B2-SGD,grassmann,elementwise --seeds "$s" --out "$OUT/main"
done
# 4. Soft penalty at three lambdas, seed 0.
for lam in 0.01 0.1 1; do
  patches --arms soft --lr "soft=$lam" --seeds 0 --out "$OUT/soft"
done
# 5. Section 4.7: eps probe (eps = 1e-8 is the main study's B2).
for s in $(seq 0 5); do
  patches sweep-eps --arms B2 --eps-values 1e-6,1e-4,1e-2,1e-1 --seeds "$s" --out "$OUT/eps"
done
for s in $(seq 6 11); do
  patches sweep-eps --arms B2 --eps-values 1e-1 --seeds "$s" --out "$OUT/eps"
done
# 6. Table 3: data-size sweep at about 2 000 steps.
for s in 0 1 2; do
  patches sweep-n --arms A2,B2 --seeds "$s" --out "$OUT/sweep-n"
done
run() { eval "taskset -c \"\$CORE\" stiefax patches --data \"\$DATA\" --no-progress ${study[$1]} ${2:-}"; }
k=${WORKER%/*} K=${WORKER#*/}
for i in "${!study[@]}"; do
  if ((i % K == k)); then run "$i" --no-wait || echo "study: entry $i runs again later"; fi
done
for i in "${!study[@]}"; do
  run "$i" --no-wait || echo "study: entry $i runs again later"
done
for i in "${!study[@]}"; do
  run "$i"
done
echo "patches study: every run is finished"
