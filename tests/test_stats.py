import numpy as np
import pytest
from scipy import stats as sps

from stiefax.experiments import stats


def test_paired_matches_scipy_and_counts_wins():
  rng = np.random.default_rng(0)
  a = rng.normal(40, 1, 12)
  b = a + rng.normal(6.8, 0.5, 12)
  res = stats.paired(a, b)
  ref = sps.ttest_rel(b, a)
  assert res.n == 12 and res.wins == 12
  np.testing.assert_allclose(res.t, ref.statistic)
  np.testing.assert_allclose(res.p, ref.pvalue)
  np.testing.assert_allclose(res.mean, np.mean(b - a))
  assert res.ci_low < res.mean < res.ci_high
  assert res.ci_high - res.ci_low < 1.0


def test_paired_no_effect_and_degenerate_cases():
  rng = np.random.default_rng(1)
  a = rng.normal(0, 1, 200)
  res = stats.paired(a, a + rng.normal(0, 1, 200))
  assert res.ci_low < 0 < res.ci_high and res.p > 0.01
  one = stats.paired([1.0], [2.0])
  assert one.n == 1 and np.isnan(one.t) and one.ci_low == one.ci_high == 1.0
  with pytest.raises(ValueError, match="must match"):
    stats.paired([1.0, 2.0], [1.0])


def test_summarize_ddof():
  assert stats.summarize([1.0, 3.0]) == (2.0, pytest.approx(np.sqrt(2)))
  assert stats.summarize([1.0, 3.0], ddof=0) == (2.0, 1.0)
  assert stats.summarize([5.0]) == (5.0, 0.0)


def test_paired_differences_equal_up_to_rounding_have_no_t():
  a = np.array([0.1, 0.2, 0.3])
  res = stats.paired(a, a + 0.07)  # 0.07 added in floating point: spread ~1e-17
  assert np.isnan(res.t) and np.isnan(res.p)
  assert res.mean == pytest.approx(0.07) and res.wins == 3


def test_t_interval_matches_scipy():
  import numpy as np
  from scipy import stats as sps

  from stiefax.experiments import stats

  x = np.array([0.3, 1.2, 0.7, 0.9, 1.5, 0.2])
  lo, hi = stats.t_interval(x)
  ref = sps.t.interval(0.95, x.size - 1, loc=x.mean(), scale=sps.sem(x))
  assert abs(lo - ref[0]) < 1e-12 and abs(hi - ref[1]) < 1e-12
  p = stats.paired(np.zeros(6), x)
  assert (p.t_low, p.t_high) == (lo, hi)


def test_a_verdict_needs_six_seeds_and_both_intervals():
  import numpy as np

  from stiefax.experiments import stats

  up = [0.9, 1.1, 1.0, 1.2, 0.8, 1.05]
  assert stats.paired(np.zeros(6), up).verdict == "b > a"
  assert stats.paired(np.zeros(6), [-u for u in up]).verdict == "b < a"
  assert stats.paired(np.zeros(3), up[:3]).verdict == "not settled"  # too few seeds
  assert stats.paired(np.zeros(6), [1.0, -1.1, 0.9, -0.8, 0.2, -0.3]).verdict == "no difference"
  # Bootstrap excludes 0 but the t-interval does not: the intervals disagree.
  skew = [0.05, 0.06, 0.04, 0.05, 0.07, 3.0]
  p = stats.paired(np.zeros(6), skew)
  assert p.ci_low > 0 and p.t_low < 0 and p.verdict == "not settled"


def test_ratio_interval_holds_the_ratio_of_means():
  import numpy as np

  from stiefax.experiments import stats

  rng = np.random.default_rng(0)
  den = 7 + 0.3 * rng.normal(size=12)
  num = 0.9 * den + 0.2 * rng.normal(size=12)
  lo, hi = stats.ratio_ci(num, den)
  assert lo < num.mean() / den.mean() < hi and hi - lo < 0.1
  assert np.isnan(stats.ratio_ci([1.0], [2.0])[0])


def test_the_exact_bootstrap_is_the_limit_of_every_resample():
  """For n <= EXACT_MAX the interval is the quantiles of all n**n equally likely
  resamples, enumerated here by brute force; the multiset weights sum to 1."""
  import itertools
  import math

  rng = np.random.default_rng(3)
  for n in (2, 3, 5, 6):
    x = rng.normal(size=n)
    means = np.array([x[list(idx)].mean() for idx in itertools.product(range(n), repeat=n)])
    means.sort()
    k = means.size
    lo = means[math.ceil(0.025 * k) - 1]  # smallest mean whose cumulative share >= 2.5%
    hi = means[k - math.ceil(0.025 * k)]
    b = stats.bootstrap(x)
    assert b.exact and not b.borderline
    np.testing.assert_allclose([b.low, b.high], [lo, hi], rtol=0, atol=1e-12)
    counts, prob = stats._multisets(n)
    assert counts.shape == (math.comb(2 * n - 1, n), n) and (counts.sum(1) == n).all()
    assert abs(prob.sum() - 1) < 1e-12
  counts, prob = stats._multisets(12)
  assert counts.shape == (1_352_078, 12) and abs(prob.sum() - 1) < 1e-9
  # Negating the data negates the interval.
  x = rng.normal(size=9)
  assert stats.bootstrap_ci(-x) == tuple(-v for v in reversed(stats.bootstrap_ci(x)))


def test_verdicts_do_not_depend_on_the_resample_seed():
  """σReparam - A2 at depth 2, AdamW 1e-2 (results/patches/robust): exact bootstrap
  upper bound -0.012 pp, a t-interval holding 0. A Monte Carlo bootstrap of 20 000
  resamples puts that bound at or above 0 for some seeds ("no difference"), below for
  others ("not settled"); the exact one gives one verdict for every seed."""
  d = np.array([0.16, 0.27, -0.29, -0.80, -0.78, -0.86])
  mc = set()
  for seed in range(40):
    hi = sps.bootstrap(
      (d,),
      np.mean,
      n_resamples=20_000,
      method="percentile",
      random_state=np.random.default_rng(seed),
    ).confidence_interval.high
    mc.add(hi >= 0)
  assert mc == {True, False}  # the draw decides a Monte Carlo verdict here
  got = {stats.paired(np.zeros(6), d, seed=seed).verdict for seed in range(40)}
  assert got == {"not settled"}
  assert stats.bootstrap(d).high == pytest.approx(-0.011666666666667, abs=1e-9)
  assert {stats.ratio_ci(d + 2, d + 3, seed=s) for s in range(5)} == {stats.ratio_ci(d + 2, d + 3)}


def test_above_exact_max_a_bound_near_zero_is_borderline():
  """Above EXACT_MAX seeds the bootstrap is Monte Carlo; a bound within its Monte
  Carlo error of 0 gives "borderline" for every seed, a clear one the same verdict."""
  n = stats.EXACT_MAX + 8
  x = np.random.default_rng(0).normal(size=n)
  x = x - x.mean() + 0.3 * x.std(ddof=1)  # the mean sits near the lower bound's distance
  lows = [stats.bootstrap(x, seed=s).low for s in range(4)]
  # Shift so that the exact-ish lower bound is 0: every draw's bound is within its error.
  x = x - np.median(lows)
  verdicts = {stats.paired(np.zeros(n), x, seed=s).verdict for s in range(10)}
  assert verdicts == {"borderline"}
  assert not stats.bootstrap(x).exact
  clear = x + 1.0
  assert {stats.paired(np.zeros(n), clear, seed=s).verdict for s in range(10)} == {"b > a"}
