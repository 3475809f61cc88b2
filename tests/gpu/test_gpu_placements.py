"""Private placements land where timing.placement_strata says: the k-th placement of a rotation
starts (k mod strata) x stride bytes into a 2 MiB segment of its own, so its small buffers (the
count kernel's counters) step through the address bits the L2 slice hash reads."""

import pytest

pytestmark = pytest.mark.gpu

SEGMENT = 2 << 20


def test_placements_step_through_the_strata_in_segments_of_their_own(gpu_log):
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.session import Options, Session
    from moebench.core.spec import load_spec

    spec = load_spec("count-block")
    t = spec.timing
    assert t.placement_memory == "private" and t.placement_strata > 1
    run = Session(spec, detect(False), Options(timing=t, time_it=True))
    case = next(c for c in expand(spec) if c.params["tokens"] == 1024)
    n = 2 * t.placement_strata
    sets, pools = run._build_sets(case, n)
    copies = [run._copy_set(sets[0], k) for k in range(n)]
    for label, placed in (("sets", sets), ("copies", [c for c, _ in copies])):
        offs = [p.counts_buf.data_ptr() % SEGMENT for p in placed]
        segs = {p.counts_buf.data_ptr() // SEGMENT for p in placed}
        gpu_log(f"{label}: counters at segment offsets {[hex(o) for o in offs]} in {len(segs)} segments")
        assert len(segs) == n  # every placement in a segment of its own
        for k, off in enumerate(offs):
            assert off - offs[0] == (k % t.placement_strata) * t.placement_stride


def test_placement_copy_allocates_as_deepcopy_does(gpu_log):
    """The fast placement copy makes deepcopy's allocations in deepcopy's order: in two fresh pools
    with the same stratum pad, every buffer of an act set and a count set lands at the same place
    (so the copies' placements, which the timing rotates, are those of last round's
    deepcopy)."""
    import copy

    import torch

    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.session import Options, Session, placement_copy
    from moebench.families.act import PADDED_OPS
    from moebench.core.spec import load_spec

    for name, field_names in (("count-block", ("routing_map", "valid", "counts_buf", "counts")),
                              ("act-grid", ("x", "live", "perm", "out_buf", "out"))):
        spec = load_spec(name)
        run = Session(spec, detect(False), Options(timing=spec.timing, time_it=True))
        cases = expand(spec)  # act: a padded op's case (its set holds a routing map too), where the sweep has one
        case = next((c for c in cases if c.params.get("op") in PADDED_OPS), cases[0])
        (src,), _ = run._build_sets(case, 1)
        where = {}
        for how, fn in (("deepcopy", copy.deepcopy), ("placement_copy", placement_copy)):
            with run._placement(3) as held:
                pad = held[1]
                made = fn(src)
            # a buffer in the pad's segment: its offset from the pad; one in a segment of its own
            # (a large one): its offset in that segment
            where[how] = [None if getattr(made, f) is None else
                          (getattr(made, f).data_ptr() - pad.data_ptr() if getattr(made, f).data_ptr() // SEGMENT
                           == pad.data_ptr() // SEGMENT else ("own segment", getattr(made, f).data_ptr() % SEGMENT))
                          for f in field_names]
            for f in field_names:
                a, b = getattr(src, f), getattr(made, f)
                if a is not None:
                    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
            del made, held, pad
        gpu_log(f"{name} ({case.label}): offsets from the pad {where['placement_copy']}")
        assert where["placement_copy"] == where["deepcopy"]
