"""Is a process's kernel-code placement the run-to-run factor? (issue 23's study)

One input set of one count case, held at one placement; the kernel's compiled binary loaded
again `--loads` times (each load puts the code at another address, as a fresh process does);
a graph captured with each load's function handle and timed. If the per-load times spread like
fresh processes do, the code's placement is what differs between processes.
Usage: python scripts/study/code_probe.py OUT.json [--cases 4096:512,1024:512 --loads 24]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", default="4096:512,1024:512,256:128")
    ap.add_argument("--loads", type=int, default=24)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--replays", type=int, default=30)
    a = ap.parse_args()
    import torch
    from triton.runtime.driver import driver

    from probe_replay import replay_median_us
    from moebench.families.count import kernels as K

    base = {"buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32, "local_expert_start": 0,
            "routing": "uniform", "zipf_s": 1.2, "seed": 0, "num_warps": 4, "grid": 132}
    out = {"device": torch.cuda.get_device_name(), "cases": {}}
    keep = []
    for case in a.cases.split(","):
        tokens, block = (int(x) for x in case.split(":"))
        p = dict(base, tokens=tokens, block_size=block)
        inp = K.build_inputs(p, "cuda", 0)
        kw = dict(routing_map_ptr=inp.routing_map, counts_ptr=inp.counts, valid_tokens_ptr=inp.valid, topk=8,
                  local_start=0, NUM_LOCAL=32, num_programs=132)
        ck = K._count_persistent_kernel[(132,)](**kw, BLOCK_SIZE=block, num_warps=4)
        torch.cuda.synchronize()
        original = ck.function

        def fn():
            K._count_persistent_kernel[(132,)](**kw, BLOCK_SIZE=block, num_warps=4)

        rows = []
        dev = torch.cuda.current_device()
        for j in range(a.loads + 1):
            if j:
                mod, func, *_ = driver.active.utils.load_binary(ck.name, ck.kernel, ck.metadata.shared, dev)
                keep.append(mod)
                ck.function = func
            us = replay_median_us([fn], a.launches, a.replays, warmup=3)
            rows.append({"load": j, "us": us, "function": int(ck.function)})
        ck.function = original
        us = [r["us"] for r in rows]
        out["cases"][case] = rows
        print(f"{case:10s} loads {len(us)} median {statistics.median(us):.3f} min {min(us):.3f} max {max(us):.3f} "
              f"sd {statistics.pstdev(us):.3f}  seq {' '.join(f'{u:.2f}' for u in us[:12])}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
