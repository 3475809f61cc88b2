"""Where a case's buffers live while it is timed (`Placements`), the case timer (`Timer`), and the
floors a number is read against (`floors`, `occupancy`). Torch is imported only where memory is
allocated or a case is timed, on a GPU.
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from moebench.core.device import nvml_clocks
from moebench.core.noise import NoiseChoice, for_timer
from moebench.core.records import Record
from moebench.core.stats import between_groups_rel, mean, median, noise_below, summarize


class Placements:
    """The memory placements of a case's input sets (timing.placements, placement_copies,
    placement_memory, placement_strata/stride, l2)."""

    def __init__(self, timing, device, *, time_it: bool, impl=None):
        self.timing = timing
        self.device = device
        self.time_it = time_it
        self.impl = impl  # the family's kernels module (input_bytes, touched_bytes)
        self.torch_device = "cuda" if getattr(device, "backend", None) == "cuda" else "cpu"

    def _touched(self, params: dict) -> int:
        touched = getattr(self.impl, "touched_bytes", self.impl.input_bytes)
        return max(1, touched(params))

    def n_sets(self, params: dict) -> int:
        """How many independently allocated input/output sets the graph rotates through.

        cold: enough sets that their total exceeds `cold_l2_multiple` x L2, so each launch reads
        from DRAM. warm: `placements` sets (default 8) as long as they all stay L2-resident: a tiny
        output (32 int32 counters, one 128-byte line) lives in one L2 slice, which slice moves a
        launch-bound atomic kernel from run to run, and rotating several placements averages that
        out inside every graph."""
        t = self.timing
        if not self.time_it or not self.device.l2_bytes:
            return 1
        per = self._touched(params)
        if t.l2 == "cold":
            return max(2, min(512, math.ceil(t.cold_l2_multiple * self.device.l2_bytes / per)))
        return max(1, min(t.placements, (self.device.l2_bytes // 2) // per))

    @contextmanager
    def _placement(self, index: int = 0):
        """Where the next allocations go: torch's caching allocator, or (timing.placement_memory:
        private, on a GPU) a memory pool of their own, yielded so the caller keeps it alive as
        long as its tensors."""
        # untimed (verify): placements do not matter, and a pool used from the background threads
        # that build verify's inputs trips torch's allocator when the pools are freed
        if self.timing.placement_memory != "private" or self.torch_device != "cuda" or not self.time_it:
            yield None
            return
        import torch

        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError("timing.placement_memory: private needs torch.cuda.MemPool (torch >= 2.6)")
        t = self.timing
        k = index % max(1, t.placement_strata)
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            # the pad takes the front of the pool's first (2 MiB) segment; the set's small buffers
            # follow it, k strides further on than in an unpadded pool (timing.placement_strata)
            pad = torch.empty(k * t.placement_stride, dtype=torch.uint8, device="cuda") if k and t.placement_stride else None
            yield pool if pad is None else (pool, pad)

    def copy_set(self, inp, index: int) -> tuple[Any, Any]:
        """A copy of an input set in fresh memory (views kept as views): the same data at another
        placement, the `index`-th of its rotation. Returns (copy, its pool or None)."""
        with self._placement(index) as pool:
            return copy.deepcopy(inp), pool

    def copies(self, params: dict, sets: list) -> list:
        """timing.placement_copies - 1 copies of every warm set in fresh memory, (copy, pool) each,
        as many as keep the whole rotation inside half the L2 (the warm budget)."""
        t = self.timing
        if t.placement_copies <= 1 or t.l2 != "warm" or not self.device.l2_bytes:
            return []
        fit = (self.device.l2_bytes // 2) // self._touched(params)
        per_set = max(1, min(t.placement_copies, fit // max(1, len(sets))))
        copies = [s for s in sets for _ in range(per_set - 1)]
        return [self.copy_set(s, len(sets) + j) for j, s in enumerate(copies)]


# ----------------------------------------------------------------------------------- the timer


@dataclass
class Retimed:
    """A case's SM clock ended below timing.clock_drop of the maximum: it is timed again."""

    case: Any
    attempt: int
    sm_mhz: int | None


@dataclass
class Timed:
    """What timing a case leaves behind for the passes: group 0's closures, the graphs the timer
    kept (when a pass asked for them) and the copies those graphs read."""

    builts: list
    graphs: list = field(default_factory=list)
    held: list = field(default_factory=list)  # (copy, pool) of group 0's copies and the kept groups'
    launches_per_graph: int = 0
    estimate_us: float = 0.0  # the record's median_us before rounding: what the floors are read from


class Timer:
    """Times one case's launch closures under CUDA-graph replay (moebench.core.timing.time_groups)
    and writes the record's `timing`: the estimate, its noise, the clocks, the L2 note. The stated
    half-width adds the run-to-run term of the noise model in force (timing.noise) in quadrature.

    `time_groups`, `clocks` (NVML's SM clock of GPU `clock_index`) and `sleep` are injected; the
    defaults are the real ones."""

    def __init__(self, timing, placements: Placements, *, clock_index: int = 0,
                 time_groups: Callable | None = None, clocks: Callable[[int], Mapping] = nvml_clocks,
                 sleep: Callable[[float], None] = time.sleep):
        self.timing = timing
        self.placements = placements
        self.clock_index = clock_index  # NVML's number for this GPU (a per-GPU worker sets its own)
        self._time_groups = time_groups
        self.clocks = clocks
        self.sleep = sleep
        self._noise: NoiseChoice | None = None

    def noise(self) -> NoiseChoice:
        """The noise model in force (timing.noise, resolved once: moebench.core.noise.for_timer)."""
        if self._noise is None:
            self._noise = for_timer(self.timing, getattr(self.placements, "device", None))
        return self._noise

    def time(self, case, rec: Record, builts: list, *, launches_per_graph: int, rebuild=None,
             sets: list | None = None, held: list | None = None, keep_graphs: bool = False,
             on_retime: Callable[[Retimed], None] | None = None) -> Timed:
        """Time a case: one graph over the rotation of `builts` (timing.groups 1), or one graph per
        placement group, group g > 0 over fresh copies of `sets` (the inputs of `builts`) with
        closures from `rebuild`. `held`: copies group 0 reads, kept alive with its graph.
        `keep_graphs`: keep the captured graphs (and what they read) for a pass."""
        if self._time_groups is None:
            from moebench.core.timing import time_groups  # torch: the timer runs on a GPU only
        else:
            time_groups = self._time_groups
        t = self.timing
        g_min = max(1, t.groups)
        # one group is the single-graph timer: no interval between groups to grow it by
        g_max = max(g_min, t.max_groups or g_min) if g_min > 1 else 1
        copies: list = list(held or [])  # the copies (and pools) the graphs read: alive while they are

        def make_group(g: int) -> list:
            if g == 0:
                return [b.launch for b in builts]
            made = [self.placements.copy_set(s, i) for i, s in enumerate(sets)]
            copies.append(made)
            return [rebuild(c).launch for c, _ in made]

        def enough(groups: list[list[float]]) -> bool:
            return between_groups_rel([median(x) for x in groups]) < t.groups_rel_noise

        retimed = 0
        while True:
            clk0 = self.clocks(self.clock_index)
            samples = time_groups(make_group, min_groups=g_min, max_groups=g_max,
                                  launches_per_graph=launches_per_graph, warmup=t.warmup,
                                  min_replays=t.min_replays, max_replays=t.max_replays, max_seconds=t.max_seconds,
                                  stop=noise_below(t.target_rel_noise), enough=enough if g_max > g_min else None,
                                  keep=keep_graphs)
            clk1 = self.clocks(self.clock_index)
            dropped = (clk1.get("sm_max_mhz") and clk1.get("sm_mhz") is not None
                       and clk1["sm_mhz"] < t.clock_drop * clk1["sm_max_mhz"])
            if not dropped or retimed >= t.clock_retries:
                break
            retimed += 1
            if on_retime is not None:
                on_retime(Retimed(case, retimed, clk1.get("sm_mhz")))
            self.sleep(1.0)  # let the clock recover, then time the case again
        if retimed:
            rec.timing["clock_retimed"] = retimed
        s = summarize(samples.per_launch_us)
        estimate, rel_noise = s.median_us, s.rel_noise
        n_groups = len(samples.groups)
        l2_note = f"{t.l2} ({len(builts)} set{'s' if len(builts) > 1 else ''})"
        if n_groups > 1 or t.placement_memory != "caching" or held:
            l2_note = (f"{t.l2} ({len(builts)} placement{'s' if len(builts) > 1 else ''}"
                       + (f" x {n_groups} groups" if n_groups > 1 else "") + f", {t.placement_memory} memory)")
        rec.timing.update({"timer": "graph-replay", "l2": l2_note})
        if n_groups > 1:
            meds = [median(g) for g in samples.groups]
            between = between_groups_rel(meds)
            estimate, rel_noise = mean(meds), max(between, s.rel_noise)
        # the run-to-run term: the measured model's for this case when one is in force (never below
        # timing.rerun_rel), else timing.rerun_rel (moebench.core.noise)
        rerun, which = self.noise().term(getattr(case, "id", None), t.rerun_rel)
        within, rel_noise = rel_noise, math.hypot(rel_noise, rerun)
        rec.timing.update({
            "median_us": round(estimate, 4),
            "min_us": round(s.min_us, 4), "max_us": round(s.max_us, 4), "q1_us": round(s.q1_us, 4),
            "q3_us": round(s.q3_us, 4), "iqr_us": round(s.iqr_us, 4), "rel_noise": round(rel_noise, 5),
            "rel_noise_within": round(within, 5), "rerun_rel": round(rerun, 5), "noise_model": which,
            "n_replays": s.n, "launches_per_graph": samples.launches_per_graph,
            "stopped_by": samples.stopped_by, "timing_wall_s": round(samples.wall_s, 3),
            "sm_clock_start_mhz": clk0["sm_mhz"], "sm_clock_end_mhz": clk1["sm_mhz"],
        })
        if n_groups > 1:
            rec.timing.update({"estimator": "mean of group medians", "groups": n_groups,
                               "group_medians_us": [round(m, 4) for m in meds],
                               "between_groups_rel": round(between, 5)})
        mx = clk1.get("sm_max_mhz")
        if mx and clk1["sm_mhz"] is not None:
            rec.timing["clock_ok"] = clk1["sm_mhz"] >= t.clock_drop * mx
        graphs = list(samples.graphs) if keep_graphs else []
        if keep_graphs:
            del copies[len(held or []) + len(graphs) - 1:]  # those of the graphs not kept
        else:
            copies = list(held or [])
        return Timed(builts, graphs, copies, samples.launches_per_graph, estimate)


def group_medians(rec: Record) -> list[float]:
    """The per-graph medians of a timed record (its one median for the single-graph timer)."""
    return rec.timing.get("group_medians_us") or [rec.timing["median_us"]]


# ----------------------------------------------------------------------------------- floors


def floors(rec: Record, median_us: float, n_sets: int, ceilings: Mapping[str, Any], device, timing) -> None:
    """The record's floors: its bytes at the copy ceiling of the level it was timed against (L2 when
    the whole rotation of `n_sets` fits in it, warm), and the empty-kernel launch."""
    c = ceilings
    w = rec.work
    if not c:
        return
    nbytes = w.get("bytes")
    if nbytes:
        # warm: read against the L2 copy ceiling when the whole rotation fits in L2, else DRAM
        sets = n_sets
        fits = timing.l2 == "warm" and device.l2_bytes and nbytes * sets <= device.l2_bytes
        level = "l2" if fits else "dram"
        bw = c.get(f"copy_{level}_gbps")
        w["gbps"] = round(nbytes / (median_us * 1e-6) / 1e9, 1)
        if bw:
            w["floor_level"] = level
            w["floor_us"] = round(nbytes / (bw * 1e9) * 1e6, 4)
            w["x_floor"] = round(median_us / w["floor_us"], 2) if w["floor_us"] > 0 else None
            if level == "l2" and c.get("copy_dram_gbps"):
                w["dram_floor_us"] = round(nbytes / (c["copy_dram_gbps"] * 1e9) * 1e6, 4)
            if w["x_floor"] is not None and w["x_floor"] < 1:
                w["floor_note"] = (f"below the {level.upper()} copy floor: {nbytes * sets / 2**20:.0f} MiB "
                                   f"touched per rotation vs {device.l2_bytes / 2**20:.0f} MiB L2, so part "
                                   "of it stays L2-resident across warm replays")
    empty = c.get("empty_sms_us") if w.get("ctas", 1) > 1 else c.get("empty_us")
    if empty:
        w["empty_us"] = round(empty, 4)
        w["x_empty"] = round(median_us / empty, 2)
        w["over_empty_us"] = round(median_us - empty, 4)
        if w.get("floor_us"):
            # a launch cannot beat its own empty launch: the floor a small kernel can reach
            # is an empty kernel plus its bytes at the copy ceiling
            w["floor_plus_empty_us"] = round(w["floor_us"] + empty, 4)
            w["x_floor_plus_empty"] = round(median_us / w["floor_plus_empty_us"], 2)


def occupancy(w: dict, device) -> None:
    """Arithmetic occupancy of a launch: its threads against the device's thread capacity, and waves."""
    d = device
    if "ctas" in w and "threads_per_cta" in w:
        cap = d.sm_count * d.max_threads_per_sm
        w["thread_capacity"] = cap
        w["occupancy_pct"] = round(100.0 * min(cap, w["ctas"] * w["threads_per_cta"]) / cap, 1)
        per_wave = d.sm_count * max(1, d.max_threads_per_sm // w["threads_per_cta"])
        w["waves"] = round(w["ctas"] / per_wave, 2)
