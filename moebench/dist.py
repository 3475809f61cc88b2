"""Beyond one GPU: shards of a sweep (a flag or a Slurm array), one worker process per GPU of a node,
and merging shard results back into one results file.

Three ways to spread one sweep, none of which needs NCCL or any collective:

- ``--shard I/N`` (or the Slurm environment) runs a deterministic, cost-balanced part of the cases.
  Every shard expands the same spec, so every shard computes the same split without talking to
  the others; ``moebench merge`` puts the shard files back together.
- ``--devices all|0,1,..`` runs one worker process per GPU of this node. Each worker pins its GPU
  (CUDA_VISIBLE_DEVICES, set before torch is imported), builds its own device info and Runner,
  and asks the parent for the next case when it is free; records come back as they finish.
- Both at once: a Slurm array over nodes, every GPU of each node.

The module is torch-free at import: the workers import torch only after pinning their GPU.
"""

from __future__ import annotations

import heapq
import os
import pickle
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from moebench.errors import BackendError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from moebench.cases import Case
    from moebench.records import Record
    from moebench.runner import RunOptions
    from moebench.spec import Spec


# ============================================================================ which shard am I


SHARD_RE = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")


def parse_shard(text: str | None, env: Mapping[str, str]) -> tuple[int, int] | None:
    """The shard this process runs, as (index, count), 0-based; None for the whole sweep.

    From ``--shard I/N`` when given. Otherwise from Slurm: an array task is one shard
    (SLURM_ARRAY_TASK_ID among SLURM_ARRAY_TASK_COUNT tasks, counted from SLURM_ARRAY_TASK_MIN in
    steps of SLURM_ARRAY_TASK_STEP, so ``--array=1-4`` and ``--array=0-6:2`` work as well as
    ``--array=0-3``); else a task of a multi-task step is one shard (SLURM_PROCID of SLURM_NTASKS).
    A split into one part is no split: ``--shard 0/1`` and the Slurm variables of a single task give
    None, so ``--shard 0/1`` runs the whole sweep inside an array job that is not meant to split it.
    """
    if text is not None:
        m = SHARD_RE.fullmatch(text)
        if not m or not int(m.group(1)) < int(m.group(2)):
            raise UsageError(f"--shard: expected I/N with 0 <= I < N, got {text!r}")
        i, n = int(m.group(1)), int(m.group(2))
        return (i, n) if n > 1 else None
    if env.get("SLURM_ARRAY_TASK_ID", "").strip():
        return _array_shard(env)
    if env.get("SLURM_PROCID", "").strip() and env.get("SLURM_NTASKS", "").strip():
        i, n = _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_NTASKS")
        if not 0 <= i < n:
            raise UsageError(f"SLURM_PROCID={i} is not a task of SLURM_NTASKS={n}; pass --shard I/N")
        return (i, n) if n > 1 else None
    return None


def _array_shard(env: Mapping[str, str]) -> tuple[int, int] | None:
    task = _env_int(env, "SLURM_ARRAY_TASK_ID")
    lo = _env_int(env, "SLURM_ARRAY_TASK_MIN", 0)
    step = max(1, _env_int(env, "SLURM_ARRAY_TASK_STEP", 1))
    if env.get("SLURM_ARRAY_TASK_COUNT", "").strip():
        n = _env_int(env, "SLURM_ARRAY_TASK_COUNT")
    elif env.get("SLURM_ARRAY_TASK_MAX", "").strip():
        n = (_env_int(env, "SLURM_ARRAY_TASK_MAX") - lo) // step + 1
    else:
        raise UsageError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not; pass --shard I/N")
    i, off = divmod(task - lo, step)
    if off or not 0 <= i < n:
        raise UsageError(f"SLURM_ARRAY_TASK_ID={task} is not one of {n} evenly spaced array tasks from "
                         f"SLURM_ARRAY_TASK_MIN={lo} in steps of {step}; submit --array=A-B (or A-B:S), "
                         "or pass --shard I/N")
    return (i, n) if n > 1 else None


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise UsageError(f"{name} is not set; pass --shard I/N")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r}: expected an integer; pass --shard I/N") from None


def shard_stem(stem: str, i: int, n: int) -> str:
    """The result file stem of shard i of n: ``count-block.shard0of4``."""
    return f"{stem}.shard{i}of{n}"


SHARD_STEM_RE = re.compile(r"\.shard([0-9]+)of([0-9]+)$")


def unshard_stem(stem: str) -> str:
    """``count-block.shard0of4`` -> ``count-block`` (a stem without a shard suffix is kept)."""
    return SHARD_STEM_RE.sub("", stem)


# ============================================================================ the split


# Cost model, in element-equivalents (integers, so every machine computes the same split).
# Most of a case's wall time on a GPU does not grow with its shape: the first launch (a JIT compile
# the first time a tl.constexpr value is met), the checked launch against the torch reference, graph
# capture, and a replay loop that stops at the noise target or at timing.max_seconds. That fixed part
# is CASE_OVERHEAD. On top comes what does grow with the shape: the elements a case builds and
# touches at capture capacity (input sets, the reference, the launches themselves; under the
# interpreter this term dominates). The estimate ranks cases; it is not a clock. It reads only the
# case's parameters, never the device, so shards on different machines agree.
CASE_OVERHEAD = 1 << 22


def _elements(case: "Case") -> int:
    p = case.params

    def n(key: str) -> int:
        v = p.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0

    if case.family == "count":  # routing map at capacity (T x K), the atomics over the valid pairs
        return (n("buffer_tokens") + n("tokens")) * max(1, n("topk"))
    if case.family == "act":  # input W + output N columns, for the capacity rows and the live ones
        try:
            from moebench.families.activation import widths

            w, o = widths(p)
        except Exception:  # noqa: BLE001 - a malformed case still gets a cost
            w = o = n("ffn")
        return (n("rows") + n("live_rows")) * (w + o)
    # host-only families (combine) and families without a model here: the overhead alone
    return 0


def estimate_cost(case: "Case") -> int:
    """A cheap host-side cost estimate of one case: CASE_OVERHEAD + the elements it touches
    (count: (buffer_tokens + tokens) x topk; act: (rows + live_rows) x (input + output width))."""
    return CASE_OVERHEAD + _elements(case)


def partition(cases: Sequence["Case"], n: int) -> list[list["Case"]]:
    """Split cases into n shards of about equal estimated cost.

    Longest-processing-time greedy: cases by decreasing cost (ties by position), each to the
    least-loaded shard (ties by fewer cases, then lower index). Deterministic (integer costs, no
    hashing), every case in exactly one shard, each shard in the original case order. A shard's load
    is at most the mean load plus the largest single case (the list-scheduling bound). Shards may be
    empty when there are fewer cases than shards.
    """
    if n < 1:
        raise UsageError(f"--shard: the number of shards must be >= 1, got {n}")
    costs = [estimate_cost(c) for c in cases]
    heap = [(0, 0, k) for k in range(n)]  # (load, cases, shard index)
    members: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(cases)), key=lambda j: (-costs[j], j)):
        load, count, k = heapq.heappop(heap)
        members[k].append(i)
        heapq.heappush(heap, (load + costs[i], count + 1, k))
    return [[cases[i] for i in sorted(m)] for m in members]


# ============================================================================ every GPU of a node


def _visible_gpus() -> list[str]:
    """Names of the CUDA devices this process sees, in index order (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def parse_devices(text: str) -> list[int]:
    """``all`` or ``0,1,...`` -> the CUDA device indices to run on, one worker process each.

    Indices are as this process sees them (inside CUDA_VISIBLE_DEVICES, if set). The GPUs must be
    of one kind: one results file describes one device class."""
    names = _visible_gpus()
    t = (text or "").strip()
    if t.lower() == "all":
        if not names:
            raise BackendError("--devices all: no CUDA device is visible")
        picked = list(range(len(names)))
    else:
        picked = []
        for part in t.split(","):
            part = part.strip()
            if not part.isdigit() or not part.isascii():
                raise UsageError(f"--devices: expected all or a comma list of GPU indices like 0,1,3, got {text!r}")
            d = int(part)
            if d in picked:
                raise UsageError(f"--devices: GPU {d} is listed twice; one worker per GPU")
            picked.append(d)
        if not names:
            raise BackendError(f"--devices {t}: no CUDA device is visible")
        for d in picked:
            if d >= len(names):
                raise UsageError(f"--devices: no GPU {d}; this process sees {len(names)} "
                                 f"(0..{len(names) - 1})")
    first = picked[0]
    for d in picked[1:]:
        if names[d] != names[first]:
            raise UsageError(f"--devices: GPU {first} is {names[first]!r} but GPU {d} is {names[d]!r}; one "
                             "results file holds one device class, so list GPUs of one kind")
    return picked


def run_on_devices(spec: "Spec", cases: Sequence["Case"], devices: Sequence[int], *, quick: bool, verify: bool,
                   opts: "RunOptions") -> Iterator["Record"]:
    """Run cases on several GPUs of this node, one worker process per GPU; yield records as they finish
    (in completion order). A worker that dies is reported as an error record for the case it held,
    and the others drain the rest. `quick` and `verify` are not needed by the workers: the cases
    travel as they are, already expanded."""
    del quick, verify
    if "torch" in sys.modules:  # what the parent cached (the ceilings' 4 GiB copy) is the workers' memory
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    keys = [entries[d] if entries is not None and d < len(entries) else str(d) for d in devices]
    yield from _run_workers(spec.path, cases, keys, interpret=False, opts=opts, sweep=spec.name,
                            spec_sha256=spec.sha256, labels=[f"GPU {d}" for d in devices])


@dataclass
class _Worker:
    label: str
    proc: Any  # multiprocessing Process
    conn: Any  # the parent's end of the worker's pipe
    held: str | None = None  # the case id the worker is running
    started: bool = False  # sent "ready"
    stopped: bool = False  # was sent the stop message
    gone: bool = False  # exited (joined)
    fatal: str | None = None  # why it could not start
    leaving: str | None = None  # why it left early (a CUDA error that poisons its context)
    done: int = 0
    notes: list[str] = field(default_factory=list)


def _run_workers(spec_path: str | Path, cases: Sequence["Case"], worker_keys: Sequence[str], interpret: bool, *,
                 opts: "RunOptions", sweep: str | None = None, spec_sha256: str | None = None,
                 labels: Sequence[str] | None = None,
                 _die_on: Mapping[str, int | str] | None = None) -> Iterator["Record"]:
    """The worker pool behind run_on_devices, with the backend as a parameter so it runs on the CPU.

    One spawned process per key: a CUDA_VISIBLE_DEVICES value (interpret=False) or just a name
    (interpret=True: the kernels run under TRITON_INTERPRET=1, device info from detect(True)).
    Each worker has its own pipe to this process and asks for work over it, so the parent always
    knows which case a worker holds, and a worker killed at any moment cannot leave a shared queue
    locked for the others. `_die_on` is for tests: case id -> exit code makes the worker that draws
    that case exit with that code (a negative code: killed by that signal) instead of running it;
    case id -> text makes it record that error instead (a CUDA error text: it leaves, as on a GPU).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from moebench.records import Record

    if not cases:
        return
    if not worker_keys:
        raise UsageError("--devices: no devices to run on")
    if sweep is None or spec_sha256 is None:
        from moebench.spec import load_spec

        spec = load_spec(str(spec_path))
        sweep, spec_sha256 = sweep or spec.name, spec_sha256 or spec.sha256
    labels = list(labels) if labels is not None else [f"{'CPU' if interpret else 'GPU'} {k}" for k in worker_keys]
    by_id = {c.id: c for c in cases}
    pending = deque(c.id for c in cases)
    payload = pickle.dumps((list(cases), opts))  # opened by the worker after it pins its GPU
    ctx = mp.get_context("spawn")
    workers: list[_Worker] = []

    def dead_record(cid: str, why: str) -> Record:
        c = by_id[cid]
        return Record(sweep, c.family, c.id, c.variant, c.label, "error", error=why, params=dict(c.params))

    def dispatch(w: _Worker) -> None:
        """Hand the worker its next case, or tell it to stop when none is left."""
        if w.gone or w.stopped:
            return
        nxt = pending.popleft() if pending else None
        try:
            w.conn.send(nxt)
        except OSError:  # it died under us: the sentinel will say how
            if nxt is not None:
                pending.appendleft(nxt)
            return
        w.held = nxt
        w.stopped = nxt is None

    def handle(w: _Worker, msg: tuple) -> Iterator[Record]:
        kind = msg[0]
        if kind == "ready":
            w.started = True
            dispatch(w)
        elif kind == "record":
            rec = Record.from_json(msg[1])
            rec.timing["worker"] = w.label  # which GPU timed it: per-GPU spreads stay traceable
            w.held, w.done = None, w.done + 1
            if msg[2]:  # it leaves after this case: hand it nothing more
                w.leaving, w.stopped = msg[2], True
            dispatch(w)  # keep it busy while the caller writes the record
            yield rec
        elif kind == "fatal":
            w.fatal = msg[1]

    try:
        for key, label in zip(worker_keys, labels):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_worker_main, name=f"moebench-{label.replace(' ', '')}", daemon=True,
                            args=(str(key), interpret, str(spec_path), spec_sha256, payload, child_end,
                                  dict(_die_on or {})))
            p.start()
            child_end.close()
            workers.append(_Worker(label, p, parent_end))
        while not all(w.gone for w in workers):
            live = [w for w in workers if not w.gone]
            waitables = {}
            for w in live:
                waitables[w.proc.sentinel] = w
                if w.conn is not None:
                    waitables[w.conn] = w
            for obj in wait(list(waitables)):
                w = waitables[obj]
                if w.gone:
                    continue
                if obj is w.conn:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):  # its end closed: it is exiting, the sentinel follows
                        w.conn.close()
                        w.conn = None
                        continue
                    yield from handle(w, msg)
                    continue
                # the process is gone: read what it sent before it went, then account for it
                w.proc.join()
                w.gone = True
                while w.conn is not None:
                    try:
                        if not w.conn.poll():
                            break
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        break
                    yield from handle(w, msg)
                if w.conn is not None:
                    w.conn.close()
                    w.conn = None
                code = w.proc.exitcode
                if w.held is not None:
                    yield dead_record(w.held, f"worker on {w.label} died ({_exit_text(code)})")
                    w.held = None
                elif w.leaving is not None:
                    print(f"warning: worker on {w.label} left after {_cases(w.done)}: {w.leaving}; the other "
                          "workers take its share", file=sys.stderr)
                elif w.fatal is not None or (code != 0 and not w.stopped):
                    why = w.fatal or _exit_text(code)
                    when = "before running a case" if not w.done else f"after {_cases(w.done)}"
                    print(f"warning: worker on {w.label} stopped {when}: {why}", file=sys.stderr)
            # a worker that never got to say "ready" cannot be handed work, so all gone = all done
        if pending:
            if not any(w.started for w in workers):
                raise BackendError("no worker started: " + "; ".join(
                    f"{w.label}: {w.fatal or _exit_text(w.proc.exitcode)}" for w in workers))
            why = "not run: every worker exited first (" + "; ".join(
                f"{w.label}: {w.fatal or _exit_text(w.proc.exitcode)}" for w in workers) + ")"
            while pending:
                yield dead_record(pending.popleft(), why)
    finally:
        _shut_down(workers)


def _cases(k: int) -> str:
    return f"{k} case{'s' if k != 1 else ''}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"exit code {code}"
    return f"exit code {code}"


def _shut_down(workers: Iterable[_Worker]) -> None:
    """Stop the workers still running (the pool was closed early: an interrupt, an error). Their
    cases in flight would never be read, so there is nothing to wait for: SIGTERM, then SIGKILL."""
    live = [w for w in workers if not w.gone]
    for w in live:
        if w.proc.is_alive():
            w.proc.terminate()
    for w in live:
        w.proc.join(2.0)
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join()
        if w.conn is not None:
            w.conn.close()
            w.conn = None
        w.gone = True


def _worker_main(key: str, interpret: bool, spec_path: str, spec_sha256: str, payload: bytes, conn,
                 die_on: dict[str, int | str]) -> None:
    """One worker: pin the device, then run the cases the parent hands over until it says stop."""
    # First, before anything imports torch: the device this process may see, or the interpreter.
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = key
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the workers
    try:
        cases, opts = pickle.loads(payload)
        from moebench.device import detect
        from moebench.records import Record
        from moebench.runner import Runner
        from moebench.spec import load_spec

        spec = load_spec(spec_path)
        if spec_sha256 and spec.sha256 != spec_sha256:
            raise UsageError(f"{spec_path} changed since the sweep started (sha256 {spec.sha256[:12]}, "
                             f"expected {spec_sha256[:12]})")
        spec.timing = opts.timing  # the parent's (an --l2 override lives there)
        device = detect(interpret)
        if not interpret:
            _pin_nvml_clocks()
        runner = Runner(spec, device, opts)
        by_id = {c.id: c for c in cases}
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which goes on without us
        try:
            conn.send(("fatal", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
        finally:
            conn.close()
        sys.exit(1)
    conn.send(("ready", device.name))
    while True:
        try:
            cid = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if cid is None:
            break
        hook = die_on.get(cid)
        if isinstance(hook, int):  # test hook: die holding this case
            if hook < 0:
                os.kill(os.getpid(), -hook)
            os._exit(hook)
        if isinstance(hook, str):  # test hook: this case failed with this error
            c = by_id[cid]
            rec = Record(spec.name, c.family, c.id, c.variant, c.label, "error", error=hook, params=dict(c.params))
        else:
            rec = runner.run_case(by_id[cid])
        leaving = None
        if rec.status == "error" and any(s in rec.error for s in STICKY_CUDA_ERRORS):
            leaving = f"{rec.error.splitlines()[0]} (sticky: every later launch in this process would fail)"
        try:
            conn.send(("record", rec.to_json(), leaving))
        except OSError:
            return
        if leaving:
            break
    conn.close()


# CUDA errors after which a process's context is unusable: a worker that meets one hands its
# record back and leaves, so that one faulting case does not fail every later case on its GPU.
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                      "device-side assert", "illegal instruction")


def _pin_nvml_clocks() -> None:
    """Point the runner's clock readings at this worker's GPU.

    NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so the runner's nvml_clocks()
    (index 0) would read the node's first GPU from every worker. Find this GPU's NVML index by UUID
    and bind it; where NVML or the UUID is unavailable, leave the runner as it is."""
    import functools

    from moebench import device as dev
    from moebench import runner

    nv = dev._nvml()
    if nv is None:
        return
    try:
        import torch

        want = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "").lower().removeprefix("gpu-")
        if not want:
            return
        for i in range(nv.nvmlDeviceGetCount()):
            u = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))
            u = (u.decode() if isinstance(u, bytes) else str(u)).lower().removeprefix("gpu-")
            if u == want:
                runner.nvml_clocks = functools.partial(dev.nvml_clocks, i)
                return
    except Exception:  # noqa: BLE001 - clocks are a diagnostic; a failed lookup must not stop the run
        return


# ============================================================================ merge


@dataclass
class Merged:
    """Shard results put back together."""

    provenance: dict
    records: list  # list[Record], in the spec's case order when the spec could be read
    files: list[Path]
    duplicates: int = 0  # identical records met more than once, kept once
    shard_count: int | None = None  # N of the I/N the files carry, when they agree on it
    missing_shards: list[int] = field(default_factory=list)
    missing_cases: int | None = None  # None: the spec was not available to count them
    incomplete_files: list[Path] = field(default_factory=list)
    spec: Any = None  # the Spec, when its file is there with the same hash
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.incomplete_files and not self.missing_shards and not self.missing_cases


# (what, how to read it from a provenance, how to show it): shards must agree on all of them
_MUST_AGREE = (
    ("spec sha256", lambda p: p.get("spec_sha256"), lambda v: str(v)[:12]),
    ("device", lambda p: (p.get("device") or {}).get("name"), repr),
    ("matrix", lambda p: f"{p.get('matrix', 'sweep')}{' (quick)' if p.get('quick') else ''}", str),
    ("timing settings", lambda p: p.get("timing"), repr),
    ("cross checks", lambda p: sorted(p.get("cross_checks") or []), repr),
)


def merge_results(paths: Sequence[Path]) -> Merged:
    """Read shard result files and merge them, refusing inputs that are not shards of one run."""
    from moebench.records import load_results

    files: list[Path] = []
    seen_paths: set[Path] = set()
    for p in map(Path, paths):
        if p.resolve() in seen_paths:
            continue
        seen_paths.add(p.resolve())
        if p.suffix == ".jsonl":
            raise UsageError(f"{p}: a partial stream of a run still going (or killed); pass the shard's .json "
                             "(rerun the shard with --resume to write it)")
        files.append(p)
    if not files:
        raise UsageError("merge: no results files given")
    loaded = []
    for p in files:
        prov, recs = load_results(p)
        if not prov.get("spec_sha256"):
            raise UsageError(f"{p}: no provenance.spec_sha256; not a moebench results file")
        loaded.append((p, prov, recs))

    p0, prov0, _ = loaded[0]
    for p, prov, _ in loaded[1:]:
        for what, get, show in _MUST_AGREE:
            a, b = get(prov0), get(prov)
            if a != b:
                raise UsageError(f"cannot merge: {what} differs: {p0} has {show(a)}, {p} has {show(b)}; "
                                 "merge only shards of one sweep on one device class")

    records: dict[str, Record] = {}
    where: dict[str, Path] = {}
    m = Merged(provenance={}, records=[], files=files)
    for p, prov, recs in loaded:
        for r in recs:
            if r.case_id in records:
                if records[r.case_id].to_json() == r.to_json():
                    m.duplicates += 1
                    continue
                raise UsageError(f"cannot merge: case {r.case_id} ({r.label}) is in {where[r.case_id]} and in {p} "
                                 "with different results; drop one of the files")
            records[r.case_id] = r
            where[r.case_id] = p
        if prov.get("complete") is not True:
            m.incomplete_files.append(p)

    # shard coverage, from the shard numbers the files carry
    shards = [tuple(prov["shard"]) for _, prov, _ in loaded if prov.get("shard")]
    counts = {n for _, n in shards}
    if len(shards) == len(loaded) and len(counts) == 1:
        n = m.shard_count = counts.pop()
        m.missing_shards = sorted(set(range(n)) - {i for i, _ in shards})
    elif shards and len(counts) > 1:
        m.notes.append(f"the files come from splits into {', '.join(map(str, sorted(counts)))} shards; "
                       "coverage is checked by case id only")

    # the spec, when its file is still there unchanged: case order, missing cases, baseline deltas, markdown
    m.spec = _spec_of(prov0)
    order: dict[str, int] = {}
    if m.spec is not None:
        from moebench.cases import expand

        try:
            expected = expand(m.spec, quick=bool(prov0.get("quick")), verify=prov0.get("matrix") == "verify",
                              force=True)
            order = {c.id: i for i, c in enumerate(expected)}
            m.missing_cases = sum(1 for cid in order if cid not in records)
        except Exception as e:  # noqa: BLE001 - the merge stands without the spec's case list
            m.notes.append(f"could not expand {prov0.get('spec_path')}: {e}")
    else:
        m.notes.append(f"spec {prov0.get('spec_path')} is not here with sha256 {str(prov0['spec_sha256'])[:12]}: "
                       "kept the files' record order; no markdown, no recomputed baseline deltas")
    first_seen = {cid: i for i, cid in enumerate(records)}
    m.records = sorted(records.values(),
                       key=lambda r: (order.get(r.case_id, len(order)), first_seen[r.case_id]))
    if m.spec is not None:
        from moebench.runner import add_baseline_deltas

        add_baseline_deltas(m.spec, m.records)  # a shape's baseline may have run in another shard

    commits = sorted({str(prov.get("git_commit")) for _, prov, _ in loaded})
    if len(commits) > 1:
        m.notes.append(f"the shards ran at different commits: {', '.join(commits)}")
    m.provenance = _merged_provenance(loaded, commits)
    return m


def _spec_of(prov: dict):
    """The spec a results file was made from, if its file is here with the same hash; else None."""
    from moebench.errors import MoebenchError
    from moebench.spec import load_spec

    path = prov.get("spec_path")
    if not path:
        return None
    try:
        spec = load_spec(str(path))
    except (MoebenchError, OSError):
        return None
    return spec if spec.sha256 == prov.get("spec_sha256") else None


def _merged_provenance(loaded: list, commits: list[str]) -> dict:
    prov0 = loaded[0][1]
    base = {k: v for k, v in prov0.items() if k not in ("complete", "n_records")}

    def num(prov: dict, key: str) -> float:
        v = prov.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    base.update({
        "command": " ".join(["moebench"] + sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "shard": None,
        "merged_from": [{
            "file": str(p), "shard": prov.get("shard"), "complete": prov.get("complete"),
            "n_records": len(recs), "timestamp": prov.get("timestamp"), "command": prov.get("command"),
            "git_commit": prov.get("git_commit"), "sweep_wall_s": prov.get("sweep_wall_s"),
            "compile_s_total": prov.get("compile_s_total"),
        } for p, prov, recs in loaded],
        # the shards ran side by side: the sweep took as long as the slowest; compiling added up
        "sweep_wall_s": max(num(prov, "sweep_wall_s") for _, prov, _ in loaded),
        "compile_s_total": round(sum(num(prov, "compile_s_total") for _, prov, _ in loaded), 3),
        "jit_specializations": sum(int(num(prov, "jit_specializations")) for _, prov, _ in loaded),
    })
    if len(commits) > 1:
        base["git_commits"] = commits
    return base
