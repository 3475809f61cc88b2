"""The placement copy (session.placement_copy) is deepcopy for an input set: equal data in storages
of its own, views kept as views of one clone, tensors met twice copied once, other types through
deepcopy. (Where its allocations land, against deepcopy's, is a GPU test: test_gpu_placements.)"""

import copy
from dataclasses import dataclass

import pytest
import torch

from moebench.core.session import placement_copy
from moebench.families.act.kernels import build_inputs as act_inputs
from moebench.families.count.kernels import build_inputs as count_inputs


def _tensors(obj):
    return {k: v for k, v in vars(obj).items() if isinstance(v, torch.Tensor)}


def _check_like_deepcopy(src):
    mine, ref = placement_copy(src), copy.deepcopy(src)
    assert type(mine) is type(src)
    for k, v in vars(src).items():
        m, r = getattr(mine, k), getattr(ref, k)
        if isinstance(v, torch.Tensor):
            assert torch.equal(m, v) and m.dtype == v.dtype and m.stride() == v.stride()
            assert m.storage_offset() == r.storage_offset() == v.storage_offset()
            assert m.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
            assert m.untyped_storage().nbytes() == v.untyped_storage().nbytes()
        else:
            assert m == v
    # the same sharing of storages as the original (and as deepcopy's copy)
    def sharing(obj):
        ptrs = {k: t.untyped_storage().data_ptr() for k, t in _tensors(obj).items()}
        return {(a, b) for a in ptrs for b in ptrs if a < b and ptrs[a] == ptrs[b]}
    assert sharing(mine) == sharing(src) == sharing(ref)
    return mine


def test_count_set_copies_like_deepcopy():
    params = dict(tokens=40, buffer_tokens=64, topk=4, num_experts=16, local_experts=8, local_expert_start=0,
                  routing="uniform", zipf_s=1.2, seed=0)
    src = count_inputs(params, "cpu", 0)
    mine = _check_like_deepcopy(src)
    assert mine.counts.untyped_storage().data_ptr() == mine.counts_buf.untyped_storage().data_ptr()
    mine.counts_buf.fill_(7)  # a write to the copy leaves the original alone, and reaches the view
    assert int(mine.counts[0]) == 7 and int(src.counts_buf[0]) != 7


@pytest.mark.parametrize("op", ["silu_mul_bounded", "swiglu"])
def test_act_set_copies_like_deepcopy(op):
    params = dict(op=op, rows=64, live_rows=40, ffn=32, in_cols=0, pad_frac=0.25, seed=0)
    _check_like_deepcopy(act_inputs(params, "cpu", 1))


@dataclass
class Nested:
    a: torch.Tensor
    pair: tuple
    table: dict
    note: str = "x"


def test_containers_and_a_tensor_met_twice():
    t = torch.arange(6.0)
    src = Nested(a=t, pair=(t, t[2:]), table={"k": [t[1:3], 3]})
    out = placement_copy(src)
    assert out.a is out.pair[0]  # one tensor met twice: one copy, as deepcopy's memo gives
    assert out.pair[1].untyped_storage().data_ptr() == out.a.untyped_storage().data_ptr()
    assert out.table["k"][1] == 3 and torch.equal(out.table["k"][0], t[1:3])
    assert out.a.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


class Custom:
    def __init__(self, t):
        self.t = t


@dataclass
class WithCustom:
    x: torch.Tensor
    extra: Custom


def test_other_types_go_to_deepcopy(monkeypatch):
    calls = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda obj, *a: calls.append(obj) or real(obj, *a))
    src = WithCustom(torch.ones(3), Custom(torch.zeros(2)))
    out = placement_copy(src)
    assert calls and calls[0] is src
    assert torch.equal(out.extra.t, src.extra.t) and out.extra is not src.extra
    calls.clear()
    placement_copy(Nested(torch.ones(2), (), {}))
    assert not calls
    g = torch.ones(2, requires_grad=True)  # a tensor that needs grad: deepcopy's own handling
    out = placement_copy(Nested(g, (), {}))
    assert calls and out.a.requires_grad


def test_a_dropped_copy_is_freed_without_a_garbage_collection():
    """The timing drops a case's copies and relies on their memory going back right away: nothing
    of placement_copy's own (its memos) may keep a copy alive until the next collection."""
    import gc
    import weakref

    params = dict(tokens=40, buffer_tokens=64, topk=4, num_experts=16, local_experts=8, local_expert_start=0,
                  routing="uniform", zipf_s=1.2, seed=0)
    src = count_inputs(params, "cpu", 0)
    gc.disable()
    try:
        out = placement_copy(src)
        refs = [weakref.ref(t) for t in _tensors(out).values()]
        del out
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
