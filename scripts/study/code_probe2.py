"""Issue 23's study, second probe: a sweep-like rotation (64 placements) of one count case, timed
with (a) fresh data placements and the process's own code, (b) the same data and the kernel's
binary loaded again, `--spread` discarded loads apart (so each timed load sits further along
the driver's code memory). Prints the per-graph levels.
Usage: python scripts/study/code_probe2.py OUT.json [--case 4096:512 --loads 12 --spread 64]"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", default="4096:512,1024:512,1024:128")
    ap.add_argument("--loads", type=int, default=12)
    ap.add_argument("--spread", type=int, default=64)
    ap.add_argument("--fresh", type=int, default=4)
    a = ap.parse_args()
    import torch
    from triton.runtime.driver import driver

    from probe_replay import replay_median_us
    from moebench.families.count import kernels as K

    dev = torch.cuda.current_device()
    base = {"buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32, "local_expert_start": 0,
            "routing": "uniform", "zipf_s": 1.2, "seed": 0, "num_warps": 4, "grid": 132}
    keep, out = [], {}

    def placements(p, n_sets=8, copies=8):
        sets = []
        for i in range(n_sets):
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                s = K.build_inputs(p, "cuda", i)
            keep.append(pool); sets.append(s)
        allp = list(sets)
        for j in range(n_sets * (copies - 1)):
            pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool):
                pad = torch.empty(((n_sets + j) % 8) * 4096, dtype=torch.uint8, device="cuda") if (n_sets + j) % 8 else None
                allp.append(copy.deepcopy(sets[j % n_sets]))
            keep.append((pool, pad))
        return allp

    def level(fns):
        return replay_median_us(fns, 200, 30, warmup=2)

    for case in a.cases.split(","):
        tokens, block = (int(x) for x in case.split(":"))
        p = dict(base, tokens=tokens, block_size=block)
        pl = placements(p)
        ck = None
        for inp in pl[:1]:
            kw = dict(routing_map_ptr=inp.routing_map, counts_ptr=inp.counts, valid_tokens_ptr=inp.valid, topk=8,
                      local_start=0, NUM_LOCAL=32, num_programs=132)
            ck = K._count_persistent_kernel[(132,)](**kw, BLOCK_SIZE=block, num_warps=4)
        torch.cuda.synchronize()
        fns = [K.count_persistent(x, p, 132, block, 4) for x in pl]
        own = ck.function
        res = {"own": level(fns), "fresh_data": [], "reloads": []}
        for _ in range(a.fresh):
            pl2 = placements(p)
            res["fresh_data"].append(level([K.count_persistent(x, p, 132, block, 4) for x in pl2]))
        for j in range(a.loads):
            for _ in range(a.spread):
                m, *_ = driver.active.utils.load_binary(ck.name, ck.kernel, ck.metadata.shared, dev)
                keep.append(m)
            m, f, *_ = driver.active.utils.load_binary(ck.name, ck.kernel, ck.metadata.shared, dev)
            keep.append(m)
            ck.function = f
            res["reloads"].append(level(fns))
        ck.function = own
        res["own_again"] = level(fns)
        out[case] = res
        print(case, res, flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
