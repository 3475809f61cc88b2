"""Issue 23's probes time a graph the same simple way (no groups, no stop rule, no placements of
moebench's timer): capture `launches` launches of `fns` (moebench.core.timing.capture), 3 replays to
warm, then `replays` replays each between two CUDA events; the median per launch in µs, 4 decimals.
Used by scripts/study/placement_probe.py, code_probe.py and code_probe2.py."""

from __future__ import annotations

import statistics


def replay_median_us(fns, launches: int, replays: int, *, warmup: int) -> float:
    import torch

    from moebench.core.timing import capture

    g = capture(list(fns), launches, warmup=warmup, fresh=False)
    for _ in range(3):
        g.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(replays):
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        xs.append(s.elapsed_time(e) * 1000 / launches)
    del g
    return round(statistics.median(xs), 4)
