"""Paired statistics across seeds: differences, t-test, wins, bootstrap intervals.

Used by every experiment report: two arms run from the same seeds are compared seed by
seed (paper sections 4.5-4.7).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import numpy.typing as npt

# SciPy is imported by the functions that use it, so that a command's --help, which
# imports this module with its report, does not load it.

__all__ = [
  "Paired",
  "paired",
  "Bootstrap",
  "bootstrap",
  "bootstrap_ci",
  "t_interval",
  "ratio_ci",
  "verdict",
  "MIN_SEEDS",
  "EXACT_MAX",
  "RESAMPLES",
  "RESAMPLE_SEED",
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
  # True when the bootstrap was Monte Carlo (> EXACT_MAX seeds) and a bound lies within
  # its Monte Carlo error of 0 (:class:`Bootstrap`).
  ci_borderline: bool = False

  @property
  def verdict(self) -> str:
    """``"b > a"``, ``"b < a"``, ``"no difference"``, ``"not settled"`` or ``"borderline"``."""
    return verdict(self)


#: Up to this many values the bootstrap is enumerated exactly (:func:`bootstrap_ci`):
#: every multiset of n draws from n values, C(2n - 1, n) of them (1 352 078 at 12).
EXACT_MAX = 12
#: Above :data:`EXACT_MAX` values: the fixed Monte Carlo resample count and seed.
RESAMPLES = 20_000
RESAMPLE_SEED = 0


@functools.lru_cache(maxsize=4)
def _multisets(n: int) -> tuple[np.ndarray, np.ndarray]:
  """Every bootstrap resample of ``n`` values, as counts, and its probability.

  Returns ``(counts, prob)``: ``counts[k, i]`` is how often value ``i`` is drawn in
  resample ``k`` (each row sums to ``n``; the rows are all C(2n - 1, n) weak
  compositions of ``n`` into ``n`` parts), and ``prob[k]`` the multinomial probability
  ``n! / prod(counts[k]!) / n**n`` of drawing it (the rows' probabilities sum to 1).
  """
  counts = np.zeros((1, 0), np.int8)
  left = np.array([n], np.int64)  # draws not yet given to a value, per row
  for _ in range(n - 1):
    reps = left + 1  # the next value takes 0..left draws
    rows = np.repeat(np.arange(left.size), reps)
    take = np.arange(rows.size) - np.repeat(np.cumsum(reps) - reps, reps)
    counts = np.concatenate([counts[rows], take[:, None].astype(np.int8)], axis=1)
    left = left[rows] - take
  counts = np.concatenate([counts, left[:, None].astype(np.int8)], axis=1)
  from scipy import special

  log_prob = (
    float(special.gammaln(n + 1))
    - special.gammaln(counts.astype(np.float64) + 1).sum(axis=1)
    - n * np.log(n)
  )
  counts.setflags(write=False)
  prob = np.exp(log_prob)
  prob.setflags(write=False)
  return counts, prob


def _resample_means(counts: np.ndarray, v: np.ndarray) -> np.ndarray:
  """``counts @ v / n`` a column at a time (no float copy of ``counts``)."""
  out = np.zeros(counts.shape[0], np.float64)
  for i in range(counts.shape[1]):
    out += counts[:, i] * v[i]
  return out / counts.shape[1]


def _quantiles(values: np.ndarray, prob: np.ndarray, tail: float) -> tuple[float, float]:
  """The ``tail`` and ``1 - tail`` quantiles of a discrete distribution.

  Lower: the smallest value whose cumulative probability reaches ``tail``; upper: the
  largest value with at least ``tail`` of the probability at or above it (so that
  negating the values negates the interval).
  """
  order = np.argsort(values, kind="stable")
  v, p = values[order], prob[order]
  total = float(p.sum())
  tol = 1e-12 * total
  lo = int(np.searchsorted(np.cumsum(p), tail * total - tol, side="left"))
  hi = int(np.searchsorted(np.cumsum(p[::-1]), tail * total - tol, side="left"))
  return float(v[min(lo, v.size - 1)]), float(v[::-1][min(hi, v.size - 1)])


@dataclasses.dataclass(frozen=True)
class Bootstrap:
  """A percentile-bootstrap interval and how it was computed.

  ``exact``: every resample enumerated (n <= :data:`EXACT_MAX`), so the interval is a
  function of the data alone. Otherwise :data:`RESAMPLES` Monte Carlo resamples drawn
  with :data:`RESAMPLE_SEED`, and ``borderline`` says whether 0 lies within the Monte
  Carlo error of a bound (between the order statistics of the binomial 95% range of the
  bound's rank), where another draw could put the bound on the other side of 0.
  """

  low: float
  high: float
  exact: bool
  borderline: bool = False


def bootstrap(
  x: npt.ArrayLike,
  *,
  level: float = 0.95,
  resamples: int | None = None,
  seed: int | None = None,
) -> Bootstrap:
  """Percentile bootstrap interval of the mean of ``x``: exact up to :data:`EXACT_MAX` values.

  With n <= :data:`EXACT_MAX` values the bootstrap distribution of the mean is
  enumerated (every multiset of n draws with replacement, weighted by its multinomial
  probability), and the interval is its ``(1 - level) / 2`` and ``(1 + level) / 2``
  quantiles: what a Monte Carlo bootstrap tends to as its resamples grow, with no draw
  to change it. Above that, ``resamples`` Monte Carlo resamples (default
  :data:`RESAMPLES`) drawn with ``seed`` (default :data:`RESAMPLE_SEED`). A single
  value, or values all equal, give ``(x, x)``.
  """
  resamples = RESAMPLES if resamples is None else resamples
  seed = RESAMPLE_SEED if seed is None else seed
  v = np.asarray(x, np.float64).ravel()
  tail = (1.0 - level) / 2.0
  if v.size == 0:
    return Bootstrap(float("nan"), float("nan"), True)
  if v.size == 1 or np.all(v == v[0]):
    return Bootstrap(float(v[0]), float(v[0]), True)
  if v.size <= EXACT_MAX:
    counts, prob = _multisets(v.size)
    lo, hi = _quantiles(_resample_means(counts, v), prob, tail)
    return Bootstrap(lo, hi, True)
  idx = np.random.default_rng(seed).integers(0, v.size, size=(resamples, v.size))
  means = np.sort(v[idx].mean(axis=1))
  lo, hi = _quantiles(means, np.ones(resamples), tail)
  # The rank of a bound among the resamples is Binomial(resamples, tail): its 95% range.
  half = 1.96 * np.sqrt(resamples * tail * (1.0 - tail))
  k = tail * resamples
  lo_rank = (max(int(np.floor(k - half)), 0), min(int(np.ceil(k + half)), resamples - 1))
  hi_rank = (resamples - 1 - lo_rank[1], resamples - 1 - lo_rank[0])
  band = [(means[a], means[b]) for a, b in (lo_rank, hi_rank)]
  borderline = any(a <= 0.0 <= b for a, b in band)
  return Bootstrap(lo, hi, False, bool(borderline))


def bootstrap_ci(
  x: npt.ArrayLike, *, resamples: int | None = None, level: float = 0.95, seed: int | None = None
) -> tuple[float, float]:
  """``(low, high)`` of :func:`bootstrap`: exact up to :data:`EXACT_MAX` values."""
  b = bootstrap(x, level=level, resamples=resamples, seed=seed)
  return (b.low, b.high)


def t_interval(x: npt.ArrayLike, level: float = 0.95) -> tuple[float, float]:
  """Student-t interval of the mean of ``x`` (``(x, x)`` with no spread, nan for n < 2)."""
  v = np.asarray(x, np.float64)
  if v.size < 2:
    return (float("nan"), float("nan"))
  m, sd = float(np.mean(v)), float(np.std(v, ddof=1))
  if sd == 0:
    return (m, m)
  from scipy import stats as sps

  half = float(sps.t.ppf(0.5 + level / 2, v.size - 1)) * sd / np.sqrt(v.size)
  return (m - half, m + half)


def ratio_ci(
  num: npt.ArrayLike,
  den: npt.ArrayLike,
  *,
  resamples: int | None = None,
  seed: int | None = None,
) -> tuple[float, float]:
  """Percentile-bootstrap 95% interval of ``mean(num) / mean(den)``, resampling seeds.

  ``num[i]`` and ``den[i]`` share seed ``i`` (e.g. the paired gains frozen - A2 and
  B2 - A2, whose ratio is the frozen arm's share of B2's gain). Exact, as
  :func:`bootstrap`, up to :data:`EXACT_MAX` seeds; above, ``resamples`` Monte Carlo
  resamples (default :data:`RESAMPLES`) drawn with ``seed`` (default
  :data:`RESAMPLE_SEED`). Resamples whose ratio is not finite are left out.
  """
  resamples = RESAMPLES if resamples is None else resamples
  seed = RESAMPLE_SEED if seed is None else seed
  a, b = np.asarray(num, np.float64), np.asarray(den, np.float64)
  if a.size < 2 or a.shape != b.shape:
    return (float("nan"), float("nan"))
  if a.size <= EXACT_MAX:
    counts, prob = _multisets(a.size)
    with np.errstate(divide="ignore", invalid="ignore"):
      r = _resample_means(counts, a) / _resample_means(counts, b)
  else:
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    with np.errstate(divide="ignore", invalid="ignore"):
      r = a[idx].mean(1) / b[idx].mean(1)
    prob = np.ones(resamples)
  keep = np.isfinite(r)
  if not keep.any():
    return (float("nan"), float("nan"))
  return _quantiles(r[keep], prob[keep], 0.025)


def verdict(p: Paired) -> str:
  """The statistical standard: both 95% intervals must agree, on >= 6 paired seeds.

  ``"b > a"`` (or ``"b < a"``) when the paired-t and the bootstrap intervals both
  exclude 0 on that side; ``"no difference"`` when both hold 0; otherwise, or with
  fewer than :data:`MIN_SEEDS` seeds, ``"not settled"``. Up to :data:`EXACT_MAX` seeds
  the bootstrap is exact, so the verdict is a function of the data; above, a bootstrap
  bound within its Monte Carlo error of 0 gives ``"borderline"``, never a verdict that
  another resample draw could reverse.
  """
  if p.n < MIN_SEEDS or not all(np.isfinite([p.t_low, p.t_high, p.ci_low, p.ci_high])):
    return "not settled"
  if p.ci_borderline:
    return "borderline"
  if p.t_low > 0 and p.ci_low > 0:
    return "b > a"
  if p.t_high < 0 and p.ci_high < 0:
    return "b < a"
  if p.t_low <= 0 <= p.t_high and p.ci_low <= 0 <= p.ci_high:
    return "no difference"
  return "not settled"


def paired(
  a: npt.ArrayLike, b: npt.ArrayLike, *, resamples: int | None = None, seed: int | None = None
) -> Paired:
  """Compares ``b`` to ``a`` seed by seed (``a[i]`` and ``b[i]`` share seed ``i``).

  The bootstrap interval is :func:`bootstrap`'s: exact up to :data:`EXACT_MAX` seeds
  (``resamples`` and ``seed`` then change nothing).
  """
  va = np.asarray(a, np.float64)
  vb = np.asarray(b, np.float64)
  if va.shape != vb.shape:
    raise ValueError(f"paired: a has {va.size} seeds, b has {vb.size}; they must match.")
  d = vb - va
  n = int(d.size)
  std = float(np.std(d, ddof=1)) if n > 1 else float("nan")
  # Differences equal up to rounding have no spread: no t statistic, not t ~ 1e15.
  if n > 1 and std > 1e-12 * max(1.0, float(np.max(np.abs(d)))):
    from scipy import stats as sps

    res = sps.ttest_rel(vb, va)
    t, p = float(res.statistic), float(res.pvalue)
  else:
    t = p = float("nan")
  boot = bootstrap(d, resamples=resamples, seed=seed)
  t_lo, t_hi = t_interval(d)
  return Paired(
    n,
    float(np.mean(d)) if n else float("nan"),
    std,
    t,
    p,
    int(np.sum(d > 0)),
    boot.low,
    boot.high,
    tuple(float(x) for x in d),
    t_lo,
    t_hi,
    boot.borderline,
  )


def summarize(x: npt.ArrayLike, ddof: int = 1) -> tuple[float, float]:
  """``(mean, std)`` with the given ``ddof`` (std is 0 for a single value)."""
  v = np.asarray(x, np.float64)
  if v.size == 0:
    return (float("nan"), float("nan"))
  std = float(np.std(v, ddof=ddof)) if v.size > ddof else 0.0
  return float(np.mean(v)), std
