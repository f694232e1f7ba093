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
