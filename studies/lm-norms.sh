#!/usr/bin/env bash
# Study 3 of docs/lm.md: constant-norm matrices (the published Hyperball over Adam and
# Muon, Muon, the Riemannian sphere Adam, B2 with AdamH) against AdamW and QK-norm, on
# study 1's model, text, steps and schedule, then the larger model and the transfer of
# each arm's rate from the small model to it.
#
# Usage: studies/lm-norms.sh [OUT]     (OUT default results/lm-norms)
#
# The protocol is fixed in docs/lm.md ("Study 3") and in stiefax/experiments/lm/norms.py
# and must not change once runs exist. Every run is one JSON named by its whole
# configuration: running this script again skips what is finished and resumes an
# interrupted run from its checkpoint. A2's, A2-qknorm's and B2's runs that study 2
# already made (same configuration and seed) are copied from results/lm-fair. One core
# per instance; two instances may share OUT (STIEFAX_CORE, STIEFAX_WORKER: studies/lib.sh).
#
# Each arm's grid is bracketed (--lr bracket): once its rates have seeds 0-1, a best at
# an edge adds the rate x3 beyond it. A bracket entry adds at most one rate per side
# each time it runs, so each is listed as often as extensions are allowed (4 per side).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/lm-norms}
. studies/lib.sh
SMALL=(A2 A2-qknorm B2 AdamH AdamH-qknorm MuonH Muon B2-H SphereAdam)
REUSE=(--reuse results/lm-fair)

# Small model: each arm's bracketed grid at seeds 0-1, then seeds 2-5 at its best.
for _ in 1 2 3 4 5; do
  for arm in "${SMALL[@]}"; do
    study_add --preset sweep --arms "$arm" --lr bracket --seeds 0,1 "${REUSE[@]}"
  done
done
for arm in "${SMALL[@]}"; do
  study_add --preset sweep --arms "$arm" --lr best --select-from norms --seeds 2,3,4,5 "${REUSE[@]}"
done

# Larger model: A2, A2-qknorm and every arm within 0.01 bits per byte of the small
# model's best arm, each bracketed around its small-model best rate at seeds 0-1, then
# seeds 2-5 at its best. (Study 2's runs of A2 and A2-qknorm there are reused.)
LARGE=(--preset large --arms norms-large --cells-from "$OUT")
for _ in 1 2 3 4 5; do
  study_add "${LARGE[@]}" --lr bracket --seeds 0,1 "${REUSE[@]}"
done
study_add "${LARGE[@]}" --lr best --select-from norms --seeds 2,3,4,5 "${REUSE[@]}"

study_run lm --out "$OUT"
echo "lm-norms study: every run is finished"
