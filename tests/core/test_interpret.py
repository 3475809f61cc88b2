"""The interpreter speed change (moebench.core.tritonpatch.patch_lang_once): a nested @triton.jit
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
