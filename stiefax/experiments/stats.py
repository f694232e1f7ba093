"""Paired statistics across seeds: differences, t-test, wins, bootstrap intervals.

Used by every experiment report: two arms run from the same seeds are compared seed by
seed (paper sections 4.5-4.7).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

__all__ = [
  "Paired",
  "paired",
  "bootstrap_ci",
  "t_interval",
  "ratio_ci",
  "verdict",
  "MIN_SEEDS",
  "summarize",
]

#: The fewest paired seeds a verdict may rest on (docs/reproduction.md, "Statistical
#: standard").
MIN_SEEDS = 6


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
  t_low: float = float("nan")  # paired-t 95% CI of the mean difference
  t_high: float = float("nan")

  @property
  def verdict(self) -> str:
    """``"b > a"``, ``"b < a"``, ``"no difference"`` or ``"not settled"`` (:func:`verdict`)."""
    return verdict(self)


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


def t_interval(x: npt.ArrayLike, level: float = 0.95) -> tuple[float, float]:
  """Student-t interval of the mean of ``x`` (``(x, x)`` with no spread, nan for n < 2)."""
  v = np.asarray(x, np.float64)
  if v.size < 2:
    return (float("nan"), float("nan"))
  m, sd = float(np.mean(v)), float(np.std(v, ddof=1))
  if sd == 0:
    return (m, m)
  half = float(sps.t.ppf(0.5 + level / 2, v.size - 1)) * sd / np.sqrt(v.size)
  return (m - half, m + half)


def ratio_ci(
  num: npt.ArrayLike, den: npt.ArrayLike, *, resamples: int = 20_000, seed: int = 0
) -> tuple[float, float]:
  """Percentile-bootstrap 95% interval of ``mean(num) / mean(den)``, resampling seeds.

  ``num[i]`` and ``den[i]`` share seed ``i`` (e.g. the paired gains frozen - A2 and
  B2 - A2, whose ratio is the frozen arm's share of B2's gain).
  """
  a, b = np.asarray(num, np.float64), np.asarray(den, np.float64)
  if a.size < 2 or a.shape != b.shape:
    return (float("nan"), float("nan"))
  idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
  with np.errstate(divide="ignore", invalid="ignore"):
    r = a[idx].mean(1) / b[idx].mean(1)
  r = r[np.isfinite(r)]
  if r.size == 0:
    return (float("nan"), float("nan"))
  return (float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5)))


def verdict(p: Paired) -> str:
  """The statistical standard: both 95% intervals must agree, on >= 6 paired seeds.

  ``"b > a"`` (or ``"b < a"``) when the paired-t and the bootstrap intervals both
  exclude 0 on that side; ``"no difference"`` when both hold 0; otherwise, or with
  fewer than :data:`MIN_SEEDS` seeds, ``"not settled"``.
  """
  if p.n < MIN_SEEDS or not all(np.isfinite([p.t_low, p.t_high, p.ci_low, p.ci_high])):
    return "not settled"
  if p.t_low > 0 and p.ci_low > 0:
    return "b > a"
  if p.t_high < 0 and p.ci_high < 0:
    return "b < a"
  if p.t_low <= 0 <= p.t_high and p.ci_low <= 0 <= p.ci_high:
    return "no difference"
  return "not settled"


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
  t_lo, t_hi = t_interval(d)
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
    t_lo,
    t_hi,
  )


def summarize(x: npt.ArrayLike, ddof: int = 1) -> tuple[float, float]:
  """``(mean, std)`` with the given ``ddof`` (std is 0 for a single value)."""
  v = np.asarray(x, np.float64)
  if v.size == 0:
    return (float("nan"), float("nan"))
  std = float(np.std(v, ddof=ddof)) if v.size > ddof else 0.0
  return float(np.mean(v)), std
