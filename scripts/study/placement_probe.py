"""Where the count kernel's placement spread lives (issue 23, item 1): one process, several ways
of placing an input set, each placement timed alone in its own graph.

For each style, `--n` placements of one count case's inputs (routing map, valid scalar, counters)
are allocated and held; each is timed alone (one CUDA graph of `--launches` launches of that
placement, replayed until `--replays`), so the per-placement medians are the distribution a
method samples from. Run it in several fresh processes (and device calls) and compare the
per-style distributions between processes: a method whose placements sample the same
distribution in every process gives one centre for every run.

Styles (each placement in a torch.cuda.MemPool of its own, so its small buffers get a fresh
segment; held until the process ends):
  strata     the k-th pool starts with a (k mod 8) x 4 KiB pad (moebench's method until now)
  fresh      no pad: the set at the start of a fresh 2 MiB segment
  spacerM    a held M MiB spacer allocated first in the pool, then the set (placements
             M + 2 MiB apart in allocation order)

Writes one JSON per process: per style, per placement: median us, the counters' address.
Usage: python scripts/study/placement_probe.py OUT.json [--tokens 4096 --block 512 --n 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", default="4096:512,1024:512,256:128", help="tokens:block,...")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--styles", default="strata,fresh,spacer8,spacer64")
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--replays", type=int, default=30)
    a = ap.parse_args()

    import torch

    from probe_replay import replay_median_us
    from moebench.families.count import kernels as K

    base = {"buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32, "local_expert_start": 0,
            "routing": "uniform", "zipf_s": 1.2, "seed": 0, "num_warps": 4, "grid": 132}
    result = {"device": torch.cuda.get_device_name(), "styles": {}, "cases": a.cases}
    held = []

    def placed(style: str, k: int, params: dict):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            extra = None
            if style == "strata":
                extra = torch.empty((k % 8) * 4096, dtype=torch.uint8, device="cuda") if k % 8 else None
            elif style.startswith("spacer"):
                extra = torch.empty(int(style[6:]) * 2**20, dtype=torch.uint8, device="cuda")
            inp = K.build_inputs(params, "cuda", 0)
        held.append((pool, extra, inp))
        return inp

    for case in a.cases.split(","):
        tokens, block = (int(x) for x in case.split(":"))
        params = dict(base, tokens=tokens, block_size=block)
        for style in a.styles.split(","):
            rows = []
            t0 = time.perf_counter()
            for k in range(a.n):
                inp = placed(style, k, params)
                fn = K.count_persistent(inp, params, 132, block, 4)
                fn()
                torch.cuda.synchronize()
                us = replay_median_us([fn], a.launches, a.replays, warmup=3)
                rows.append({"k": k, "us": us, "counts_ptr": inp.counts.data_ptr(),
                             "map_ptr": inp.routing_map.data_ptr()})
            us = [r["us"] for r in rows]
            key = f"{tokens}/{block}/{style}"
            result["styles"][key] = {"rows": rows, "median": statistics.median(us), "mean": statistics.fmean(us),
                                     "min": min(us), "max": max(us), "sd": statistics.pstdev(us),
                                     "wall_s": round(time.perf_counter() - t0, 2)}
            print(f"{key:24s} median {statistics.median(us):.3f} mean {statistics.fmean(us):.3f} "
                  f"min {min(us):.3f} max {max(us):.3f} sd {statistics.pstdev(us):.3f}", flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
