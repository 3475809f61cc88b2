"""Shards of a sweep: which part this process runs (``--shard I/N`` or the Slurm environment), the
cost-balanced split, and the file names of shard results.

Every shard expands the same spec, so every shard computes the same split without talking to the
others; ``moebench merge`` puts the shard files back together (moebench.parallel.merge). Torch-free.
"""

from __future__ import annotations

import heapq
import re
from typing import Mapping, Sequence

from moebench.core.cases import Case
from moebench.core.family import catalogue
from moebench.errors import UsageError


# ============================================================================ which shard am I


# at most 18 digits each: an index or count past 10^18 is a typo, and int() of a longer string is slow
SHARD_RE = re.compile(r"\s*([0-9]{1,18})\s*/\s*([0-9]{1,18})\s*")


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


def check_shard_count(n: int, n_cases: int, option: str | None) -> None:
    """A split into more shards than there are cases leaves shards with nothing to run (and the
    split itself costs memory per shard): refuse it, naming where the count came from."""
    if n > n_cases:
        where = option or "the Slurm task count (SLURM_ARRAY_TASK_COUNT or SLURM_NTASKS)"
        raise UsageError(f"{where}: {n} shards for {n_cases} case{'s' if n_cases != 1 else ''}; split into at most "
                         f"{n_cases} shards")


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
        if len(raw) > 18:
            raise ValueError(raw)
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


def estimate_cost(case: Case) -> int:
    """A cheap host-side cost estimate of one case: CASE_OVERHEAD + the elements it touches, as
    the family's catalogue estimates them (count: (buffer_tokens + tokens) x topk; act: (rows +
    live_rows) x (input + output width)); host-only families cost the overhead alone."""
    fam = catalogue().get(case.family)
    if fam is None or fam.cost is None:
        return CASE_OVERHEAD
    params = {k: v for k, v in case.params.items()
              if isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)}
    try:
        return CASE_OVERHEAD + max(0, int(fam.cost(params)))
    except (KeyError, TypeError, ValueError):  # a malformed case still gets a cost
        return CASE_OVERHEAD


def partition(cases: Sequence[Case], n: int) -> list[list[Case]]:
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


