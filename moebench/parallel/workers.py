"""One worker process per GPU of this node (``--devices all|0,1,..``).

Each worker pins its GPU (CUDA_VISIBLE_DEVICES, set before torch is imported), builds its own
device info and run driver (moebench.core.driver.Driver, with the parent's environment and the
passes that run per case), and asks the parent for the next case when it is free; records come
back as they finish. The workers call the driver; they never join the parts themselves, and keep
nothing of a case after it ends. The parent's driver uses them through `pool`. The module is
torch-free at import: the workers import torch only after pinning their GPU.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Iterable, Iterator, Mapping, Sequence

from moebench.core import device as dev
from moebench.core.cases import Case
from moebench.core.driver import Driver, poisons_context
from moebench.core.family import catalogue
from moebench.core.passes import Pass
from moebench.core.pipeline import Options
from moebench.core.records import Record
from moebench.core.spec import Spec, load_spec
from moebench.core.text import one_line
from moebench.errors import BackendError, UsageError


def _visible_gpus() -> list[str]:
    """Names of the CUDA devices this process sees, in index order (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def device_list(text: str | None) -> list[int] | None:
    """``all`` -> None, ``0,1,...`` -> those indices: what --devices says, checked before anything
    asks which GPUs there are (a UsageError names the value and what is accepted)."""
    t = (text or "").strip()
    if t.lower() == "all":
        return None
    picked: list[int] = []
    for part in t.split(","):
        part = part.strip()
        if not part.isdigit() or not part.isascii():
            raise UsageError(f"--devices: expected all or comma-separated GPU indices like 0,1,3, got {text!r}")
        d = int(part)
        if d in picked:
            raise UsageError(f"--devices: GPU {d} is listed twice; one worker per GPU")
        picked.append(d)
    return picked


def parse_devices(text: str) -> list[int]:
    """``all`` or ``0,1,...`` -> the CUDA device indices to run on, one worker process each.

    Indices are as this process sees them (inside CUDA_VISIBLE_DEVICES, if set). The GPUs must be
    of one kind: one results file describes one device class."""
    picked = device_list(text)
    names = _visible_gpus()
    if not names:
        raise BackendError(f"--devices {text.strip()}: no CUDA device is visible")
    if picked is None:
        picked = list(range(len(names)))
    for d in picked:
        if d >= len(names):
            raise UsageError(f"--devices: no GPU {d}; this process sees {len(names)} (0..{len(names) - 1})")
    first = picked[0]
    for d in picked[1:]:
        if names[d] != names[first]:
            raise UsageError(f"--devices: GPU {first} is {names[first]!r} but GPU {d} is {names[d]!r}; one "
                             "results file holds one device class, so list GPUs of one kind")
    return picked


def pool(spec: Spec, devices: Sequence[int], opts: Options, *, isolate: bool = False):
    """The run driver's `workers` for these GPUs of this node: a callable (cases, passes, environ)
    -> records as they finish, one worker process per GPU. `devices` are indices as this process
    sees them (inside CUDA_VISIBLE_DEVICES, if set). `isolate`: a worker that dies (or leaves after
    a CUDA error) is replaced by a fresh one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    keys = [entries[d] if entries is not None and d < len(entries) else str(d) for d in devices]

    def run(cases: Sequence[Case], passes: Sequence[Pass], environ: Mapping[str, str]) -> Iterator[Record]:
        torch = sys.modules.get("torch")
        if torch is not None:  # what this process cached (the ceilings' 4 GiB copy) is the workers' memory
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
            except RuntimeError:  # this process's context is gone (a CUDA error): the workers start afresh anyway
                pass
        return _run_workers(spec, cases, keys, False, opts=opts, labels=[f"GPU {d}" for d in devices], passes=passes,
                            environ=environ, respawn=isolate)

    return run


def isolated(spec: Spec, opts: Options, backend: str):
    """The run driver's `workers` for `--isolate` on one device: the cases run one at a time in a
    child process, so a case that crashes it (a segfault, an abort, a CUDA error that poisons the
    context) or hangs past the case limit is recorded as failed with what happened, and a fresh
    child runs the rest. On a GPU the child sees this process's first GPU; otherwise it runs the
    kernels under the Triton interpreter."""
    if backend == "cuda":
        return pool(spec, [0], opts, isolate=True)

    def run(cases: Sequence[Case], passes: Sequence[Pass], environ: Mapping[str, str]) -> Iterator[Record]:
        return _run_workers(spec, cases, ["isolated"], True, opts=opts, labels=["CPU (isolated)"], passes=passes,
                            environ=environ, respawn=True)

    return run


# A child still holding a case this long after the case limit (its own alarm did not stop it: a
# hang in C code) is killed by the parent.
WATCHDOG_GRACE_S = 10.0


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
    key: str = ""
    since: float = 0.0  # when it was handed the case it holds (time.monotonic)
    killed: str | None = None  # why the parent killed it (a case past the limit)


def _run_workers(spec: Spec, cases: Sequence[Case], worker_keys: Sequence[str], interpret: bool, *,
                 opts: Options, labels: Sequence[str] | None = None, passes: Sequence[Pass] = (),
                 environ: Mapping[str, str] | None = None, respawn: bool = False) -> Iterator[Record]:
    """The worker pool behind `pool` and `isolated`, with the backend as a parameter so it runs on the CPU.

    One spawned process per key: a CUDA_VISIBLE_DEVICES value (interpret=False) or just a name
    (interpret=True: the kernels run under TRITON_INTERPRET=1, device info from detect(True)).
    Each worker has its own pipe to this process and asks for work over it, so the parent always
    knows which case a worker holds, and a worker killed at any moment cannot leave a shared queue
    locked for the others.
    `passes`: pass instances whose per-case hooks run in every worker (pickled: module-level
    classes); `environ`: the run's environment (kill switches), None: this process's.
    `respawn` (--isolate): a worker that died, was killed or left after a CUDA error is replaced by a
    fresh one with the same key while cases are left; under the interpreter, one holding a case
    WATCHDOG_GRACE_S past the case limit is killed and the case recorded as CaseTimeLimit.
    """
    if not cases:
        return
    labels = list(labels) if labels is not None else [f"{'CPU' if interpret else 'GPU'} {k}" for k in worker_keys]
    by_id = {c.id: c for c in cases}
    pending = deque(c.id for c in cases)
    env = dict(os.environ if environ is None else environ)
    payload = pickle.dumps((list(cases), opts, list(passes), env))  # opened by the worker after it pins its GPU
    ctx = _context(interpret)
    workers: list[_Worker] = []

    def dead_record(cid: str, why: str) -> Record:
        c = by_id[cid]
        return Record(spec.name, c.family, c.id, c.variant, c.label, "error", error=why, params=dict(c.params))

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
        w.since = time.monotonic()
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

    def start(key: str, label: str) -> None:
        parent_end, child_end = ctx.Pipe(duplex=True)
        p = ctx.Process(target=_worker_main, name=f"moebench-{label.replace(' ', '')}", daemon=True,
                        args=(str(key), interpret, str(spec.path), spec.sha256, payload, child_end, dict(os.environ)))
        p.start()
        child_end.close()
        workers.append(_Worker(label, p, parent_end, key=str(key)))

    limit = opts.case_limit_s if respawn and interpret and opts.case_limit_s else None

    def overdue() -> float | None:
        """Kill the workers past the case limit; the seconds until the next one would be."""
        if limit is None:
            return None
        now, nxt = time.monotonic(), None
        for w in workers:
            if w.gone or w.held is None or w.killed:
                continue
            left = w.since + limit + WATCHDOG_GRACE_S - now
            if left <= 0:
                w.killed = (f"CaseTimeLimit: still running after {limit:g} s under the Triton interpreter "
                            "(--case-limit) and not stopping; its process was killed")
                w.proc.kill()
            else:
                nxt = left if nxt is None else min(nxt, left)
        return nxt

    try:
        for key, label in zip(worker_keys, labels):
            start(key, label)
        while not all(w.gone for w in workers):
            live = [w for w in workers if not w.gone]
            waitables = {}
            for w in live:
                waitables[w.proc.sentinel] = w
                if w.conn is not None:
                    waitables[w.conn] = w
            for obj in wait(list(waitables), timeout=overdue()):
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
                replace = respawn and w.started and pending and (w.held is not None or w.leaving is not None)
                if w.held is not None:
                    why = w.killed or f"worker on {w.label} died ({_exit_text(code)})"
                    if respawn and not w.killed:
                        why = (f"crashed: its process died ({_exit_text(code)}); --isolate recorded it and ran the "
                               "other cases in a fresh process")
                    yield dead_record(w.held, why)
                    w.held = None
                    if replace:
                        start(w.key, w.label)
                    continue
                if replace:  # it left after a CUDA error: a fresh context for the rest
                    start(w.key, w.label)
                elif w.leaving is not None:
                    print(f"warning: worker on {w.label} left after {_cases(w.done)}: {w.leaving}; the other "
                          "workers take its share", file=sys.stderr)
                elif w.fatal is not None or (code != 0 and not w.stopped):
                    why = w.fatal or _exit_text(code)
                    when = "before running a case" if not w.done else f"after {_cases(w.done)}"
                    print(f"warning: worker on {w.label} stopped {when}: {why}", file=sys.stderr)
            # a worker that never got to say "ready" cannot be handed work, so all gone = all done
        if pending:
            why = "; ".join(f"{w.label}: {w.fatal or _exit_text(w.proc.exitcode)}" for w in workers)
            if not any(w.started for w in workers):
                raise BackendError(f"no worker started: {why}")
            while pending:
                yield dead_record(pending.popleft(), f"not run: every worker exited first ({why})")
    finally:
        _shut_down(workers)


# What a worker under the interpreter imports before its first case.
WARM = ("torch", "triton")


def _context(interpret: bool):
    """How worker processes start. On a GPU, spawned: a fresh interpreter, which imports torch only
    after its CUDA_VISIBLE_DEVICES is set. Under the interpreter (the CPU), forked from a server
    process that has imported torch and triton once: `--isolate` replaces a crashed child in a
    fraction of a second instead of a fresh import each time. The server imports nothing of
    moebench's, so each child loads the kernels after it sets TRITON_INTERPRET, as a spawned one
    does; it starts clean, not a copy of this process."""
    if not interpret or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(WARM))
    return ctx


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
                 parent_env: Mapping[str, str]) -> None:
    """One worker: pin the device, then run the cases the parent hands over until it says stop."""
    # The parent's environment as it is now (a forked worker's server kept the one it started with),
    # then, before anything imports torch: the device this process may see, or the interpreter.
    os.environ.clear()
    os.environ.update(parent_env)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = key
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the workers
    try:
        # the parent's plugin files ($MOEBENCH_PLUGINS) first: the passes and variants they register
        # are unpickled below, and a spec's plugins: naming one of them then finds it loaded
        # (loading the spec first would load it again from inside itself, when it asks for its
        # family and the catalogue loads $MOEBENCH_PLUGINS)
        catalogue()
        cases, opts, passes, environ = pickle.loads(payload)
        spec = load_spec(spec_path)
        if spec_sha256 and spec.sha256 != spec_sha256:
            raise UsageError(f"{spec_path} changed since the sweep started (sha256 {spec.sha256[:12]}, "
                             f"expected {spec_sha256[:12]})")
        spec.timing = opts.timing  # the parent's (an --l2 override lives there)
        device = dev.detect(interpret)
        clocks = None if interpret else _nvml_index(device.uuid)
        driver = Driver(spec, device, opts, environ=environ, passes=passes)
        if clocks is not None:
            driver.pipeline.timer.clock_index = clocks
        by_id = {c.id: c for c in cases}
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which goes on without us
        try:
            conn.send(("fatal", f"{type(e).__name__}: {one_line(e)}"))
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
        rec = driver.run_case(by_id[cid])  # its graphs and placement copies go when it returns
        leaving = None
        if poisons_context(rec):
            leaving = f"{rec.error.splitlines()[0]} (sticky: every later launch in this process would fail)"
        try:
            conn.send(("record", rec.to_json(), leaving))
        except OSError:
            return
        if leaving:
            break
    conn.close()


def _nvml_index(want: str | None) -> int | None:
    """The NVML index of the GPU whose UUID (NVML's spelling, GPU-...) is `want`: NVML numbers GPUs
    physically and ignores CUDA_VISIBLE_DEVICES, so index 0 would read the node's first GPU from
    every worker. None where NVML or the UUID is unavailable."""
    nv = dev._nvml()
    if nv is None or not want:
        return None
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            u = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))
            if (u.decode() if isinstance(u, bytes) else str(u)).lower() == want.lower():
                return i
    except Exception:  # noqa: BLE001 - clocks are a diagnostic; a failed lookup must not stop the run
        return None
    return None
