"""Building a run's inputs ahead, on background threads, while the main thread runs cases.

An untimed run (`verify`, the interpreter) keeps the next shapes' inputs and references in flight
while the current case runs (`_Ahead.feed`); a timed run on a GPU builds every shape's input sets
in parallel before its first case (`_Ahead.build_all`), where they fit in memory together
(`prebuild_fits`), so nothing runs in the background while anything is timed. The case pipeline
(moebench.core.pipeline) builds a shape (`_build_shape`) and takes what was built ahead from its
`_ahead` futures; the run driver decides when (`_Ahead`).
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, Mapping

from moebench.core.cases import Case, shape_key
from moebench.core.pipeline import CasePipeline
from moebench.errors import UsageError

# Background input building (untimed runs only: `verify`, interpreter runs). Workers: half the
# cores, at most 8 (torch's own CPU kernels already use several threads each); $MOEBENCH_PREFETCH
# sets the number, 0 turns it off. Each worker keeps two shapes in flight.
PREFETCH_MAX_WORKERS = 8
PREFETCH_DEPTH_PER_WORKER = 2
# A timed run builds every shape's input sets before its first case, in parallel, when they fit
# together in this much memory (4 GiB, and a quarter of what is free). Otherwise each shape is built
# when its first case comes.
PREBUILD_MAX_BYTES = 4 << 30
PREBUILD_FREE_SHARE = 0.25


def shape_major(cases: list[Case], shape_params: tuple[str, ...]) -> list[Case]:
    """The same cases, those of one shape (one set of inputs, one reference) next to each other, in
    the order shapes first appear. For untimed runs: each shape's inputs are built once and can be
    dropped after its last case. Records are put back in spec order at the end."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault(shape_key(c, shape_params), []).append(c)
    return [c for g in groups.values() for c in g]


def prefetch_workers(environ: Mapping[str, str] | None = None) -> int:
    """Background threads that build inputs ahead in untimed runs ($MOEBENCH_PREFETCH; 0 = none).
    At most the CPU's cores (or PREFETCH_MAX_WORKERS, where there are fewer): each thread runs
    torch's CPU kernels and keeps two shapes' inputs in memory, so more threads than cores build
    nothing sooner, and a million cannot even start. A value that is no whole number in that range
    is a UsageError naming it."""
    raw = (os.environ if environ is None else environ).get("MOEBENCH_PREFETCH", "").strip()
    if not raw:
        return max(1, min(PREFETCH_MAX_WORKERS, (os.cpu_count() or 2) // 2))
    most = max(PREFETCH_MAX_WORKERS, os.cpu_count() or 1)
    try:
        value = int(raw, 10)
    except ValueError:
        value = -1
    if not 0 <= value <= most:
        raise UsageError(f"$MOEBENCH_PREFETCH={raw!r}: expected a number of threads from 0 (none) to {most} "
                         f"(the larger of the CPU cores and {PREFETCH_MAX_WORKERS})")
    return value


class _DaemonPool:
    """A pool of daemon threads running submitted calls into Futures. Unlike ThreadPoolExecutor's
    workers (joined at interpreter exit), a thread stuck for good in a call (a plugin's input
    builder that never returns) holds up neither `shutdown` nor the process's exit: `abandon` the
    call's Future and a fresh thread takes the stuck one's place."""

    def __init__(self, workers: int, name: str):
        self.name = name
        self.queue: Any = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.running: dict[threading.Thread, Any] = {}  # thread -> the Future it runs (None: idle)
        self.stuck: set[threading.Thread] = set()
        for _ in range(max(1, workers)):
            self._start()

    def _start(self) -> None:
        t = threading.Thread(target=self._work, name=f"{self.name}-{len(self.running) + len(self.stuck)}", daemon=True)
        with self.lock:
            self.running[t] = None
        t.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            item = self.queue.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            with self.lock:
                self.running[me] = fut
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - surfaces in the case that needs it
                fut.set_exception(e)
            else:
                fut.set_result(result)
            with self.lock:
                if me in self.stuck:  # it was given up on: another thread took its place
                    return
                self.running[me] = None

    def submit(self, fn: Callable, *args) -> Future:
        fut: Future = Future()
        self.queue.put((fut, fn, args))
        return fut

    def abandon(self, fut) -> None:
        """Give up on `fut`: the thread running it is left alone and another starts in its place."""
        fut.cancel()
        with self.lock:
            held = [t for t, f in self.running.items() if f is fut]
            for t in held:
                del self.running[t]
                self.stuck.add(t)
        if held:
            self._start()

    def shutdown(self) -> None:
        """Cancel what has not started, then wait for the calls running, except those abandoned."""
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        with self.lock:
            live = list(self.running)
        for _ in live:
            self.queue.put(None)
        for t in live:
            t.join()


class _Ahead:
    """Builds the inputs and references of shapes on background threads (when: the module's
    docstring). Family input builders seed their own generators, so the data does not
    depend on which thread built it. A failure surfaces in the case that needs the shape; a build
    still running at that case's limit is given up (its thread left behind, another in its place),
    so the next shapes and the end of the run do not wait for it."""

    def __init__(self, pipeline: CasePipeline, cases: list[Case]):
        self.s = pipeline
        workers = prefetch_workers(pipeline.environ)
        self.depth = workers * PREFETCH_DEPTH_PER_WORKER
        keys = [shape_key(c, pipeline.fam.shape_params) for c in cases]
        first: dict[tuple, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        self.shapes = list(first.items())  # (key, first case index) in order
        self.pos = {k: j for j, (k, _) in enumerate(self.shapes)}
        self.keys, self.cases = keys, cases
        self.next = 0
        self.pool = _DaemonPool(workers, "moebench-inputs")
        pipeline._abandon = self.pool.abandon

    def feed(self, i: int) -> None:
        """Case i is next: keep the shapes up to `depth` past its own submitted."""
        here = self.pos[self.keys[i]]
        s = self.s
        while self.next < len(self.shapes) and self.next <= here + self.depth:
            key, j = self.shapes[self.next]
            if self.next > here and key not in s._inputs and key not in s._ahead:
                s._ahead[key] = self.pool.submit(s._build_shape, self.cases[j])
            self.next += 1

    def build_all(self) -> None:
        """Every shape, now, in parallel; returns when all are built (or failed)."""
        s = self.s
        for key, j in self.shapes:
            if key not in s._inputs and key not in s._ahead:
                s._ahead[key] = self.pool.submit(s._build_shape, self.cases[j])
        wait(list(s._ahead.values()))
        self.next = len(self.shapes)

    def close(self) -> None:
        self.pool.shutdown()
        self.s._ahead.clear()
        self.s._abandon = None


def prebuild_fits(pipe: CasePipeline, cases: list[Case]) -> bool:
    """Whether every shape's timing input sets together fit the prebuild budget (a share of the
    free device memory), so a timed run can build them all up front."""
    if pipe.torch_device != "cuda":
        return False
    need, seen = 0, set()
    for c in cases:
        key = shape_key(c, pipe.fam.shape_params)
        if key not in seen:
            seen.add(key)
            need += pipe.impl.input_bytes(c.params) * pipe.placements.n_sets(c.params)
    return need <= min(PREBUILD_MAX_BYTES, PREBUILD_FREE_SHARE * pipe.free_memory()[0])
