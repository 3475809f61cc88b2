"""Statistics over raw timing samples. Pure Python; no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default 'linear' method)."""
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def median_rel_noise(xs: Sequence[float]) -> float:
    """Relative uncertainty of the median: the half-width of McGill's notch, 1.57 * IQR / sqrt(n),
    over the median. It is a ~95% interval for the median under mild assumptions, computed from
    the IQR so single outliers do not move it."""
    n = len(xs)
    if n < 3:
        return math.inf
    m = median(xs)
    if m <= 0:
        return math.inf
    iqr = quantile(xs, 0.75) - quantile(xs, 0.25)
    return 1.57 * iqr / math.sqrt(n) / m


@dataclass
class Summary:
    median_us: float
    min_us: float
    max_us: float
    q1_us: float
    q3_us: float
    iqr_us: float
    n: int
    rel_noise: float


def summarize(xs: Sequence[float]) -> Summary:
    q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
    return Summary(median(xs), min(xs), max(xs), q1, q3, q3 - q1, len(xs), median_rel_noise(xs))


def noise_below(target: float):
    """A stop rule for the timer: stop once the median's relative uncertainty is under target."""
    return lambda xs: median_rel_noise(xs) < target


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def stdev(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1)."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# The 97.5% quantiles of Student's t for 1 to 5 degrees of freedom (tables), where the series
# below is more than 0.05% off; from 6 on it is within 0.06%.
_T975_SMALL = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (the multiplier of a
    two-sided 95% interval): tabled up to df 5, the Cornish-Fisher series beyond."""
    if df < 1:
        return math.inf
    if df in _T975_SMALL:
        return _T975_SMALL[df]
    z = 1.959963984540054
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def between_groups_rel(medians: Sequence[float]) -> float:
    """Relative 95% half-width of the mean of independent group medians: t(G-1) * sd / sqrt(G)
    over the mean. Each group is one graph over its own placements, so this is the uncertainty
    that placement luck leaves in the estimate; it does not shrink with more replays, only with
    more groups. inf for fewer than two groups."""
    g = len(medians)
    if g < 2:
        return math.inf
    m = mean(medians)
    if m <= 0:
        return math.inf
    return t975(g - 1) * stdev(medians) / math.sqrt(g) / m
