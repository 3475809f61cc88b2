"""Count family under the Triton interpreter: exact against torch.bincount, every geometry
bit-exact with every other, guards untouched, and checks that can fail."""

import pytest
import torch

from moebench.core.device import detect
from moebench.errors import UsageError
from moebench.core.family import get_family
from moebench.families.count import kernels as count

DEV = detect(True)
FAM = get_family("count")
BASE = {"tokens": 37, "buffer_tokens": 64, "topk": 8, "num_experts": 128, "local_experts": 32,
        "local_expert_start": 32, "routing": "uniform", "zipf_s": 1.2, "seed": 3, "grid": 0,
        "num_warps": 4, "block_size": 1024}


def build(variant, inp, params, env=None):
    """A variant's launch, its parameters resolved as the session resolves them."""
    q, _ = FAM.resolve(variant, params, DEV, env or {})
    return FAM.builder(variant)(inp, q, DEV)


def run(variant, inp, params):
    b = build(variant, inp, params)
    b.reset()
    b.launch()
    return b, b.output.clone()


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
@pytest.mark.parametrize("tokens,start", [(0, 0), (1, 96), (37, 32), (64, 0)])
def test_matches_bincount_and_every_geometry_agrees(routing, tokens, start):
    p = {**BASE, "routing": routing, "tokens": tokens, "local_expert_start": start}
    inp = count.build_inputs(p, "cpu")
    expected = count.reference(inp, p)
    _, base = run("persistent", inp, p)
    assert count.check(inp, base, expected, p).ok
    for block in (16, 64, 128):
        for variant in ("persistent", "nonpersistent", "strided", "prefetch", "privatized"):
            q = {**p, "block_size": block, "grid": 0 if variant == "nonpersistent" else 3}
            _, out = run(variant, inp, q)
            assert torch.equal(out, base), (variant, block)
    nv = count.nonvacuity(inp, base, p)
    if tokens:  # not vacuous: something was counted, and it is what torch counts
        assert nv["counts_sum"] == int(expected.sum()) > 0
        assert nv["experts_populated"] > 0
    else:
        assert nv["counts_sum"] == 0


def test_rows_past_valid_bound_are_not_counted():
    p = {**BASE, "tokens": 5}
    inp = count.build_inputs(p, "cpu")
    _, out = run("persistent", inp, p)
    everything = torch.bincount(inp.routing_map.reshape(-1).long(), minlength=128)[32:64].int()
    assert int(out.sum()) < int(everything.sum())  # stale rows hold experts too: the bound matters
    assert torch.equal(out, count.reference(inp, p))


def test_check_fails_on_wrong_counts_and_on_guard_writes():
    p = dict(BASE)
    inp = count.build_inputs(p, "cpu")
    _, out = run("persistent", inp, p)
    expected = count.reference(inp, p)
    bad = out.clone()
    bad[0] += 1
    assert not count.check(inp, bad, expected, p).ok
    inp.counts_buf[0] = 0  # a stray write below the local range
    c = count.check(inp, out, expected, p)
    assert not c.ok and "outside" in c.detail


def test_counters_reset_between_checked_launches():
    p = dict(BASE)
    inp = count.build_inputs(p, "cpu")
    b, first = run("persistent", inp, p)
    b.launch()  # without reset, counts accumulate...
    assert torch.equal(b.output, 2 * first)
    b.reset()
    b.launch()
    assert torch.equal(b.output, first)


def test_shipped_variant_reads_kill_switch(monkeypatch):
    p = dict(BASE)
    inp = count.build_inputs(p, "cpu")
    assert build("shipped", inp, p, {}).geometry["block_size"] == 128
    assert build("shipped", inp, p, {"MCORE_COUNT_TOKENS_BLOCK": "1024"}).geometry["block_size"] == 1024
    for bad in ("96", "abc", "0", "-128", str(2**31)):
        with pytest.raises(UsageError, match="MCORE_COUNT_TOKENS_BLOCK"):
            build("shipped", inp, p, {"MCORE_COUNT_TOKENS_BLOCK": bad})
    _, sources = FAM.resolve("shipped", p, DEV, {"MCORE_COUNT_TOKENS_BLOCK": "1024"})
    assert sources["block_size"] == "$MCORE_COUNT_TOKENS_BLOCK"
    _, sources = FAM.resolve("shipped", p, DEV, {})
    assert sources["block_size"] == "default 128 ($MCORE_COUNT_TOKENS_BLOCK unset)"
    assert sources["grid"].startswith("device sm_count")


def test_zipf_routing_is_skewed_and_distinct_per_token():
    p = {**BASE, "routing": "zipf", "zipf_s": 1.5, "buffer_tokens": 2048, "tokens": 2048}
    rmap = count.routing_map(p, 0)
    assert rmap.shape == (2048, 8)
    assert all(len(set(row.tolist())) == 8 for row in rmap[:64])  # topk distinct experts
    freq = torch.bincount(rmap.reshape(-1).long(), minlength=128).sort(descending=True).values
    assert freq[0] > 4 * freq[64]  # hot experts
    uni = torch.bincount(count.routing_map({**p, "routing": "uniform"}, 0).reshape(-1).long(), minlength=128)
    assert uni.max() < 2 * uni.float().mean()


def test_geometry_and_work_model():
    p = {**BASE, "tokens": 256, "buffer_tokens": 16384, "block_size": 1024}
    inp = count.build_inputs(p, "cpu")
    b = build("persistent", inp, p)
    assert b.geometry == {"grid": DEV.sm_count, "block_size": 1024, "num_warps": 4, "chunking": "contiguous"}
    w = count.work(p, b.geometry, DEV)
    assert w["ctas_with_work"] == 2  # 2048 pairs / 1024: the PR's "2 do work"
    assert w["pairs_per_thread"] == 8  # 1024 pairs over 128 threads: the serialisation
    nb = build("nonpersistent", inp, p)
    assert nb.geometry["grid"] == 16384 * 8 // 1024


@pytest.mark.parametrize("local", [1, 24, 32])
def test_new_variants_exact_for_uneven_local_expert_counts(local):
    p = {**BASE, "num_experts": 64, "local_experts": local, "local_expert_start": 64 - local, "tokens": 61,
         "block_size": 32, "grid": 2}
    inp = count.build_inputs(p, "cpu")
    expected = count.reference(inp, p)
    assert int(expected.sum()) > 0
    for variant in ("prefetch", "privatized", "persistent", "strided", "nonpersistent"):
        for pre in (0, 1):
            _, out = run(variant, inp, {**p, "prefetch": pre})
            assert count.check(inp, out, expected, p).ok, variant


def test_contiguous_runs_can_leave_programs_idle():
    """Megatron's chunk assignment: ceil(C / P) chunks per program, so at 16384 tokens x 8 at
    BLOCK 128 (1024 chunks) on 132 programs, runs of 8 cover them with 128 programs and 4 idle;
    striding keeps all 132 busy. At decode both use the 2 chunks' worth of programs."""
    assert count.programs_with_work(16384 * 8, 128, 132, "contiguous") == 128
    assert count.programs_with_work(16384 * 8, 128, 132, "strided") == 132
    assert count.programs_with_work(256 * 8, 1024, 132, "contiguous") == 2
    assert count.programs_with_work(256 * 8, 1024, 132, "strided") == 2
    assert count.programs_with_work(0, 128, 132, "contiguous") == 0


@pytest.mark.parametrize("grid", [1, 3, 7, 132])
def test_contiguous_assignment_covers_every_chunk_once(grid):
    """The persistent kernel at grids that do and do not divide the chunk count: exact counts
    (a chunk skipped or counted twice would show)."""
    p = {**BASE, "tokens": 61, "block_size": 16, "grid": grid}
    inp = count.build_inputs(p, "cpu")
    _, out = run("persistent", inp, p)
    assert count.check(inp, out, count.reference(inp, p), p).ok


def test_upstream_variants_are_unavailable_without_megatron(monkeypatch):
    from moebench.errors import Unavailable

    monkeypatch.delenv("MOEBENCH_MEGATRON_LM", raising=False)
    p = dict(BASE)
    inp = count.build_inputs(p, "cpu")
    for variant in ("upstream", "upstream-nonpersistent"):
        with pytest.raises(Unavailable, match="MOEBENCH_MEGATRON_LM"):
            build(variant, inp, p)
