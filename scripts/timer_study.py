"""Timer study on a GPU (issue: trustworthy timing). Not a test: a measurement script.

Questions it answers for the count kernel at the decode shape (256 tokens, capacity 16384):
 1. placement: does where a tiny counter buffer lands move the time? Time the same case on
    16 separately allocated input/counter sets, one at a time, then all rotated in one graph.
 2. graph size: does the number of launches per graph (K) move the per-launch time, and does
    that explain the gap to triton's do_bench_cudagraph (which unrolls ~rep/t launches)?

    python scripts/timer_study.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch

from moebench.core.device import detect
from moebench.core.stats import noise_below, summarize
from moebench.families import get_family
from moebench.families.count import kernels as count
from moebench.core.timing import dobench_cudagraph_us, time_graph


def main(out: Path) -> None:
    dev = detect(False)
    res: dict = {"device": dev.name}
    base = {"tokens": 256, "buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32,
            "local_expert_start": 0, "routing": "uniform", "zipf_s": 1.2, "seed": 0, "grid": 0, "num_warps": 4}
    for block in (128, 1024):
        p = {**base, "block_size": block}
        sets = [count.build_inputs(p, "cuda", i) for i in range(16)]
        fam = get_family("count")
        q, _ = fam.resolve("persistent", p, dev, {})
        builts = [fam.builder("persistent")(s, q, dev) for s in sets]
        per_set = [summarize(time_graph([b.launch], stop=noise_below(0.003)).per_launch_us).median_us for b in builts]
        rotated = summarize(time_graph([b.launch for b in builts[:8]], stop=noise_below(0.003)).per_launch_us).median_us
        single = builts[0].launch
        by_k = {k: summarize(time_graph([single], launches_per_graph=k, stop=noise_below(0.003)).per_launch_us).median_us
                for k in (10, 50, 200, 1000)}
        by_rep = {rep: dobench_cudagraph_us(single, rep_ms=rep) for rep in (5, 20, 100)}
        # the rotation both ways: our graph of 200 launches over 8 sets, and do_bench_cudagraph of
        # one call that launches the 8 sets (divided by 8), and do_bench on each set alone
        eight = [b.launch for b in builts[:8]]

        def all8():
            for f in eight:
                f()

        rot_ours = {k: summarize(time_graph(eight, launches_per_graph=k, stop=noise_below(0.003)).per_launch_us).median_us
                    for k in (200, 1600)}
        rot_dobench = dobench_cudagraph_us(all8) / 8
        per_set_dobench = [dobench_cudagraph_us(f, rep_ms=20) for f in eight]
        res[f"block{block}"] = {"per_set_us": per_set, "rotated8_us": rotated, "by_launches_per_graph": by_k,
                                "dobench_by_rep_ms": by_rep, "rotated8_ours_by_k": rot_ours,
                                "rotated8_dobench_us": rot_dobench, "per_set_dobench_us": per_set_dobench}
    out.mkdir(parents=True, exist_ok=True)
    (out / "timer_study.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        if isinstance(v, dict):
            ps = v["per_set_us"]
            print(f"{k}: per-set min {min(ps):.3f} max {max(ps):.3f} µs (spread {100 * (max(ps) / min(ps) - 1):.1f}%), "
                  f"rotated x8 {v['rotated8_us']:.3f}; by K {({a: round(b, 3) for a, b in v['by_launches_per_graph'].items()})}; "
                  f"do_bench by rep {({a: round(b, 3) for a, b in v['dobench_by_rep_ms'].items()})}; "
                  f"rotation: ours by K {({a: round(b, 3) for a, b in v['rotated8_ours_by_k'].items()})}, "
                  f"do_bench(8 sets)/8 {v['rotated8_dobench_us']:.3f}, mean of per-set do_bench "
                  f"{sum(v['per_set_dobench_us']) / 8:.3f}, mean of per-set ours {sum(ps[:8]) / 8:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
