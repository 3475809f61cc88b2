"""Issue 23 item 3: moebench's graph-replay time against nvbench's on the very same graphs.

Kernels: the spin kernel of known duration (tests/gpu/spin.py: one warp spins a given number of
SM cycles; its duration is cycles / the measured cycle rate) at ~2 and ~14 µs, and single-placement
count cases (16384 tokens at BLOCK 64 and 512, where nvbench read 1.3-2.7% above moebench, and
1024 / 512, 256 / 128). Each graph (`--launches` launches of one closure) is timed by:
  moebench  time_graph's method: CUDA events around each replay, median per launch
  nvbench   cuda.bench over the same graph object (batch and cold), moebench.passes.timers.nvbench_graphs
  dobench   triton's do_bench_cudagraph on the closure
Prints one row per graph and writes JSON. GPU only; nvbench needs cuda-bench (see
scripts/h200-instrument.sh for the wheels).
Usage: python scripts/study/nvbench_gap.py OUT.json [--launches 200]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))  # the spin kernel lives with the GPU tests that use it


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--launches", default="200,20")
    a = ap.parse_args()
    import torch

    import spin
    from moebench.core.timing import capture, time_graph
    from moebench.passes.timers import NvbenchItem, dobench_cudagraph_us, nvbench_graphs
    from moebench.families.count import kernels as K

    out = torch.zeros(2, dtype=torch.int64, device="cuda")
    cpn = spin.cycles_per_ns(out)
    closures = {}
    for us in (2.0, 14.0):
        buf = torch.zeros(2, dtype=torch.int64, device="cuda")
        closures[f"spin {us:g} us ({int(us * 1000 * cpn)} cycles)"] = (spin.spin_launch(buf, int(us * 1000 * cpn)), us)
    base = {"buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32, "local_expert_start": 0,
            "routing": "uniform", "zipf_s": 1.2, "seed": 0, "num_warps": 4, "grid": 132}
    keep = []
    for tokens, block in ((16384, 64), (16384, 512), (1024, 512), (256, 128)):
        p = dict(base, tokens=tokens, block_size=block)
        inp = K.build_inputs(p, "cuda", 0)
        keep.append(inp)
        closures[f"count {tokens}/{block}"] = (K.count_persistent(inp, p, 132, block, 4), None)
    rows, items = [], []
    for n in (int(x) for x in a.launches.split(",")):
        for name, (fn, known) in closures.items():
            fn()
            torch.cuda.synchronize()
            s = time_graph([fn], launches_per_graph=n, min_replays=50, max_replays=400, max_seconds=1.0)
            g = capture([fn], n, warmup=2, fresh=False)
            keep.append(g)
            items.append(NvbenchItem(g.replay, n))
            rows.append({"kernel": name, "launches": n, "known_us": known,
                         "moebench_us": round(statistics.median(s.per_launch_us), 4),
                         "moebench_min_us": round(min(s.per_launch_us), 4),
                         "dobench_us": round(dobench_cudagraph_us(fn), 4)})
    got = nvbench_graphs(items, torch.cuda.current_device(), log_dir=Path(a.out).parent / "nvbench-gap")
    for r, x in zip(rows, got):
        r["nvbench_batch_us"] = round(x["batch_us"], 4) if x.get("batch_us") else None
        r["nvbench_cold_us"] = round(x["cold_us"], 4) if x.get("cold_us") else None
        if r["nvbench_batch_us"]:
            r["delta_batch_pct"] = round(100 * (r["moebench_us"] - r["nvbench_batch_us"]) / r["nvbench_batch_us"], 2)
        print(f"{r['kernel']:34s} L={r['launches']:4d} moebench {r['moebench_us']:8.4f} dobench {r['dobench_us']:8.4f} "
              f"nvbench batch {r['nvbench_batch_us']} cold {r['nvbench_cold_us']} delta {r.get('delta_batch_pct')}%",
              flush=True)
    Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "cycles_per_ns": cpn, "rows": rows},
                                      indent=1))


if __name__ == "__main__":
    main()
