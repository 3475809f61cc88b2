"""Issue 23's study, third probe: is the count kernel's process-level mode fixed for a whole process,
or set again each time a case is built? One process runs a sweep `--reps` times through the run
driver (each repetition a new case pipeline: new input sets, new placement pools, new graphs) and
logs, per placement, the lowest device address of its tensors, the thread that made it, and the case and group it belongs to. Run it in several fresh processes: if the
repetitions of one process agree while processes differ, the factor is set once per process; if they
differ as much as processes do, each build draws it anew and a run can sample it.

    python scripts/study/mode_probe.py OUT.json [--sweep count-block] [--reps 3]

A study script: it wraps moebench's Placements and Timer to log, and changes nothing they do."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sweep", default="count-block")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the spec's smoke shape (a local check on the CPU)")
    a = ap.parse_args()
    faulthandler.enable()

    from moebench.core import placements as P
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.driver import Summary, run_sweep
    from moebench.core import pipeline as PL
    from moebench.core.pipeline import Options, _tensors
    from moebench.core.spec import PACKAGE_ROOT, load_spec

    log: list[dict] = []
    state = {"case": None, "rep": 0}
    orig_copy = P.Placements.copy_set
    orig_build = PL.CasePipeline._build_sets
    orig_time = P.Timer.time

    def addr(obj):
        ptrs = [t.data_ptr() for _, t in _tensors(obj) if getattr(t, "is_cuda", False)]
        return min(ptrs) if ptrs else None

    def copy_set(self, inp, index):
        made = orig_copy(self, inp, index)
        log.append({"rep": state["rep"], "case": state["case"], "thread": threading.current_thread().name,
                    "index": index, "addr": addr(made[0]), "t": time.perf_counter()})
        return made

    def build_sets(self, case, n):
        sets, pools = orig_build(self, case, n)
        log.append({"rep": state["rep"], "shape_of": case.id, "thread": threading.current_thread().name,
                    "sets": [addr(s) for s in sets], "t": time.perf_counter()})
        return sets, pools

    def timed(self, case, rec, builts, **kw):
        state["case"] = case.id
        log.append({"rep": state["rep"], "case": case.id, "event": "time_start", "t": time.perf_counter()})
        try:
            return orig_time(self, case, rec, builts, **kw)
        finally:
            log.append({"rep": state["rep"], "case": case.id, "event": "time_end", "t": time.perf_counter()})
            state["case"] = None

    P.Placements.copy_set = copy_set
    PL.CasePipeline._build_sets = build_sets
    P.Timer.time = timed

    spec = load_spec(str(PACKAGE_ROOT / "sweeps" / f"{a.sweep}.yaml"))
    interp = not __import__("torch").cuda.is_available()
    device = detect(interp)
    cases = expand(spec, quick=a.quick)
    reps = []
    for r in range(a.reps):
        state["rep"] = r
        t0 = time.perf_counter()
        summary = None
        for ev in run_sweep(spec, cases, Options(timing=spec.timing, time_it=not interp), device, environ=dict(os.environ)):
            if isinstance(ev, Summary):
                summary = ev
        recs = []
        for rec in summary.records:
            t = rec.timing or {}
            recs.append({"case": rec.case_id, "params": rec.params, "status": rec.status,
                         "median_us": t.get("median_us"), "groups": t.get("group_medians_us"),
                         "rel_noise": t.get("rel_noise")})
        reps.append({"rep": r, "wall_s": round(time.perf_counter() - t0, 2), "records": recs})
        print(f"rep {r}: {reps[-1]['wall_s']} s", flush=True)
    Path(a.out).write_text(json.dumps({"pid": os.getpid(), "device": device.name, "reps": reps, "log": log}))


if __name__ == "__main__":
    main()
