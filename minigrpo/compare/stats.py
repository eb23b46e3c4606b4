"""Beside the table: what a few seeds say. In: one number per seed (a variant's gains). Out: the mean with
its 95% interval from Student's t over the seeds, and Welch's t-test of two variants (unequal variances,
Welch-Satterthwaite degrees of freedom), from the t distribution computed here with the standard library
(the regularised incomplete beta function by its continued fraction, Numerical Recipes 6.4): no scipy.
It knows lists of floats, not runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL = 0.95  # the intervals' coverage; the tests' two-sided size is 1 - LEVEL


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for x in [0, 1]."""
    if x <= 0.0 or x >= 1.0:
        return min(max(x, 0.0), 1.0)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):  # the continued fraction converges fast here; else use the symmetry
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float, tiny: float = 1e-300) -> float:
    """The continued fraction of I_x(a, b), by Lentz's method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    return incomplete_beta(df / 2, 0.5, df / (df + t * t))


def t_quantile(level: float, df: float) -> float:
    """The t with P(|T| <= t) = level (2.776 for 95% and 4 degrees of freedom), by bisection."""
    low, high = 0.0, 1e6
    for _ in range(200):
        middle = (low + high) / 2
        if t_two_sided_p(middle, df) > 1 - level:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float  # the 95% interval of the mean, Student's t over the seeds; the mean itself for one seed
    high: float
    seeds: int


def mean_interval(values: list[float], level: float = LEVEL) -> Interval:
    """The mean of one number per seed, and its interval: mean ± t(level, n - 1) · s / √n."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, mean, mean, n)
    half = t_quantile(level, n - 1) * math.sqrt(_variance(values) / n)
    return Interval(mean, mean - half, mean + half, n)


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Welch's two-sided t-test of equal means: its p-value; None with fewer than two seeds on a side. Two
    sides without spread are equal (1.0) or apart (0.0)."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = _variance(a) / len(a), _variance(b) / len(b)
    difference = sum(a) / len(a) - sum(b) / len(b)
    if va + vb == 0:
        return 1.0 if difference == 0 else 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    return t_two_sided_p(difference / math.sqrt(va + vb), df)


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)
