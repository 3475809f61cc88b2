"""Passes: measurements beside moebench's own timing, registered on the run driver
(moebench.core.driver), the way tritonbench registers metrics.

A pass is a module-level subclass of `Pass` (the workers get their passes pickled), registered
with `@register`, in this module or a plugin file. It declares

- `name`: what `--cross-check NAME` asks for, and what the provenance lists when it ran;
- where it can run: `cuda_only` (needs a timed run on a CUDA device), `in_workers` (can run inside
  the per-GPU workers of `--devices`); `select` refuses any other combination with a UsageError
  (exit 2) before the first case, so a pass listed in the provenance always ran;
- `keeps_graphs`: the timer keeps each case's captured graphs (and the copies they read) for it;
- `announce`: the progress line while its `after_all` runs; `unavailable()`: why it cannot run on
  this machine (a missing package), or None;

and implements either hook or both:

- `after_case(ctx: CaseDone)`: right after a case was timed (untimed: after its checks), in the
  process that ran it (a worker, with `--devices`);
- `after_all(ctx: AfterAll)`: after every case, in the driver's process, in registration order
  (nvbench before the profiler: CUPTI disturbs later replays); it may add fields to any record
  (entries of `record.cross`, or a dict of its own on `work` or `cross`);
- `release()`: drop what it kept; the driver calls it after `after_all`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from moebench.core import counters
from moebench.core.placements import group_medians
from moebench.core.records import Record
from moebench.core.stats import mean
from moebench.core.text import one_line
from moebench.errors import UsageError
from moebench.sources import plugins


def _timing():
    """moebench.core.timing (torch and triton), imported when a pass first runs: the driver imports
    this module for every run, a host-only family's too, which imports no torch."""
    from moebench.core import timing

    return timing


@dataclass
class CaseDone:
    """What a pass's after_case hook sees: one case right after it was timed (or checked, untimed)."""

    case: Any
    record: Record
    builts: list  # group 0's Built closures (one per placement of its rotation); untimed: the checked one
    timed: bool = True
    graphs: list = field(default_factory=list)  # the captured graphs, when a pass asked to keep them
    held: list = field(default_factory=list)  # the copies (and pools) group 0 and the kept graphs read
    pools: Any = None  # the memory pools of the case's input sets (private placements)
    launches_per_graph: int = 0


@dataclass
class AfterAll:
    """What a pass's after_all hook sees: the whole run."""

    spec: Any
    device: Any
    options: Any
    cases: list
    records: list[Record]
    pipeline: Any = None  # the driver's CasePipeline (None when the cases ran in workers)
    environ: dict = field(default_factory=dict)  # the run's environment (the kill switches), as the cases read it


class Pass:
    name: ClassVar[str] = ""
    cuda_only: ClassVar[bool] = True
    in_workers: ClassVar[bool] = True
    keeps_graphs: ClassVar[bool] = False
    announce: ClassVar[str | None] = None

    def unavailable(self) -> str | None:
        return None

    def after_case(self, ctx: CaseDone) -> None:  # noqa: B027 - optional hook
        pass

    def after_all(self, ctx: AfterAll) -> None:  # noqa: B027 - optional hook
        pass

    def release(self) -> None:  # noqa: B027 - optional hook
        pass

    @classmethod
    def has_after_all(cls) -> bool:
        return cls.after_all is not Pass.after_all


PASSES: dict[str, type[Pass]] = {}


def register(cls: type[Pass]) -> type[Pass]:
    """Register a pass class under its name (a later registration of the same name replaces it)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: a pass needs a name")
    PASSES[cls.name] = cls
    return cls


def select(names, *, backend: str, timed: bool, workers: bool) -> list[Pass]:
    """Fresh instances of the named passes, in registration order; the one check of `--cross-check`:
    a UsageError naming the first that is unknown, cannot run on this machine (`unavailable`: a
    missing package), or cannot run where these cases run (the interpreter, an untimed run, per-GPU
    workers)."""
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in PASSES]
    if unknown:
        raise UsageError(f"--cross-check: unknown {', '.join(map(repr, unknown))}; expected {', '.join(PASSES)}")
    out = []
    for name, cls in PASSES.items():
        if name not in wanted:
            continue
        why = cls().unavailable()
        if why:
            raise UsageError(why)
        if cls.cuda_only and (backend != "cuda" or not timed):
            where = "an untimed run" if backend == "cuda" else f"this run ({backend}: the Triton interpreter, " \
                    "correctness only)" if backend == "interpret" else f"this run ({backend})"
            raise UsageError(f"--cross-check {name}: needs timings on a CUDA device, and {where} has none; "
                             f"drop --cross-check {name}")
        if workers and not cls.in_workers:
            raise UsageError(f"--cross-check {name}: cannot run with --devices (its pass needs every case's graphs "
                             "in one process); drop --devices or the cross-check")
        out.append(cls())
    return out


# ----------------------------------------------------------------------------------- the built-in passes


@register
class DoBench(Pass):
    """triton's do_bench_cudagraph on the same closures, right after our own timing. The profiler
    pass runs later, after every case: once the PyTorch profiler (CUPTI) has been started in a
    process, do_bench_cudagraph reads high in every later case."""

    name = "dobench"

    def after_case(self, ctx: CaseDone) -> None:
        rec = ctx.record
        fns = [b.launch for b in ctx.builts]

        def all_sets():  # the same rotation as the timed graph: one call launches every set once
            for f in fns:
                f()

        try:
            v = _timing().dobench_cudagraph_us(all_sets) / len(fns)
            # against the same placements: with placement groups, group 0's median
            mine = group_medians(rec)[0]
            rec.cross["dobench_us"] = round(v, 4)
            rec.cross["dobench_delta_pct"] = round(100 * (mine - v) / v, 2)
        except Exception as e:  # noqa: BLE001 - a failed cross-check is noted, the timing stands
            rec.cross["cross_error"] = one_line(e)


@register
class Nvbench(Pass):
    """nvbench times every timed case's own graph (kept by the timer, over the same buffers), with
    its own cold and batch measurements and its own stopping rule, in one run (cuda.bench runs its
    benchmarks once per process), after all timing and before any profiling. Each record gets
    nvbench's per-launch times and their difference to moebench's number."""

    name = "nvbench"
    in_workers = False
    keeps_graphs = True
    announce = "nvbench pass (cold and batch replays of every timed graph)"

    def __init__(self):
        self.kept: dict[str, dict] = {}  # case id -> timed graphs and what they read

    def unavailable(self) -> str | None:
        why = _timing().nvbench_unavailable()
        if why:
            return (f"--cross-check nvbench: cuda.bench is not importable here ({why}); install it with "
                    "pip install 'moebench[nvbench]' (the cuda-bench wheel, and a cuda-bindings of your CUDA major)")
        return None

    def after_case(self, ctx: CaseDone) -> None:
        self.kept[ctx.case.id] = {"graphs": ctx.graphs, "builts": ctx.builts, "copies": ctx.held,
                                  "pools": ctx.pools, "launches": ctx.launches_per_graph}

    def after_all(self, ctx: AfterAll) -> None:
        todo = [(r, self.kept[r.case_id]) for r in ctx.records
                if r.status == "ok" and r.timing.get("median_us") is not None and r.case_id in self.kept]
        timing = _timing()
        items = [timing.NvbenchItem(lambda gs=k["graphs"]: [g.replay() for g in gs], k["launches"] * len(k["graphs"]))
                 for _, k in todo]
        try:
            results = timing.nvbench_graphs(items, timing.torch.cuda.current_device()) if items else []
        except Exception as e:  # noqa: BLE001 - a failed cross-check is noted, the timings stand
            for rec, _ in todo:
                rec.cross["cross_error"] = f"nvbench: {one_line(e)}"
            results = []
        for (rec, k), got in zip(todo, results):
            # against the same graphs: the mean of the kept groups' medians (the first `groups`)
            m = mean(group_medians(rec)[:len(k["graphs"])])
            for key, delta in (("batch_us", "nvbench_delta_pct"), ("cold_us", "nvbench_cold_delta_pct")):
                if got.get(key):
                    rec.cross[f"nvbench_{key}"] = round(got[key], 4)
                    rec.cross[delta] = round(100 * (m - got[key]) / got[key], 2)
            if got.get("cold_noise_pct") is not None:
                rec.cross["nvbench_noise_pct"] = round(got["cold_noise_pct"], 3)
            for key in ("cold_samples", "batch_samples"):
                if got.get(key) is not None:
                    rec.cross[f"nvbench_{key}"] = got[key]
            if not got:
                rec.cross["cross_error"] = "nvbench: no measurement for this graph (skipped or timed out)"

    def release(self) -> None:
        self.kept.clear()


@register
class Profiler(Pass):
    """Pure kernel time from the PyTorch profiler (CUPTI) for every timed record, in a pass of its
    own after all timing; node gap = graph-replay time - kernel time."""

    name = "profiler"
    in_workers = False
    announce = "profiler pass (CUPTI kernel times)"

    def __init__(self):
        self.kept: dict[str, tuple] = {}  # case id -> group 0's closures and the copies they read

    def after_case(self, ctx: CaseDone) -> None:
        # the profiler pass profiles the placements group 0 timed (its closures and copies)
        self.kept[ctx.case.id] = ([b.launch for b in ctx.builts], list(ctx.held))

    def after_all(self, ctx: AfterAll) -> None:
        by_id = {c.id: c for c in ctx.cases}
        pipe = ctx.pipeline
        for rec in ctx.records:
            case = by_id.get(rec.case_id)
            if case is None or rec.status != "ok" or rec.timing.get("median_us") is None:
                continue
            try:
                fns, held = self.kept.pop(rec.case_id, (None, None))  # held: the copies fns read
                if fns is None:  # resumed or timed elsewhere: the case's input sets
                    fns = pipe.launches(case)
                    mine = rec.timing["median_us"]
                else:  # against the same placements: with placement groups, group 0's median
                    mine = group_medians(rec)[0]
                v = _timing().profiler_kernel_us(fns, pipe.launches_per_graph(case))
                if v is not None:
                    rec.cross["kernel_us"] = round(v, 4)
                    rec.cross["node_gap_us"] = round(mine - v, 4)
            except Exception as e:  # noqa: BLE001
                rec.cross["cross_error"] = one_line(e)

    def release(self) -> None:
        self.kept.clear()



@register
class Counters(Pass):
    """Hardware counters per case (moebench.core.counters): after all timing, a child process under
    Nsight Compute re-creates the timed cases from data, replays each one's launch once in a CUDA
    graph, and each record gets its measured occupancy, traffic, instructions, a bound verdict and
    the work-model check. It never touches the timings (they are done, and the child is another
    process). Where counters cannot be had (the interpreter, no ncu, no counter permission) every
    record says so in one line and the run goes on: the pass is not refused on the CPU."""

    name = "counters"
    cuda_only = False  # unavailable, not refused: the columns say what is missing
    in_workers = True  # its after_all runs in the driver's process and needs nothing a worker kept
    announce = "counters pass (Nsight Compute: one graph replay per case, in a child process)"

    def after_all(self, ctx: AfterAll) -> None:
        try:
            counters.collect(ctx.spec, ctx.device, ctx.cases, ctx.records, l2=getattr(ctx.options.timing, "l2", "warm"),
                    environ=ctx.environ, plugins=[p["path"] for p in plugins.loaded() if "suffix" not in p])
        except Exception as e:  # noqa: BLE001 - the timings stand; every record says what went wrong
            for rec in ctx.records:
                if rec.status == "ok" and "verdict" not in rec.cross:
                    rec.cross["counters"] = {"unavailable": f"the counters pass failed: {type(e).__name__}: "
                                                            f"{one_line(e)}"}
