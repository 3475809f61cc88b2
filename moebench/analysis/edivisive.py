"""E-divisive means: change points in a series by energy statistics and a permutation test.

The method is Matteson & James, "A Nonparametric Approach for Multiple Change Point Analysis of
Multivariate Data", JASA 109(505), 2014 (arXiv:1306.4933), as MongoDB runs it in its performance
CI (Daly et al., "The Use of Change Point Detection to Identify Software Performance Regressions in
a Continuous Integration System", ICPE 2020). Written here because the maintained packages
(signal-processing-algorithms, apache-otava) pin numpy versions moebench cannot share.

For a segment Z of n values split at tau into X = Z[:tau] (m values) and Y = Z[tau:] (k values),
with the paper's alpha = 1 and each side at least MIN_SIZE values:

    E(X, Y) = 2/(m k) sum |x - y| - 1/C(m,2) sum_{i<j} |x_i - x_j| - 1/C(k,2) sum_{i<j} |y_i - y_j|
    Q(tau)  = m k / (m + k) * E(X, Y)

The split of largest Q over every current segment is the candidate. Its significance is a
permutation test (the paper's section 3.2): the values of each current segment are permuted within
that segment, the largest Q over all segments recomputed, and p = (1 + #{Q_perm >= Q}) / (1 + R).
A candidate with p <= `sig` is kept and its segment split in two; the search stops at the first
candidate that is not significant. As in the paper, the right-hand sample may end before the
segment does (Y = Z[tau:kappa], the largest Q over kappa), so a step that comes back (1, 2, 1) is
found as well as one that stays.

Numpy only; deterministic for a given `seed`. With n runs split a | b, no permutation test can give
p below about 2 / C(n, a) (8 runs split 4 | 4: 0.029), so a short series needs a clean step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


# the permutation rows are scored this many bytes of work arrays at a time: memory is bounded by
# the longest segment (about 80 bytes x n² for one row), not by n² x the permutations
CHUNK_BYTES = 64 * 2**20
MIN_SIZE = 2


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first value after the change
    q: float  # the energy statistic of the split
    p: float  # the permutation test's p-value


def _q_all(z: np.ndarray) -> np.ndarray:
    """max over kappa of Q(tau, kappa) for every tau of every row of z (shape R x n): X = Z[:tau],
    Y = Z[tau:kappa]; -inf where a side is shorter than MIN_SIZE. Returns shape R x (n + 1)."""
    r, n = z.shape
    d = np.abs(z[:, :, None] - z[:, None, :])
    p = np.zeros((r, n + 1, n + 1))
    p[:, 1:, 1:] = d.cumsum(1).cumsum(2)
    tau = np.arange(n + 1)[:, None]  # rows: tau, columns: kappa
    kap = np.arange(n + 1)[None, :]
    m, k = tau.astype(float), (kap - tau).astype(float)
    diag = p[:, np.arange(n + 1), np.arange(n + 1)]  # P[t, t]: twice the pair sum of Z[:t]
    within_x = diag[:, :, None] / 2.0
    # block sums of D over rows a:b, columns c:d from the 2-D prefix sums
    within_y = (diag[:, None, :] - p[:, tau, kap] - p[:, kap, tau] + diag[:, :, None]) / 2.0
    cross = p[:, tau, kap] - diag[:, :, None]
    ok = (tau >= MIN_SIZE) & (k >= MIN_SIZE)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = 2.0 * cross / (m * k) - within_x / (m * (m - 1) / 2.0) - within_y / (k * (k - 1) / 2.0)
        q = np.where(ok, m * k / (m + k) * e, -np.inf)
    return q.max(axis=2)


def _best(values: np.ndarray, bounds: list[tuple[int, int]],
          perm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The largest Q over all segments, per row: (q, segment index, tau inside it). `perm`: R rows
    of within-segment permutations of the whole series (None: the series itself, one row)."""
    z = values[None, :] if perm is None else values[perm]
    best_q = np.full(z.shape[0], -np.inf)
    best_s = np.zeros(z.shape[0], dtype=int)
    best_t = np.zeros(z.shape[0], dtype=int)
    for s, (a, b) in enumerate(bounds):
        if b - a < 2 * MIN_SIZE:
            continue
        rows = max(1, CHUNK_BYTES // (80 * (b - a + 1) ** 2))  # _q_all holds ~10 arrays of rows x (n+1)² floats
        for lo in range(0, z.shape[0], rows):
            q = _q_all(z[lo:lo + rows, a:b])
            t = q.argmax(1)
            qt = q[np.arange(q.shape[0]), t]
            better = np.zeros(z.shape[0], dtype=bool)
            better[lo:lo + rows] = qt > best_q[lo:lo + rows]
            best_q[better], best_s[better], best_t[better] = qt[better[lo:lo + rows]], s, t[better[lo:lo + rows]]
    return best_q, best_s, best_t


def e_divisive(series: Sequence[float], *, sig: float = 0.05, permutations: int = 199,
               seed: int = 0) -> list[ChangePoint]:
    """The significant change points of `series`, in index order."""
    values = np.asarray(series, dtype=float)
    n = len(values)
    if not np.all(np.isfinite(values)):
        raise ValueError("the series has a value that is not a finite number")
    rng = np.random.default_rng(seed)
    bounds = [(0, n)]
    found: list[ChangePoint] = []
    while True:
        q, s, t = _best(values, bounds)
        if not np.isfinite(q[0]):
            break
        perm = np.tile(np.arange(n), (permutations, 1))
        for a, b in bounds:
            perm[:, a:b] = a + rng.permuted(np.tile(np.arange(b - a), (permutations, 1)), axis=1)
        qp, _, _ = _best(values, bounds, perm)
        p = (1 + int(np.sum(qp >= q[0] - 1e-12 * abs(q[0])))) / (1 + permutations)
        if p > sig:
            break
        a, b = bounds[int(s[0])]
        cut = a + int(t[0])
        found.append(ChangePoint(cut, float(q[0]), p))
        bounds[int(s[0]):int(s[0]) + 1] = [(a, cut), (cut, b)]
    return sorted(found, key=lambda c: c.index)
