"""Timing helpers shared by the benchmark scripts (jitted, warmed up, medians)."""

import statistics
import time

import jax


def time_fn(fn, *args, reps=20, warmup=3):
  """Median wall time in ms of ``fn(*args)`` (already jitted), after ``warmup`` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)


def tree_bytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def time_interleaved(calls, reps=20, warmup=3, inner=5):
  """Median wall time in ms of each ``fn(*args)`` in ``calls`` (a dict name -> (fn, args)).

  The calls take turns, ``inner`` timed calls each per round, for ``reps`` rounds, so
  that load changes on a shared machine hit all of them alike and their ratios stay
  meaningful. Each round contributes the median of its ``inner`` calls.
  """
  for fn, args in calls.values():
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  rounds = {name: [] for name in calls}
  for _ in range(reps):
    for name, (fn, args) in calls.items():
      times = []
      for _ in range(inner):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
      rounds[name].append(statistics.median(times))
  return {name: statistics.median(t) for name, t in rounds.items()}
