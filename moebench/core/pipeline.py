"""The case pipeline: one case from its spec values to its Record, the steps of docs/method.md,
'A case'. `CasePipeline.run_case` runs one case for the run driver (moebench.core.driver); it never
prints. A case that fails is recorded with its error and the run goes on; a case whose kernel
source is missing is `unavailable`, with what to install. Under the interpreter a kernel that names
something undefined fails its case (a GPU would not compile it), and a checked launch that ran no
program is `vacuous`.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from moebench.core.cases import Case, baseline_case, shape_key
from moebench.core.device import DeviceInfo
from moebench.core.family import Check
from moebench.core.passes import CaseDone, Pass
from moebench.core.placements import Placements, Timer, floors, occupancy
from moebench.core.records import Record
from moebench.core.spec import Spec, Timing
from moebench.core.text import one_line
from moebench.tritonpatch import launches, specializations, undefined_names
from moebench.errors import Unavailable
from moebench.sources.plugins import time_limit, user_code, where_in_plugin

# Each shape's checked input set (set 0) is copied as built, so that what one variant does to it (a
# store past its output into the poisoned guard cells, a write into an input) is undone before the
# next variant and blamed on the variant that did it. Up to this many bytes of copies, smallest
# storages first: the guard buffers and small inputs always; past it, a shape's largest inputs go
# unchecked (a 48-layer step's expert weights).
PRISTINE_MAX_BYTES = 2 << 30


@dataclass
class Options:
    timing: Timing
    time_it: bool = True  # False: correctness only (interpreter, or `verify`)
    cross: tuple[str, ...] = ()  # the passes asked for (--cross-check), by name
    ceilings: dict[str, Any] = field(default_factory=dict)
    traceback: bool = False  # keep the traceback in a failed record's error
    # under the interpreter, a case still running after this many seconds is stopped and recorded as
    # an error (a grid of a million programs runs one program at a time there); None: no limit
    case_limit_s: float | None = None


# ----------------------------------------------------------------------------------- resolving


def check_environment(spec: Spec, cases: list[Case], device: DeviceInfo, environ: Mapping[str, str],
                      resolve_case: Callable[[Case], tuple[dict, dict]] | None = None) -> None:
    """Resolve one case of each variant (and the baseline launch) up front, so a malformed
    kill-switch variable stops a run before its first case (UsageError naming the variable and
    its accepted values), not as a failure in every case. Every switch of the family is checked,
    read by this run's variants or not: each is part of the settings a record is resumed under.
    Torch-free: it only resolves. `resolve_case` (a CasePipeline's) keeps what it resolved, so those
    cases are not resolved again when they run."""
    resolve_case = resolve_case or (lambda c: spec.family.resolve(c.variant, c.params, device, environ, c.origins))
    seen = set()
    for c in cases:
        if c.variant not in seen:
            seen.add(c.variant)
            resolve_case(c)
    if spec.baseline and cases:
        resolve_case(baseline_case(spec, cases[0]))
    for v in spec.family.variants.values():
        if v.env and v.name not in seen and cases:
            spec.family.resolve(v.name, dict(cases[0].params), device, environ)


def _torch():
    """torch, imported when a case first needs it: the run driver also runs host-only families,
    whose runs import no torch."""
    import torch

    return torch


class CaseTimeLimit(Exception):
    """A case ran past Options.case_limit_s under the interpreter."""


def case_error(e: BaseException) -> str:
    """A failed case's error as one line: the exception (the case limit, where the interpreter
    wrapped it in its own), and where in a plugin's file it was raised (FILE:LINE) when it was. A
    sys.exit() or os._exit() in a builder, launch, input builder or reference is that case's error."""
    at = where_in_plugin(e)
    at = f" (at {at})" if at else ""
    if isinstance(e, SystemExit):
        return (f"SystemExit: the case called {getattr(e, 'how', 'sys.exit')}({e.code!r}){at} (in its variant's "
                "builder or launch, or its family's inputs or reference); a variant returns or raises, it does not "
                "end the run")
    limit = e
    while limit is not None and not isinstance(limit, CaseTimeLimit):  # the interpreter wraps what it met
        limit = limit.__cause__ or limit.__context__
    e = limit or e
    return f"{type(e).__name__}: {one_line(e)}{at}"


# ----------------------------------------------------------------------------------- the pipeline


class CasePipeline:
    """Runs cases one at a time (`run_case`), keeping each shape's inputs, reference and baseline
    output for the cases that share them. `environ`: the kill switches (None: a copy of os.environ
    now); `timer`: the case timer (a Timer over this pipeline's placements by default); `passes`:
    pass instances whose per-case hooks run right after each timed case; `clock`: the wall clock of
    compile accounting and phases."""

    def __init__(self, spec: Spec, device: DeviceInfo, options: Options, environ: Mapping[str, str] | None = None, *,
                 timer: Timer | None = None, passes: tuple[Pass, ...] | list[Pass] = (),
                 clock: Callable[[], float] = time.perf_counter):
        self.spec = spec
        self.fam = spec.family
        self.device = device
        self.opts = options
        self.environ = dict(os.environ) if environ is None else environ
        self.torch_device = "cuda" if device.backend == "cuda" else "cpu"
        self.impl = None if self.fam.host_only else self.fam.load()
        self.placements = Placements(options.timing, device, time_it=options.time_it, impl=self.impl)
        self.timer = timer if timer is not None else Timer(options.timing, self.placements)
        self.passes = list(passes)
        self.keep_graphs = any(p.keeps_graphs for p in self.passes)
        self.clock = clock
        self._inputs: dict[tuple, list] = {}  # shape key -> input sets
        self._pools: dict[tuple, list] = {}  # shape key -> the memory pools of those sets (private placements)
        self._pristine: dict[tuple, _Pristine] = {}  # shape key -> set 0 as built (undo what a variant did)
        self._ref: dict[tuple, Any] = {}
        self._base: dict[tuple, Any] = {}
        self._ahead: dict[tuple, Any] = {}  # shape key -> Future of (sets, pools, reference, pristine copy), built ahead
        self._abandon: Callable[[Any], None] | None = None  # told of a background build given up at the case limit
        self._compiled: set[tuple] = set()
        self._resolved: dict[tuple, tuple[dict, dict]] = {}  # (case id, origins) -> resolve's (params, sources)
        self.compile_s_total = 0.0
        self.events: list = []  # Retimed events of the case running, for the driver to hand on
        self.phases: dict[str, float] = defaultdict(float)  # wall seconds per phase of the cases
        self._phase_lock = threading.Lock()

    @property
    def jit_specializations(self) -> int:
        return len(self._compiled)

    def run_case(self, case: Case) -> Record:
        rec = Record(self.spec.name, self.fam.name, case.id, case.variant, case.label, "ok",
                     params={k: v for k, v in case.params.items()})
        try:
            with user_code():  # an os._exit in a builder, launch, input builder or reference: this case's error
                params, sources = self.resolve(case)
                rec.launch = {k: params[k] for k in sources}
                rec.launch_from = sources
                if self.fam.host_only:
                    rec.work = self.fam.builder(case.variant)(params)
                    return rec
                limit = self.opts.case_limit_s if self.device.backend == "interpret" else None
                with time_limit(limit, lambda: CaseTimeLimit(
                        f"still running after {limit:g} s under the Triton interpreter (--case-limit); shrink the "
                        "shape or raise the limit"), every=1.0):
                    self._kernel_case(case, params, rec)
        except KeyboardInterrupt:
            raise
        except Unavailable as e:
            rec.status = "unavailable"
            rec.error = str(e)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - a failing case is recorded; the sweep goes on
            rec.status = "error"
            rec.error = case_error(e)
            if self.opts.traceback:
                rec.error += "\n" + traceback.format_exc()
        return rec

    # ------------------------------------------------------------------ inputs & references

    def inputs(self, case: Case) -> list:
        key = shape_key(case, self.fam.shape_params)
        n = self.placements.n_sets(case.params)
        have = self._inputs.get(key)
        if (have is None or len(have) < n) and key in self._ahead:
            ahead = self._ahead.pop(key)
            try:
                sets, pools, ref, pristine = ahead.result()  # (the caller's "inputs" phase holds the wait)
            except CaseTimeLimit:  # stuck in the background (a plugin's input builder that hangs): leave it
                if self._abandon is not None:
                    self._abandon(ahead)
                raise
            self._keep_inputs(key, sets, pools, pristine)
            if ref is not None:
                self._ref.setdefault(key, ref)
            have = sets
        if have is None or len(have) < n:
            sets, pools = self._build_sets(case, n)
            self._keep_inputs(key, sets, pools)
        return self._inputs[key][:n]

    def _keep_inputs(self, key: tuple, sets: list, pools: list, pristine: "_Pristine | None" = None) -> None:
        if len(self._inputs) > 4:  # keep memory bounded: inputs are rebuilt on demand
            self._inputs.clear()
            self._pools.clear()
            self._pristine.clear()
        self._inputs[key] = sets
        self._pools[key] = pools
        self._pristine[key] = pristine or _Pristine(sets[0], PRISTINE_MAX_BYTES)  # before any variant touched it

    def _build_sets(self, case: Case, n: int) -> tuple[list, list]:
        """`n` input sets of a case's shape, each in its own memory pool with private placements."""
        self._check_memory(case, n)
        sets, pools = [], []
        for i in range(n):
            with self.placements._placement(i) as pool:
                sets.append(self.impl.build_inputs(case.params, self.torch_device, i))
            pools.append(pool)
        return sets, pools

    def _build_shape(self, case: Case) -> tuple[list, list, Any, "_Pristine"]:
        """A shape's input sets, its reference and the copy of set 0 as built, for the background
        (moebench.core.prefetch), with os._exit an error there too (user_code)."""
        with self._phase("inputs + reference (background threads)"), user_code():
            sets, pools = self._build_sets(case, self.placements.n_sets(case.params))
            pristine = _Pristine(sets[0], PRISTINE_MAX_BYTES)
            if self.fam.reference_after_build:
                return sets, pools, None, pristine
            return sets, pools, self.impl.reference(sets[0], case.params), pristine

    def resolve(self, case: Case) -> tuple[dict, dict]:
        """The case's launch values and their sources (FamilySpec.resolve with this run's
        environment), resolved once per case: the up-front check, the case itself and the baseline
        launch of its shape all read the same resolution."""
        key = (case.id, tuple(sorted((case.origins or {}).items())))
        if key not in self._resolved:
            self._resolved[key] = self.fam.resolve(case.variant, case.params, self.device, self.environ, case.origins)
        params, sources = self._resolved[key]
        return dict(params), dict(sources)

    def forget(self, key: tuple) -> None:
        """Drop a shape's inputs, reference and baseline output (after its last case)."""
        for d in (self._inputs, self._pools, self._ref, self._base, self._pristine):
            d.pop(key, None)

    @contextmanager
    def _phase(self, name: str):
        t0 = self.clock()
        try:
            yield
        finally:
            dt = self.clock() - t0
            with self._phase_lock:
                self.phases[name] += dt

    def free_memory(self) -> tuple[int, str]:
        """Free bytes where this run's inputs go (the GPU, or this host under the interpreter), and
        where that is."""
        if self.torch_device == "cuda":
            return _torch().cuda.mem_get_info()[0], self.device.name
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this host (interpreter run)"

    def _check_memory(self, case: Case, n_sets: int) -> None:
        """Refuse a case whose inputs would not fit, before allocating anything."""
        per = self.impl.input_bytes(case.params)
        need = per * n_sets + min(per, PRISTINE_MAX_BYTES)  # and the copy of set 0 as built (_Pristine)
        free, where = self.free_memory()
        if need > 0.8 * free:
            raise MemoryError(f"would not fit: needs ~{need / 2**30:.2f} GiB of inputs, {free / 2**30:.2f} GiB "
                              f"free on {where}; shrink the shape")

    def reference(self, case: Case, inp) -> Any:
        key = shape_key(case, self.fam.shape_params)
        if key not in self._ref:
            self._ref[key] = self.impl.reference(inp, case.params)
        return self._ref[key]

    def baseline_output(self, case: Case, inp) -> Any:
        """Output of the spec's baseline launch on the same inputs (run once per shape)."""
        key = shape_key(case, self.fam.shape_params)
        if key not in self._base:
            base = baseline_case(self.spec, case)
            params, _ = self.resolve(base)
            built = self.fam.build(base.variant, inp, params, self.device)
            self._first_launch(built)
            self._base[key] = built.output.clone()
        return self._base[key]

    def launches(self, case: Case) -> list:
        """The launch closures of a case over its input sets (for a pass that profiles a case it did
        not see timed: a resumed one)."""
        params, _ = self.resolve(case)
        return [self.fam.build(case.variant, s, params, self.device).launch for s in self.inputs(case)]

    # ------------------------------------------------------------------ launching

    def _sync(self) -> None:
        if self.torch_device == "cuda":
            _torch().cuda.synchronize()

    def _first_launch(self, built) -> float | None:
        """Reset and run once: the launch whose output is checked, and the one that compiles a new
        JIT specialization, so compiling stays out of any timing. Returns the seconds of this
        launch when Triton prepared a new specialization in it (compile time plus one run of the
        kernel), else None. Triton says which (moebench.tritonpatch.specializations)."""
        built.reset()
        with specializations() as new:
            t0 = self.clock()
            built.launch()
            self._sync()
            dt = self.clock() - t0
        if new:
            self._compiled.update(new)
            self.compile_s_total += dt
            return dt
        return None

    # ------------------------------------------------------------------ one case

    def _kernel_case(self, case: Case, params: dict, rec: Record) -> None:
        def build(inputs):
            return self.fam.build(case.variant, inputs, params, self.device)

        key = shape_key(case, self.fam.shape_params)
        with self._phase("inputs"):
            sets = self.inputs(case)
        inp = sets[0]
        pristine = self._pristine.get(key)
        fresh = (key not in self._ref, key not in self._base)  # what this case computes from the inputs
        if pristine is not None:  # as built: guard cells poisoned, inputs as drawn, whatever ran before
            with self._phase("check"):
                pristine.restore()
        if not self.fam.reference_after_build:
            with self._phase("reference"):
                expected = self.reference(case, inp)
        with self._phase("build closures"):
            built = build(inp)
        # after the build: a family's reference may read what its builder prepared (the layer's
        # activation-alone scope reads the FC1 output the step wrote)
        if self.fam.reference_after_build:
            with self._phase("reference"):
                expected = self.reference(case, inp)
        rec.launch.update(built.geometry)
        rec.launch_from.update(built.launch_from)
        inexact = built.inexact  # why this launch cannot equal the baseline bit for bit

        # checked launch: reset/poison, one launch (it also compiles, outside any timing), then
        # compare to torch, right away (the guard cells are the variant's alone), and to the
        # baseline launch on the same inputs (which reuses them, so the output is copied first)
        with self._phase("compile + checked launch"), launches() as ran:
            compile_s = self._first_launch(built)
        rec.timing["compile_s"] = round(compile_s, 4) if compile_s is not None else None
        for fn, _ in ran:  # under the interpreter: a kernel a GPU would refuse to compile fails here too
            for name, line in undefined_names(fn)[:1]:
                raise NameError(f"kernel {fn.__qualname__} reads {name!r} at {fn.__code__.co_filename}:{line}, "
                                "which is not defined: it would not compile (the Triton interpreter runs a line "
                                "only when it is reached, and this case never reached it)")
        with self._phase("check"):
            out = built.output
            chk: Check = self.impl.check(inp, out, expected, case.params)
            rec.checks["ref_check"] = chk.detail
            vacuity = self.impl.nonvacuity(inp, out, case.params)
            mine = out.clone() if self.spec.baseline and not inexact else None
            damage = self._damage(pristine, built, key, fresh)  # before the baseline launch reads the inputs
        if mine is not None:
            with self._phase("baseline launch"):
                base = self.baseline_output(case, inp)
            with self._phase("check"):
                rec.checks["baseline_equal"] = bool(_torch().equal(mine, base))
        elif inexact:
            rec.checks["baseline_equal"] = None
            rec.checks["baseline_skipped"] = inexact
        rec.checks.update(vacuity)
        if chk.ok and ran and not any(n for _, n in ran):
            rec.checks["ref_check"] = "vacuous"
            rec.status, rec.error = "mismatch", (
                f"vacuous: the launch ran no program of {', '.join(sorted({f.__qualname__ for f, _ in ran}))} (a grid "
                "of 0), so its output equals the reference without the kernel doing anything; size the grid from "
                "the capacity, not from the count of this step")
        elif not chk.ok or rec.checks.get("baseline_equal") is False or damage:
            rec.status = "mismatch"
            rec.error = (chk.detail if not chk.ok else damage if damage else
                         "differs from the baseline launch (torch.equal)")
            if damage:
                rec.checks["inputs_intact"] = False

        rec.work = self.fam.work_model(case.variant, self.impl)(case.params, built.geometry, self.device)
        occupancy(rec.work, self.device)
        if not self.opts.time_it:
            self._after_case(CaseDone(case, rec, [built], False))
            return
        with self._phase("placement copies"):
            copies = self.placements.copies(case.params, sets)
        rotation = sets + [c for c, _ in copies]
        with self._phase("build closures"):
            builts = [built] + [build(s) for s in rotation[1:]]
        with self._phase("timing"):
            self._time(case, rec, builts, build, rotation, copies)
        with self._phase("check"):
            damage = self._damage(pristine, built, key, (False, False))  # what the timed launches did
        if damage and rec.status == "ok":
            rec.status, rec.error = "mismatch", f"while timed: {damage}"
            rec.checks["inputs_intact"] = False

    def _damage(self, pristine: "_Pristine | None", built, key: tuple, fresh: tuple[bool, bool]) -> str:
        """What the variant's launches did to its input set besides writing its output, as the
        record's error ("" if nothing), the set restored for the baseline launch and the next
        variant. A reference or baseline output this case computed from the damaged inputs is
        dropped, so the next case computes it again."""
        if pristine is None:
            return ""
        what = pristine.damage(built.output, getattr(self.impl, "WORKSPACE", ()))
        if what:
            pristine.restore()
            for made, store in zip(fresh, (self._ref, self._base)):
                if made:
                    store.pop(key, None)
        return what

    def _time(self, case: Case, rec: Record, builts: list, rebuild, sets: list, held: list) -> None:
        """Time the case (the Timer), read it against its floors, then run the passes' per-case hooks
        on what the timing left (group 0's closures, the graphs kept for a pass)."""
        timed = self.timer.time(case, rec, builts, launches_per_graph=self.launches_per_graph(case), rebuild=rebuild,
                                sets=sets, held=held, keep_graphs=self.keep_graphs, on_retime=self.events.append)
        floors(rec, timed.estimate_us, len(builts), self.opts.ceilings, self.device, self.opts.timing)
        self._after_case(CaseDone(case, rec, timed.builts, True, timed.graphs, timed.held,
                                  self._pools.get(shape_key(case, self.fam.shape_params)), timed.launches_per_graph))

    def _after_case(self, ctx: CaseDone) -> None:
        """The passes' per-case hooks. What they do not keep goes when the case returns."""
        for p in self.passes:
            p.after_case(ctx)

    def launches_per_graph(self, case: Case) -> int:
        """The spec's launches per graph, or fewer where the family says one launch is long (a
        whole layer step): a replay of many such launches would take seconds."""
        n = self.opts.timing.launches_per_graph
        if self.fam.graph_launches is not None:
            n = max(1, min(n, self.fam.graph_launches(case.params, n)))
        return n


def _tensors(obj, name: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(field name, tensor) for every tensor an input set holds: its dataclass fields or attributes,
    and the items of its lists, tuples and dicts, three levels down."""
    if isinstance(obj, _torch().Tensor):
        yield name or "inputs", obj
        return
    if depth > 3 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).items())
    else:
        return
    for k, v in items:
        yield from _tensors(v, f"{name}.{k}" if name and not k.startswith("[") else f"{name}{k}", depth + 1)


class _Pristine:
    """A shape's checked input set as built: a copy of the bytes of each memory storage its tensors
    view (a counter view and its guard cells share one), smallest first up to `budget` bytes.
    `restore` puts them back; `damage` says what a launch changed besides its output."""

    def __init__(self, inp, budget: int):
        torch = _torch()
        storages: dict[tuple, tuple[Any, list[str]]] = {}
        for name, t in _tensors(inp):
            st = t.untyped_storage()
            if st.nbytes():
                storages.setdefault((str(st.device), st.data_ptr()), (st, []))[1].append(name)
        self.items: list[tuple[list[str], Any, Any]] = []  # (field names, the live bytes, their copy)
        used = 0
        for st, names in sorted(storages.values(), key=lambda e: e[0].nbytes()):
            if used + st.nbytes() > budget:
                break
            live = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)
            self.items.append((names, live, live.clone()))
            used += st.nbytes()

    def restore(self) -> None:
        for _, live, copy in self.items:
            live.copy_(copy)

    def damage(self, output, workspace: tuple[str, ...] = ()) -> str:
        """What differs from the set as built, outside the launch's output and the family's
        `workspace` fields (tensors its launches write besides the output, e.g. the layer's
        scratch): bytes of the output's buffer around it (its guard cells), and other storages
        (the variant's inputs). "" when nothing did."""
        torch = _torch()
        outs = {}  # storage pointer -> (first byte, end byte) the output may write
        for _, t in _tensors(output):
            st = t.untyped_storage()
            lo = t.storage_offset() * t.element_size()
            span = (lo, lo + t.numel() * t.element_size()) if t.is_contiguous() else (0, st.nbytes())
            outs[st.data_ptr()] = span
        inputs, outside = [], []
        for names, live, copy in self.items:
            ptr = live.untyped_storage().data_ptr()
            if ptr in outs:
                lo, hi = outs[ptr]
                if not (torch.equal(live[:lo], copy[:lo]) and torch.equal(live[hi:], copy[hi:])):
                    outside.append(names[0])
            elif not any(n.split(".")[0].split("[")[0] in workspace for n in names):
                if not torch.equal(live, copy):
                    inputs.append(" / ".join(names))
        what = []
        if outside:
            what.append(f"wrote outside its output (into the guard cells of {', '.join(outside)})")
        if inputs:
            what.append(f"changed its input{'s' if len(inputs) > 1 else ''} {', '.join(inputs)} (a launch may write "
                        "only its output; restored for the other variants)")
        return "; ".join(what)
