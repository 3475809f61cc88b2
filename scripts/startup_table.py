"""Where `sweep count-block`'s wall goes, against the floor of any CUDA program in Python (issue 31,
item 6). GPU only; a benchmark, not a test.

    python3 scripts/startup_table.py OUT [--runs 3] [--sweep count-block]

In one call, alternating: the floor `python3 -c "import torch, triton; torch.zeros(1, device='cuda')"`
and the whole command `python3 -m moebench sweep SWEEP --timings`, each as a fresh process, after
one unrecorded run of each (the sweep's measures the device ceilings once and fills Triton's
cache, as a user's first run does). Each sweep run's --timings rows come from its results file
(provenance.wall_phases). Writes OUT/startup.json (every wall and row) and OUT/startup.md (the
table, generated from the JSON): wall, floor, cases (the rows named "cases: ..."), and what is
neither, per run and as medians; the target is wall <= floor + cases + 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLOOR = [sys.executable, "-c", "import torch, triton; torch.zeros(1, device='cuda')"]
BUDGET_S = 2.0


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    return wall


def page(doc: dict) -> str:
    rows = doc["runs"]
    out = [f"# `{doc['command']}`: where the wall goes", "",
           f"Made by `scripts/startup_table.py` from `startup.json` on {doc['device']} (moebench {doc['commit']}). "
           f"Floor: `{doc['floor_command']}`. Every command a fresh process, floor and sweep alternating, after one "
           "unrecorded run of each. Seconds.", "",
           "| run | wall | floor | cases | wall − floor − cases | within floor + cases + 2 s |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        rest = r["wall_s"] - r["floor_s"] - r["cases_s"]
        out.append(f"| {i} | {r['wall_s']:.2f} | {r['floor_s']:.2f} | {r['cases_s']:.2f} | {rest:.2f} | "
                   f"{'yes' if rest <= BUDGET_S else 'no'} |")
    m = doc["median"]
    out += [f"| median | {m['wall_s']:.2f} | {m['floor_s']:.2f} | {m['cases_s']:.2f} | {m['rest_s']:.2f} | "
            f"{'yes' if m['rest_s'] <= BUDGET_S else 'no'} |", "",
            "The `--timings` rows of the median sweep run (its results file's `provenance.wall_phases`):", "",
            "| stage | s |", "|---|---|"]
    out += [f"| {k} | {v:.3f} |" for k, v in doc["median_run_phases"].items()]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sweep", default="count-block")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs_dir = a.out / "startup-runs"
    sweep = [sys.executable, "-m", "moebench", "sweep", a.sweep, "--timings", "--force", "--out", str(runs_dir)]
    timed(FLOOR, env)
    timed(sweep, env)
    runs = []
    for _ in range(a.runs):
        floor = timed(FLOOR, env)
        wall = timed(sweep, env)
        result = next(runs_dir.glob(f"*/{a.sweep}.json"))
        prov = json.loads(result.read_text())["provenance"]
        phases = prov["wall_phases"]
        cases = sum(v for k, v in phases.items() if k.startswith("cases:"))
        runs.append({"wall_s": wall, "floor_s": floor, "cases_s": cases, "phases": phases})
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "floor_s", "cases_s")}
    med["rest_s"] = statistics.median(r["wall_s"] - r["floor_s"] - r["cases_s"] for r in runs)
    mid = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    doc = {"command": " ".join(["python3 -m moebench sweep", a.sweep, "--timings"]),
           "floor_command": 'python3 -c "import torch, triton; torch.zeros(1, device=\'cuda\')"',
           "device": prov["device"]["name"], "gpu_uuid": prov["device"].get("uuid"),
           "commit": prov.get("git_commit"), "budget_s": BUDGET_S, "runs": runs, "median": med,
           "median_run_phases": mid["phases"]}
    (a.out / "startup.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out / "startup.md").write_text(page(doc))
    print(page(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
