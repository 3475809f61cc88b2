"""The counters pass's child: `python -m moebench.passes.counters_child JOB.json`, run under the counter
tool (Nsight Compute) by moebench.passes.counters; what it does per case is docs/counters.md, 'How'.
It re-creates the job's cases from data (nothing a results file names is run). A case that fails
here is written to the manifest with its error and the others go on. Without CUDA (tests on the
CPU) the launch is called directly instead of a graph.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from moebench import tritonpatch
from moebench.core.cases import Case, shape_key
from moebench.core.device import detect
from moebench.core.family import get_family
from moebench.core.spec import load_spec
from moebench.core.text import one_line
from moebench.core.timing import capture
from moebench.sources import arms, plugins


@triton.jit
def _moebench_counters_mark(out_ptr):  # (1,) int32; grid = (case index + 1,)
    tl.store(out_ptr, tl.program_id(0))


def run(job: dict) -> list[dict]:
    """Launch every case of the job (docs/counters.md, 'How'); returns the manifest entries."""
    plugins.use([Path(p) for p in job.get("plugins", [])])
    arms.restore(job.get("arms"), get_family)
    environ = job.get("environ", {})  # the run's kill switches, as the timed run read them
    cuda = torch.cuda.is_available() and not tritonpatch.interpreting()
    device = detect(not cuda)
    dev = "cuda" if cuda else "cpu"
    spec = load_spec(job["spec"])
    fam = spec.family
    impl = fam.load()
    mark_out = torch.zeros(1, dtype=torch.int32, device=dev)
    _moebench_counters_mark[(1,)](mark_out)  # compiled before the first profiled range
    warm = int(job.get("warm_replays", 0))
    shape, inputs = None, None
    entries = []
    for i, c in enumerate(job["cases"]):
        entry = {"id": c["id"], "index": i}
        try:
            case = Case(fam.name, c["variant"], c["label"], dict(c["params"]), c["id"])
            params, sources = fam.resolve(case.variant, case.params, device, environ)
            launch = c.get("launch", {})
            params.update({k: launch[k] for k in sources if k in launch})  # the launch values the record ran
            key = shape_key(case, fam.shape_params)
            if key != shape:
                inputs = None  # one shape's inputs at a time
                if cuda:
                    torch.cuda.empty_cache()
                inputs = impl.build_inputs(case.params, dev, 0)
                shape = key
            built = fam.build(case.variant, inputs, params, device)
            built.reset()
            built.launch()
            replay = built.launch
            if cuda:
                torch.cuda.synchronize()
                graph = capture([built.launch], 1, warmup=1)
                for _ in range(warm):
                    graph.replay()
                torch.cuda.synchronize()
                replay = graph.replay
                torch.cuda.profiler.start()
            try:
                _moebench_counters_mark[(i + 1,)](mark_out)
                replay()
                if cuda:
                    torch.cuda.synchronize()
            finally:
                if cuda:
                    torch.cuda.profiler.stop()
            del built
        except Exception as e:  # noqa: BLE001 - one case's failure is written down; the others go on
            entry["error"] = f"{type(e).__name__}: {one_line(e)}"
        entries.append(entry)
    return entries


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m moebench.passes.counters_child JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    entries = run(job)
    Path(job["manifest"]).write_text(json.dumps({"cases": entries}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
