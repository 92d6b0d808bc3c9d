"""The experiments report's statistics (limits/studies/lift.py) against statsmodels and scipy on
simulated people: the per-bucket estimator equals statsmodels' cluster-robust OLS to the last
digit; a planted effect is found, its interval covering the truth; with no effect, 1,000
simulated experiments find one 5 % (+/- 1.5 points) of the time; the interval is about as wide
as scipy's per-user Welch test."""

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats

from limits.engine.assignment import keyed_hashes
from limits.studies.lift import BUCKETS, estimate, lift, sample_ratio_p


def buckets_of(ids: np.ndarray) -> np.ndarray:
    return (keyed_hashes(ids, "buckets") % np.uint64(BUCKETS)).astype(np.int64)


def per_bucket(values: np.ndarray, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    users = np.bincount(buckets, minlength=BUCKETS)
    totals = np.bincount(buckets, weights=values, minlength=BUCKETS)
    return users, totals


def people(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """Orders per person over a period: most buy nothing, a few buy several."""
    buys = rng.random(n) < rate
    return np.where(buys, rng.poisson(1.5, n) + 1, 0).astype(np.float64)


def test_the_estimates_are_statsmodels_cluster_robust_ols_exactly():
    rng = np.random.default_rng(7)
    ids = np.arange(1, 40_001, dtype=np.uint64)
    arm = (keyed_hashes(ids, "arms") % np.uint64(2)).astype(np.int64)
    y = people(rng, len(ids), 0.05) * np.where(arm == 1, 1.1, 1.0)
    buckets = buckets_of(ids)

    control = arm == 0
    alone = sm.OLS(y[control], np.ones(control.sum())).fit(
        cov_type="cluster", cov_kwds={"groups": buckets[control]}, use_t=True
    )
    mine = estimate(*per_bucket(y[control], buckets[control]))
    assert mine.users == control.sum()
    assert mine.mean == pytest.approx(alone.params[0], rel=1e-12)
    assert mine.se == pytest.approx(alone.bse[0], rel=1e-9)
    low, high = alone.conf_int(0.05)[0]
    assert (mine.low, mine.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))

    both = sm.OLS(y, sm.add_constant(arm.astype(np.float64))).fit(
        cov_type="cluster", cov_kwds={"groups": arm * BUCKETS + buckets}, use_t=True
    )
    treated = ~control
    found = lift(
        *per_bucket(y[treated], buckets[treated]), *per_bucket(y[control], buckets[control])
    )
    assert found is not None
    assert found.difference == pytest.approx(both.params[1], rel=1e-9)
    low, high = both.conf_int(0.05)[1]
    assert (found.low, found.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert found.p_value == pytest.approx(both.pvalues[1], rel=1e-6)
    # About as wide as scipy's Welch test on the people themselves.
    welch = stats.ttest_ind(y[treated], y[control], equal_var=False).confidence_interval(0.95)
    assert (found.high - found.low) == pytest.approx(welch.high - welch.low, rel=0.15)


def test_a_planted_effect_is_found_and_its_interval_holds_the_truth():
    rng = np.random.default_rng(11)
    n = 60_000
    ids = np.arange(1, 2 * n + 1, dtype=np.uint64)
    control, treated = people(rng, n, 0.05), people(rng, n, 0.06)  # +20 %
    buckets = buckets_of(ids)
    found = lift(*per_bucket(treated, buckets[n:]), *per_bucket(control, buckets[:n]))
    assert found is not None and found.significant and found.p_value < 0.05
    assert found.relative is not None and found.relative_low is not None
    assert found.relative_low < 0.2 < found.relative_high  # type: ignore[operator]
    assert 0.1 < found.relative < 0.3


def test_with_no_effect_one_experiment_in_twenty_finds_one():
    rng = np.random.default_rng(2026)
    n, runs = 2_000, 1_000
    found = 0
    buckets = buckets_of(np.arange(1, 2 * n + 1, dtype=np.uint64))
    for _ in range(runs):
        value = rng.lognormal(3, 1, 2 * n) * (rng.random(2 * n) < 0.1)  # skewed: revenue
        result = lift(*per_bucket(value[n:], buckets[n:]), *per_bucket(value[:n], buckets[:n]))
        assert result is not None
        found += result.significant
    assert 0.035 <= found / runs <= 0.065, found


def test_degenerate_arms_say_so_instead_of_inventing_a_figure():
    assert estimate([0, 0], [0, 0]).users == 0
    one = estimate([5, 0], [2, 0])
    assert one.mean == 0.4 and np.isnan(one.low)
    assert lift([0, 0], [0, 0], [3, 4], [1, 2]) is None
    same = lift([10, 10], [0, 0], [10, 10], [0, 0])
    assert same is not None and not same.significant and same.relative is None
    with pytest.raises(ValueError, match="one number per bucket"):
        estimate([1, 2], [1])


def test_a_split_off_its_shares_is_flagged():
    assert sample_ratio_p([5_000, 5_020], [0.5, 0.5]) > 0.5  # type: ignore[operator]
    assert sample_ratio_p([5_000, 5_600], [0.5, 0.5]) < 0.001  # type: ignore[operator]
    assert sample_ratio_p([10], [1.0]) is None
