"""Cold L2 is never faster than warm where the working set is DRAM-sized: the same act-grid
cases timed with the warm rotation and with enough sets to pass 3x the L2."""

import pytest

from gpu_runs import run

pytestmark = pytest.mark.gpu


def _dram_sized(case, impl, dev) -> bool:
    """One launch touches at least half the L2: the warm rotation then holds a single set."""
    return impl.touched_bytes(case.params) >= dev.l2_bytes / 2


def test_cold_medians_are_not_below_warm_for_dram_sized_cases(gpu_log):
    warm = {r.case_id: r for r in run("act-grid", l2="warm", where=_dram_sized)}
    cold = {r.case_id: r for r in run("act-grid", l2="cold", where=_dram_sized)}
    assert warm and warm.keys() == cold.keys()
    low = []
    for cid, w in warm.items():
        c = cold[cid]
        mw, mc = w.timing["median_us"], c.timing["median_us"]
        # "not below" within the two medians' own stated 95% half-widths
        slack = mw * (w.timing["rel_noise"] + c.timing["rel_noise"])
        gpu_log(f"{cid} {w.label} live_rows={w.params['live_rows']}: warm {mw:.3f} µs ({w.timing['l2']}), "
                f"cold {mc:.3f} µs ({c.timing['l2']}), cold/warm {mc / mw:.4f}")
        if mc < mw - slack:
            low.append(f"{cid}: cold {mc:.3f} < warm {mw:.3f} µs")
    assert not low, "; ".join(low)
