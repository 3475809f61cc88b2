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


def pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """Pooled standard deviation of several groups (weights n_i - 1)."""
    num = sum((len(g) - 1) * stdev(g) ** 2 for g in groups if len(g) > 1)
    den = sum(len(g) - 1 for g in groups if len(g) > 1)
    return math.sqrt(num / den) if den else 0.0
