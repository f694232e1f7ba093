#!/usr/bin/env bash
# A device lease in one command: the accelerator benchmark, then the paper's grokking
# studies (section 4.3 runs (a) and (b) at seeds 0-4, each arm's seeds one vmapped
# program; section 4.4's Table 5 arms at seed 0), inside a budget, checkpointed at least
# every 40 s of training and packed into the folder that comes back, so that a lease
# cut off at any moment loses under a minute. Resumes on the next lease or on a CPU.
#
# Usage (from anywhere; it runs in the repository root):
#   studies/gpu.sh [run] [--budget SECONDS] [--out DIR] [--work DIR] [--tiny]
#       on the device: --budget (default 540) ends it cleanly, everything packed, with
#       the time left listed; --out (default $OUT) is the folder that comes back
#   studies/gpu.sh unpack DIR   here: the runs to results/grok, the benchmark to
#       results/gpu, unfinished checkpoints to studies/carry/grok; then commit them
#   studies/gpu.sh status       what is finished and what is left
#   --tiny                      every step at toy sizes (the CPU check of the slow tests)
#
# PYTHON (default python3) is the interpreter with JAX. CONTRIBUTING.md has the lease's
# exact commands and budget; studies/gpu.py the details.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m studies.gpu "$@"
