"""The graph timer against kernels of known duration (tests/gpu/spin.py): a spin of T µs reads
as T plus a constant per-launch overhead, and a graph of K launches as K times one."""

import pytest

from moebench.core.stats import median, noise_below
from moebench.core.timing import time_graph

pytestmark = pytest.mark.gpu

SPINS_US = (2, 10, 50)
TOLERANCE = 0.02  # the bound: within 2% of T
# The per-launch overhead a graph adds to a kernel that does work (launch, the gap between graph
# nodes; ~0.15 µs on an H200, results/h200/TIMER.md): it must be a small positive constant.
OVERHEAD_BAND_US = (0.0, 1.0)
GRAPH_SIZES = (1, 10, 50, 200, 1000)


@pytest.fixture(scope="module")
def spin():
    import torch

    from spin import cycles_per_ns, spin_launch

    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    return out, spin_launch, lambda: cycles_per_ns(out)


def _per_launch_us(fn, launches: int = 200) -> float:
    s = time_graph([fn], launches_per_graph=launches, min_replays=20, max_seconds=2.0, stop=noise_below(0.002))
    return median(s.per_launch_us)


def test_a_spin_of_t_microseconds_reads_as_t(spin, gpu_log):
    out, spin_launch, rate = spin
    r0 = rate()
    read = {t: _per_launch_us(spin_launch(out, round(t * 1000 * r0))) for t in SPINS_US}
    r1 = rate()
    gpu_log(f"SM cycles per ns: {r0:.5f} before, {r1:.5f} after ({r0 * 1000:.0f} / {r1 * 1000:.0f} MHz)")
    assert abs(r1 / r0 - 1) < 0.005, f"the SM clock moved during the test: {r0:.5f} -> {r1:.5f} cycles/ns"
    # least squares read = slope * T + overhead over the three spins
    xs, ys = list(read), list(read.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    overhead = my - slope * mx
    for t, r in read.items():
        gpu_log(f"spin {t:>2} µs: timer reads {r:.4f} µs per launch = T + {r - t:.4f} µs; "
                f"(read - overhead) / T = {(r - overhead) / t:.4f}")
    gpu_log(f"fit: read = {slope:.5f} x T + {overhead:.4f} µs")
    assert abs(slope - 1) < TOLERANCE, f"a µs of kernel reads as {slope:.4f} µs"
    assert OVERHEAD_BAND_US[0] <= overhead <= OVERHEAD_BAND_US[1], f"per-launch overhead {overhead:.4f} µs"
    for t, r in read.items():
        assert abs(r - overhead - t) <= TOLERANCE * t, f"spin {t} µs read as {r:.4f} µs (overhead {overhead:.4f})"


def test_a_graph_of_k_launches_reads_as_k_times_one(spin, gpu_log):
    """replay(K) = K x one launch + the graph's own cost: a straight line in K, its slope the
    per-launch time of the K = 200 graph the session times with. The one-launch graph is logged but
    not fitted: its replay carries the graph launch, which read 2.4 µs in one H200 run and 7.4 µs in
    the next on a freshly started machine (2026-11-30)."""
    out, spin_launch, rate = spin
    fn = spin_launch(out, round(10_000 * rate()))
    replay = {k: _per_launch_us(fn, k) * k for k in GRAPH_SIZES}  # µs per replay of a K-launch graph
    one = replay[200] / 200
    ks = [k for k in GRAPH_SIZES if k >= 10]
    mk, mr = sum(ks) / len(ks), sum(replay[k] for k in ks) / len(ks)
    slope = sum((k - mk) * (replay[k] - mr) for k in ks) / sum((k - mk) ** 2 for k in ks)
    cost = mr - slope * mk
    gpu_log(f"10 µs spin: {one:.4f} µs per launch at K = 200; one-launch graph replays in {replay[1]:.3f} µs; "
            f"fit over K = {', '.join(map(str, ks))}: replay = {slope:.4f} x K + {cost:.3f} µs")
    assert abs(slope / one - 1) < TOLERANCE, f"{slope:.4f} µs per added launch vs {one:.4f} at K = 200"
    for k in ks:
        fit = slope * k + cost
        gpu_log(f"K = {k:>4}: replay {replay[k]:9.3f} µs, the line says {fit:9.3f} ({100 * (replay[k] / fit - 1):+.2f}%)")
        assert abs(replay[k] - fit) <= TOLERANCE * slope * k, f"K = {k}: {replay[k]:.3f} µs off the line ({fit:.3f})"
