"""The profiler's (CUPTI) kernel time is below the graph-replay time for every case of the
default sweeps: replay time includes the gap between graph nodes, kernel time does not. Runs
last in the suite (tests/gpu/conftest.py): CUPTI, once started, can skew later event timings."""

import pytest

from gpu_runs import run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sweep", ["count-block", "act-grid"])
def test_profiler_kernel_time_is_below_graph_time(sweep, gpu_log):
    above = []
    gaps = []
    for r in run(sweep, cross=("profiler",)):
        m, k = r.timing["median_us"], r.cross.get("kernel_us")
        assert k is not None, f"{r.case_id}: no profiler time ({r.cross.get('cross_error')})"
        gaps.append(m - k)
        # below the graph time, within the graph time's own stated 95% half-width
        if k > m * (1 + r.timing["rel_noise"]):
            above.append(f"{r.case_id} {r.label} {r.params}: kernel {k:.3f} > graph {m:.3f} µs")
    gpu_log(f"{len(gaps)} cases: graph - kernel (node gap) median {sorted(gaps)[len(gaps) // 2]:.3f} µs, "
            f"range {min(gaps):.3f} .. {max(gaps):.3f} µs")
    for line in above:
        gpu_log("ABOVE: " + line)
    assert not above, f"{len(above)} cases with kernel time above graph time"
