"""The interpreter speed change (moebench.tritonpatch.patch_lang_once): a nested @triton.jit
call no longer re-patches triton.language, and kernels compute the same as before."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


@triton.jit
def _plus_one(x):
    return x + 1


@triton.jit
def _nested_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0)
    # two nested calls per program: a helper of this module, and tl.cdiv (triton.language.standard)
    y = _plus_one(x) + tl.cdiv(x, 3)
    tl.store(out_ptr + offs, y, mask=m)


def _run(monkeypatch, it, patch_lang) -> tuple[torch.Tensor, torch.Tensor, int]:
    patches = []
    real = it._patch_builtin
    monkeypatch.setattr(it, "_patch_lang", patch_lang)
    monkeypatch.setattr(it, "_patch_builtin", lambda *a: (patches.append(1), real(*a))[1])
    x = torch.arange(0, 200, dtype=torch.int32)
    out = torch.full_like(x, -7)
    _nested_kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    monkeypatch.undo()
    return x, out, len(patches)


def test_nested_calls_patch_once_per_launch_and_compute_the_same(monkeypatch):
    from triton.runtime import interpreter as it

    wrapper = it._patch_lang
    assert getattr(wrapper, "_moebench_once", False)  # installed by compat() (tests/conftest.py)
    x, out, fast = _run(monkeypatch, it, wrapper)
    assert torch.equal(out, x + 1 + torch.div(x + 2, 3, rounding_mode="floor"))
    x, out_slow, slow = _run(monkeypatch, it, wrapper._moebench_original)
    assert torch.equal(out_slow, out)
    # 13 programs x 2 nested calls: 27 full patches without the change, at most 3 with it (the
    # launch, then the first nested call that sees another language module)
    assert slow >= 9 * fast and fast > 0


# Two plugin kernels whose check passes at tokens 0 without proving anything: one names something
# that does not exist inside its loop (a GPU would refuse to compile it; the interpreter runs the
# loop body only when tokens > 0), one sizes its grid from the step's count (no program at 0).
UNPROVEN = '''
import triton
import triton.language as tl

from moebench.families import Built, cdiv, get_family

COUNT = get_family("count")


@triton.jit
def _count_undef(map_ptr, valid_ptr, counts_ptr, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.load(valid_ptr) * TOPK
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        e = tl.load(map_ptr + offs, mask=offs < n, other=-1)
        tl.atomic_add(counts_ptr + e, 1, mask=(e >= 0) & (e < NUM_LOCAL))


@triton.jit
def _count_step(map_ptr, valid_ptr, counts_ptr, L: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.load(valid_ptr) * TOPK
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(map_ptr + offs, mask=offs < n, other=-1)
    tl.atomic_add(counts_ptr + e, 1, mask=(e >= 0) & (e < L))


def _built(inp, params, launch):
    def reset():
        inp.counts.zero_()

    return Built(launch, inp.counts, reset, {"grid": 1, "block_size": params["block_size"], "num_warps": 4})


@COUNT.variant("undef", params=("block_size",), doc="an undefined name in its loop body")
def build_undef(inp, params, device):
    return _built(inp, params, lambda: _count_undef[(1,)](inp.routing_map, inp.valid, inp.counts,
                                                          TOPK=params["topk"], BLOCK=params["block_size"]))


@COUNT.variant("stepgrid", params=("block_size",), doc="its grid from the step's count, not the capacity")
def build_stepgrid(inp, params, device):
    grid = (cdiv(params["tokens"] * params["topk"], params["block_size"]),)
    return _built(inp, params, lambda: _count_step[grid](inp.routing_map, inp.valid, inp.counts,
                                                         L=params["local_experts"], TOPK=params["topk"],
                                                         BLOCK=params["block_size"]))
'''


def test_a_check_that_proves_nothing_at_zero_tokens_is_not_exact(tmp_path, monkeypatch):
    """Before: both plugin kernels were 'exact' at tokens 0. Now the kernel that could not compile is
    an error naming the name and its line, and the launch that ran no program is 'vacuous'; the
    built-in kernel at tokens 0 (it ran, with a grid from the capacity) stays exact."""
    from clirun import load_plugin
    from moebench.core.cases import Case
    from moebench.core.device import detect
    from moebench.core.pipeline import CasePipeline, Options
    from moebench.core.spec import load_spec

    plugin = load_plugin(monkeypatch, tmp_path / "unproven.py", UNPROVEN)
    spec = load_spec("count-block")
    run = CasePipeline(spec, detect(True), Options(timing=spec.timing, time_it=False), environ={})
    base = {"buffer_tokens": 64, "topk": 8, "num_experts": 128, "local_experts": 32, "local_expert_start": 0,
            "routing": "uniform", "zipf_s": 1.2, "seed": 0, "block_size": 64, "num_warps": 4, "grid": 0,
            "prefetch": 0}

    def rec(variant, tokens):
        return run.run_case(Case("count", variant, variant, dict(base, tokens=tokens), f"{variant}-{tokens}"))

    line = next(i for i, t in enumerate(UNPROVEN.splitlines(), 1) if "NUM_LOCAL" in t)
    r = rec("undef", 0)
    assert r.status == "error" and r.error.startswith(f"NameError: kernel _count_undef reads 'NUM_LOCAL' at "
                                                      f"{plugin}:{line}, which is not defined"), r.error
    r = rec("stepgrid", 0)
    assert r.status == "mismatch" and r.checks["ref_check"] == "vacuous" and r.error.startswith("vacuous: "), r.error
    assert "ran no program of _count_step" in r.error
    for variant in ("stepgrid", "persistent"):
        assert rec(variant, 30).checks["ref_check"] == "exact"
    r = rec("persistent", 0)
    assert r.status == "ok" and r.checks["ref_check"] == "exact" and r.checks["counts_sum"] == 0
