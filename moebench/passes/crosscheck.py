"""The cross-check timers as passes: triton's do_bench_cudagraph (`dobench`), NVIDIA's nvbench
(`nvbench`) and the PyTorch profiler's kernel time (`profiler`), each over the closures or graphs
moebench itself timed, each record getting the other timer's number and its difference to ours.
The timers themselves are in moebench.passes.timers (torch), imported when a pass first runs."""

from __future__ import annotations

from moebench.core.passes import AfterAll, CaseDone, Pass, register
from moebench.core.placements import group_medians
from moebench.core.stats import mean
from moebench.core.text import one_line


def _timers():
    """moebench.passes.timers (torch and triton), imported when a pass first runs: the driver loads
    the passes for every run, a host-only family's too, which imports no torch."""
    from moebench.passes import timers

    return timers



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
            v = _timers().dobench_cudagraph_us(all_sets) / len(fns)
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
        why = _timers().nvbench_unavailable()
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
        timers = _timers()
        items = [timers.NvbenchItem(lambda gs=k["graphs"]: [g.replay() for g in gs], k["launches"] * len(k["graphs"]))
                 for _, k in todo]
        try:
            results = timers.nvbench_graphs(items, timers.torch.cuda.current_device()) if items else []
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
                v = _timers().profiler_kernel_us(fns, pipe.launches_per_graph(case))
                if v is not None:
                    rec.cross["kernel_us"] = round(v, 4)
                    rec.cross["node_gap_us"] = round(mine - v, 4)
            except Exception as e:  # noqa: BLE001
                rec.cross["cross_error"] = one_line(e)

    def release(self) -> None:
        self.kept.clear()
