"""The statistics of the experiments report: a per-user mean with its 95 % confidence interval,
and the lift of one arm against another, from totals kept per bucket of users.

Why buckets: the report is asked over any period of up to 90 days, of up to 10M decisions a
day, in under a second, so it never reads people one by one. Each arm's users are split by a
keyed hash of their id into BUCKETS random buckets; per day and bucket the ledger's database
keeps how many users entered and the totals of each measure (sends, conversions, value,
unsubscribes, complaints). A period's totals per bucket are sums over its days, and the spread
between buckets gives the variance of a per-user mean without per-user rows: this is the
cluster-robust (sandwich) variance of the mean with the buckets as clusters, the estimator
statsmodels computes for OLS with `cov_type="cluster"` (its small-sample factor included, and
Student's t with clusters - 1 degrees of freedom), which the tests check to the last digit on
per-user data. With 128 buckets an interval's width is itself within a few percent of the exact
per-user one, and a 95 % interval misses a true zero effect 5 % of the time (tested over 1,000
simulated experiments).

A mean per user is a ratio: sum over buckets of the totals / sum of the users. Its variance is
G / (G - 1) * sum_g (Y_g - r * N_g)^2 / N^2 (G buckets). The difference of two arms is the
treatment coefficient of OLS y ~ 1 + arm, clustered by bucket: the same sums, with the factor
G / (G - 1) * (N - 1) / (N - 2) over both arms' G buckets. The relative lift (the difference
over the control's mean) takes its interval by the delta method.
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

BUCKETS = 128
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Estimate:
    """A per-user mean and its 95 % interval (`low`, `high`), from `users` users."""

    users: int
    mean: float
    se: float
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Lift:
    """An arm against its reference (the control, or the first arm): the difference of the
    per-user means and its interval, the same relative to the reference's mean (None when that
    is 0), the two-sided p-value, and whether the interval leaves out 0."""

    difference: float
    low: float
    high: float
    relative: float | None
    relative_low: float | None
    relative_high: float | None
    p_value: float
    significant: bool


def _arrays(users: object, totals: object) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(users, dtype=np.float64)
    y = np.asarray(totals, dtype=np.float64)
    if n.shape != y.shape or n.ndim != 1:
        raise ValueError("users and totals are one number per bucket each")
    return n, y


def _spread(n: np.ndarray, y: np.ndarray) -> tuple[float, float, float, int]:
    """(users, mean, sum of squared bucket residuals, buckets with users)."""
    total = float(n.sum())
    mean = float(y.sum()) / total if total else 0.0
    z = y - mean * n
    return total, mean, float(np.dot(z, z)), int(np.count_nonzero(n))


def _t(df: int) -> float:
    return float(stats.t.ppf(0.5 + LEVEL / 2, df)) if df > 0 else math.inf


def estimate(users: object, totals: object) -> Estimate:
    """The per-user mean of an arm from its buckets' users and totals, with its interval."""
    n, y = _arrays(users, totals)
    total, mean, squares, groups = _spread(n, y)
    if total == 0:
        return Estimate(users=0, mean=0.0, se=math.nan, low=math.nan, high=math.nan)
    if groups < 2:
        return Estimate(users=int(total), mean=mean, se=math.nan, low=math.nan, high=math.nan)
    se = math.sqrt(groups / (groups - 1) * squares) / total
    half = _t(groups - 1) * se
    return Estimate(users=int(total), mean=mean, se=se, low=mean - half, high=mean + half)


def lift(
    treatment_users: object,
    treatment_totals: object,
    control_users: object,
    control_totals: object,
) -> Lift | None:
    """The treatment arm against the control, from each one's buckets; None when either has no
    users or there are too few buckets to tell."""
    nt, yt = _arrays(treatment_users, treatment_totals)
    nc, yc = _arrays(control_users, control_totals)
    total_t, mean_t, squares_t, groups_t = _spread(nt, yt)
    total_c, mean_c, squares_c, groups_c = _spread(nc, yc)
    groups = groups_t + groups_c
    total = total_t + total_c
    if not total_t or not total_c or groups < 3 or total < 3:
        return None
    factor = groups / (groups - 1) * (total - 1) / (total - 2)
    var_t = factor * squares_t / total_t**2
    var_c = factor * squares_c / total_c**2
    difference = mean_t - mean_c
    se = math.sqrt(var_t + var_c)
    df = groups - 1
    t = _t(df)
    if se > 0:
        p_value = float(2 * stats.t.sf(abs(difference) / se, df))
    else:
        p_value = 1.0 if difference == 0 else 0.0
    relative = relative_low = relative_high = None
    if mean_c != 0:
        relative = mean_t / mean_c - 1
        se_relative = math.sqrt(var_t / mean_c**2 + mean_t**2 * var_c / mean_c**4)
        relative_low, relative_high = relative - t * se_relative, relative + t * se_relative
    low, high = difference - t * se, difference + t * se
    return Lift(
        difference=difference,
        low=low,
        high=high,
        relative=relative,
        relative_low=relative_low,
        relative_high=relative_high,
        p_value=p_value,
        significant=bool(low > 0 or high < 0),
    )


def sample_ratio_p(users: list[int], shares: list[float]) -> float | None:
    """The p-value of the arms' users against their shares (a chi-square test): a very small
    one (below 0.001) says the split is not what it should be, and the arms cannot be compared
    fairly (a sample ratio mismatch). None with fewer than two arms or no users."""
    if len(users) < 2 or sum(users) == 0 or sum(shares) <= 0:
        return None
    expected = np.asarray(shares, dtype=np.float64) / sum(shares) * sum(users)
    return float(stats.chisquare(np.asarray(users, dtype=np.float64), expected).pvalue)
