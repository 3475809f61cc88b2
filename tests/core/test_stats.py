"""Statistics over samples, on data whose answers are known."""

import math

from moebench.core.stats import median, median_rel_noise, noise_below, quantile, stdev, summarize


def test_quantiles_match_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert median(xs) == 3.0
    assert quantile(xs, 0.25) == 2.0 and quantile(xs, 0.75) == 4.0
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert math.isnan(quantile([], 0.5))


def test_summary_fields():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.median_us, s.min_us, s.max_us, s.q1_us, s.q3_us, s.iqr_us, s.n) == (3.0, 1.0, 100.0, 2.0, 4.0, 2.0, 5)
    # the outlier does not move the median's uncertainty: it is IQR-based
    assert math.isclose(s.rel_noise, 1.57 * 2.0 / math.sqrt(5) / 3.0)


def test_noise_shrinks_with_samples_and_stop_rule_fires():
    few = [1.0, 1.1, 0.9, 1.05, 0.95] * 2
    many = few * 50
    assert median_rel_noise(many) < median_rel_noise(few)
    assert noise_below(0.01)(many) and not noise_below(0.01)(few)
    assert median_rel_noise([1.0, 2.0]) == math.inf


def test_stdev():
    a, b = [1.0, 2.0, 3.0], [10.0, 12.0, 14.0]
    assert math.isclose(stdev(a), 1.0) and math.isclose(stdev(b), 2.0)
    assert stdev([5.0]) == 0.0
