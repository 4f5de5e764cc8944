"""Paired difference of two groups' means with a delete-one jackknife confidence interval.

The unit of resampling is whatever the rows of the inputs are (for `fast compare`: held-out
clips, docs/compare.md). Row i of `a` and row i of `b` are the same unit measured under group A
and group B; the columns are replicates within the unit (runs x episode seeds) and are averaged
first, so a unit contributes one number per group however many replicates it has:

    a_i = mean_j a[i, j],  b_i = mean_j b[i, j],  d_i = a_i - b_i          (i = 1..n)
    theta      = mean_i a_i - mean_i b_i = mean_i d_i                      the estimate
    theta_(i)  = the same estimate with unit i deleted = (n*theta - d_i) / (n - 1)
    se_jack^2  = (n - 1)/n * sum_i (theta_(i) - mean_k theta_(k))^2         leave-one-out form
    CI         = theta -/+ t_{1 - (1 - level)/2, n - 1} * se_jack

The pseudo-values n*theta - (n - 1)*theta_(i) of a mean are the d_i themselves, so this interval
is the paired t interval over units; the jackknife form is kept because it is the article's
test and tests/test_compare.py checks it against a literal delete-one loop.

Student's t quantile: scipy is not a dependency, so the CDF is computed from the regularised
incomplete beta function (continued fraction, Numerical Recipes 6.4) and inverted by bisection;
exact to ~1e-12, checked against closed forms (df = 1, 2) and tabulated values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95


@dataclass(frozen=True)
class PairedDifference:
    """theta = mean A - mean B over `units` paired units, with its jackknife CI at `level`."""

    units: int
    mean_a: float
    mean_b: float
    difference: float
    se: float  # jackknife standard error of `difference`
    df: int  # units - 1
    t: float  # the t quantile used
    low: float
    high: float
    level: float

    @property
    def covers_zero(self) -> bool:
        return bool(self.low <= 0.0 <= self.high)


def unit_means(values: np.ndarray | list, *, name: str = "values") -> np.ndarray:
    """[n] or [n, k] per-unit values -> [n] per-unit means (float64); refuses empty or non-finite input."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(
            f"{name}: expected [units] or [units, replicates] with at least one replicate, "
            f"got shape {list(array.shape)}"
        )
    if not np.isfinite(array).all():
        bad = np.argwhere(~np.isfinite(array))[0].tolist()
        raise ValueError(
            f"{name}: value at [unit, replicate] = {bad} is {array[tuple(bad)]}; every value must be finite"
        )
    # A unit whose replicates are all equal gets that value exactly (the mean of three 0.1s is
    # not 0.1 in floating point), so a constant metric differs by exactly 0 between the groups.
    constant = array.min(axis=1) == array.max(axis=1)
    return np.where(constant, array[:, 0], array.mean(axis=1))


def leave_one_out(d: np.ndarray) -> np.ndarray:
    """[n] theta_(i): the mean of d with unit i deleted."""
    n = d.size
    return (d.sum() - d) / (n - 1)


def jackknife_se(theta_loo: np.ndarray) -> float:
    """sqrt((n-1)/n * sum (theta_(i) - mean theta_(.))^2)."""
    n = theta_loo.size
    return math.sqrt((n - 1) / n * float(np.sum((theta_loo - theta_loo.mean()) ** 2)))


def paired_difference(
    a: np.ndarray | list, b: np.ndarray | list, *, level: float = LEVEL, name: str = "metric"
) -> PairedDifference:
    """Mean of group A minus mean of group B over paired units, with the delete-one jackknife CI.

    `a`, `b`: [n] or [n, k] (k replicates per unit, may differ between the groups). A metric
    equal on every unit in both groups gives the degenerate interval [d, d] (0 for a
    constant metric, which covers zero).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}; e.g. 0.95")
    a_units = unit_means(a, name=f"{name} (group A)")
    b_units = unit_means(b, name=f"{name} (group B)")
    if a_units.size != b_units.size:
        raise ValueError(
            f"{name}: group A has {a_units.size} units, group B {b_units.size}; "
            "the comparison is paired, so both groups must be measured on the same units"
        )
    n = a_units.size
    if n < 2:
        raise ValueError(f"{name}: the jackknife needs at least 2 units, got {n}; evaluate on more held-out clips")
    d = a_units - b_units
    mean_a, mean_b = float(a_units.mean()), float(b_units.mean())
    if np.all(d == d[0]):
        # Every unit differs by the same amount (0 for a constant metric): no spread, and
        # computing it would leave rounding noise where the answer is exactly zero.
        theta, se = float(d[0]), 0.0
    else:
        theta, se = float(d.mean()), jackknife_se(leave_one_out(d))
    t = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1)
    return PairedDifference(
        units=n,
        mean_a=mean_a,
        mean_b=mean_b,
        difference=theta,
        se=se,
        df=n - 1,
        t=t,
        low=theta - t * se,
        high=theta + t * se,
        level=level,
    )


# -- Student's t ------------------------------------------------------------------------------


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom.

    P(|T| > |t|) = I_x(df/2, 1/2) with x = df / (df + t^2) (Abramowitz & Stegun 26.7.1).
    """
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if t == 0.0:
        return 0.5
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    t2 = t * t
    # x and 1 - x computed apart, so neither loses precision to cancellation.
    two_tail = _betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))
    return 1.0 - two_tail / 2.0 if t > 0 else two_tail / 2.0


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on t_cdf (to full double precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if mid in (low, high):
            break
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def _betainc(a: float, b: float, x: float, one_minus_x: float) -> float:
    """The regularised incomplete beta I_x(a, b); `one_minus_x` is 1 - x, given exactly."""
    if x <= 0.0:
        return 0.0
    if one_minus_x <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(one_minus_x)
    # The continued fraction converges fast for x < (a+1)/(a+b+2); otherwise use the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a).
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, one_minus_x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), modified Lentz's method (Numerical Recipes betacf)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")
