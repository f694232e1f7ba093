"""Paired statistics across seeds: differences, t-test, wins, bootstrap intervals.

Used by every experiment report: two arms run from the same seeds are compared seed by
seed (paper sections 4.5-4.7).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

__all__ = ["Paired", "paired", "bootstrap_ci", "summarize"]


@dataclasses.dataclass(frozen=True)
class Paired:
  """Paired comparison of arm ``b`` against arm ``a`` (``b - a`` per seed)."""

  n: int  # number of paired seeds
  mean: float  # mean difference
  std: float  # sample standard deviation of the differences (ddof=1)
  t: float  # paired t statistic (nan for n < 2 or zero spread)
  p: float  # two-sided p value of the paired t-test
  wins: int  # seeds where b > a
  ci_low: float  # bootstrap 95% CI of the mean difference
  ci_high: float
  diffs: tuple[float, ...]


def bootstrap_ci(
  x: npt.ArrayLike, *, resamples: int = 20_000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean of ``x`` (``resamples`` resamples).

  Uses ``scipy.stats.bootstrap``; a single value gives ``(x, x)``.
  """
  v = np.asarray(x, np.float64)
  if v.size == 0:
    return (float("nan"), float("nan"))
  if v.size == 1 or np.all(v == v[0]):
    return (float(v[0]), float(v[0]))
  res = sps.bootstrap(
    (v,),
    np.mean,
    n_resamples=resamples,
    confidence_level=level,
    method="percentile",
    random_state=np.random.default_rng(seed),
  )
  return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def paired(a: npt.ArrayLike, b: npt.ArrayLike, *, resamples: int = 20_000) -> Paired:
  """Compares ``b`` to ``a`` seed by seed (``a[i]`` and ``b[i]`` share seed ``i``)."""
  va = np.asarray(a, np.float64)
  vb = np.asarray(b, np.float64)
  if va.shape != vb.shape:
    raise ValueError(f"paired: a has {va.size} seeds, b has {vb.size}; they must match.")
  d = vb - va
  n = int(d.size)
  std = float(np.std(d, ddof=1)) if n > 1 else float("nan")
  # Differences equal up to rounding have no spread: no t statistic, not t ~ 1e15.
  if n > 1 and std > 1e-12 * max(1.0, float(np.max(np.abs(d)))):
    res = sps.ttest_rel(vb, va)
    t, p = float(res.statistic), float(res.pvalue)
  else:
    t = p = float("nan")
  lo, hi = bootstrap_ci(d, resamples=resamples)
  return Paired(
    n,
    float(np.mean(d)) if n else float("nan"),
    std,
    t,
    p,
    int(np.sum(d > 0)),
    lo,
    hi,
    tuple(float(x) for x in d),
  )


def summarize(x: npt.ArrayLike, ddof: int = 1) -> tuple[float, float]:
  """``(mean, std)`` with the given ``ddof`` (std is 0 for a single value)."""
  v = np.asarray(x, np.float64)
  if v.size == 0:
    return (float("nan"), float("nan"))
  std = float(np.std(v, ddof=ddof)) if v.size > ddof else 0.0
  return float(np.mean(v)), std
