"""Private placements land where timing.placement_strata says: the k-th placement of a rotation
starts (k mod strata) x stride bytes into a 2 MiB segment of its own, so its small buffers (the
count kernel's counters) step through the address bits the L2 slice hash reads."""

import pytest

pytestmark = pytest.mark.gpu

SEGMENT = 2 << 20


def test_placements_step_through_the_strata_in_segments_of_their_own(gpu_log):
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.pipeline import CasePipeline, Options
    from moebench.core.spec import load_spec

    spec = load_spec("count-block")
    t = spec.timing
    assert t.placement_memory == "private" and t.placement_strata > 1
    run = CasePipeline(spec, detect(False), Options(timing=t, time_it=True))
    case = next(c for c in expand(spec) if c.params["tokens"] == 1024)
    n = 2 * t.placement_strata
    sets, pools = run._build_sets(case, n)
    copies = [run.placements.copy_set(sets[0], k) for k in range(n)]
    for label, placed in (("sets", sets), ("copies", [c for c, _ in copies])):
        offs = [p.counts_buf.data_ptr() % SEGMENT for p in placed]
        segs = {p.counts_buf.data_ptr() // SEGMENT for p in placed}
        gpu_log(f"{label}: counters at segment offsets {[hex(o) for o in offs]} in {len(segs)} segments")
        assert len(segs) == n  # every placement in a segment of its own
        for k, off in enumerate(offs):
            assert off - offs[0] == (k % t.placement_strata) * t.placement_stride

