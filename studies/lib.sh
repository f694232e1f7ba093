# Shared by the study scripts: one core, one XLA thread, and the worker split.
#
# A study is a list of argument lists (study_add ARGS...), run at the end by
# study_run COMMAND [COMMON ARGS...] as `stiefax COMMAND COMMON... ARGS... --no-progress`,
# pinned to core $STIEFAX_CORE (default 1). With STIEFAX_WORKER=k/K, instance k of K
# first runs the entries whose index is k modulo K (no two instances share a run); then
# every entry in order with --no-wait: finished runs are skipped, free runs are trained
# and runs another instance holds are left to it, so no core waits while a free run
# is left; then every entry in order once more, waiting for the held runs, so each
# instance ends only when the whole study is finished. An entry that fails before the
# last pass (one that needs runs not yet finished, such as `stiefax lm --lr best`, or
# one whose runs are held) runs again in the next.
CORE=${STIEFAX_CORE:-1}
WORKER=${STIEFAX_WORKER:-0/1}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_NUM_INTEROP_THREADS=1
study=()
study_add() { study+=("$(printf '%q ' "$@")"); }
study_run() {
  local command=$1 i k=${WORKER%/*} n=${WORKER#*/}
  shift
  local common
  common=$(printf '%q ' "$@")
  _study_one() { eval "taskset -c \"\$CORE\" stiefax $command $common--no-progress ${2:-}${study[$1]}"; }
  for i in "${!study[@]}"; do
    if ((i % n == k)); then
      _study_one "$i" "--no-wait " || echo "study: entry $i is not ready; it runs again later"
    fi
  done
  for i in "${!study[@]}"; do
    _study_one "$i" "--no-wait " || echo "study: entry $i is not ready; it runs again later"
  done
  for i in "${!study[@]}"; do
    _study_one "$i"
  done
}
