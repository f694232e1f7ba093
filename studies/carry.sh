#!/usr/bin/env bash
# Carries the checkpoints of unfinished study runs in the repository, for a study that
# outlasts the machine it runs on.
#
# Usage: studies/carry.sh save STUDY [WORK]
#   copies every checkpoint in WORK (default ~/.cache/stiefax/studies/STUDY) to
#   studies/carry/STUDY, replacing an older copy of the same run; commit that folder.
#   The study's script copies carried checkpoints back into a WORK that lacks them (the
#   run resumes from there) and removes them once the run is finished.
#
# A checkpoint is copied whole to a temporary name and then renamed, so a copy cut short
# never replaces a good one; one copied while its run was saving fails its digest when
# read back, and the run then trains afresh (never from a damaged state).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${1:-} == save && -n ${2:-} ]] || { echo "usage: studies/carry.sh save STUDY [WORK]" >&2; exit 2; }
STUDY=$2
WORK=${3:-$HOME/.cache/stiefax/studies/$STUDY}
CARRY=studies/carry/$STUDY
mkdir -p "$CARRY"
n=0
for c in "$WORK"/*.ckpt; do
  [[ -d $c && ! -L $c ]] || continue
  name=$(basename "$c")
  rm -rf "$CARRY/.$name.tmp"
  cp -r "$c" "$CARRY/.$name.tmp"
  rm -rf "$CARRY/$name"
  mv "$CARRY/.$name.tmp" "$CARRY/$name"
  n=$((n + 1))
done
echo "carried $n checkpoint(s) of $STUDY to $CARRY"
