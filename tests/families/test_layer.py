"""Layer family under the Triton interpreter: the whole step against the float64 torch reference,
bit-exact across count and activation variants, the kernel-alone scopes, checks that fail on a
miscount or a dropped contribution, the grouped-GEMM paths, the upstream arm (unavailable here,
and its plumbing with a stand-in), and the conversion table an A/B over the scopes renders."""

import sys
import types

import pytest

import warm
import torch

from moebench.analysis.ab import OFF, ON, ab_markdown, ab_pairs, parse_setting, run_arms
from moebench.core.device import detect
from moebench.core.records import Record
from moebench.errors import Unavailable
from moebench.core.family import get_family
from moebench.families import layer as catalogue
from moebench.families.layer import kernels as layer

DEV = detect(True)
FAM = get_family("layer")
# 13 live tokens of 16, top-4 of 16 experts, 4 local from expert 4, H = 64, N = 32, A = 4: M = 80
# rows, about 13 in use; grids small enough for the interpreter
BASE = {"tokens": 13, "buffer_tokens": 16, "topk": 4, "num_experts": 16, "local_experts": 4,
        "local_expert_start": 4, "hidden": 64, "ffn": 32, "op": "silu_mul_bounded", "align": 4, "layers": 1,
        "scope": "step", "seed": 5, "count_variant": "persistent", "count_block_size": 1024, "count_num_warps": 4,
        "count_grid": 4, "count_prefetch": 0, "act_variant": "legacy", "act_grid_cap": 8192, "act_num_warps": 4,
        "act_tile_rows": 4, "act_tile_cols": 32, "act_prefetch": 0}


def build(inp, params, env=None):
    q, _ = FAM.resolve("step", params, DEV, env or {})
    return FAM.builder("step")(inp, q, DEV)


def run(inp, params):
    b = build(inp, params)
    b.reset()
    b.launch()
    return b, b.output.clone()


@pytest.fixture(scope="module")
def decode():
    """One shape, its inputs, the baseline launch's output and the reference."""
    p = dict(BASE)
    inp = layer.build_inputs(p, "cpu")
    _, base = run(inp, p)
    return p, inp, base, layer.reference(inp, p)


def test_step_matches_the_float64_reference_and_is_not_vacuous(decode):
    p, inp, base, exp = decode
    c = layer.check(inp, base, exp, p)
    assert c.ok, c.detail
    nv = layer.nonvacuity(inp, base, p)
    assert 0 < nv["tokens_with_local_experts"] <= p["tokens"] and nv["nonzero_out"] > 0
    assert nv["rows_in_use_last_layer"] % p["align"] == 0 and nv["rows_in_use_last_layer"] > 0
    # the output is the MoE's, not a copy of the input: tokens without a local expert are zeros
    local = inp.routing_map[0, :13].long() - 4
    none_local = ~((local >= 0) & (local < 4)).any(dim=1)
    assert torch.equal(base[0, :13][none_local], torch.zeros_like(base[0, :13][none_local]))


@pytest.mark.parametrize("count_variant,block,prefetch", [("persistent", 128, 0), ("nonpersistent", 64, 0),
                                                         ("prefetch", 16, 0), ("privatized", 64, 1)])
def test_every_count_variant_gives_the_same_step_bit_for_bit(decode, count_variant, block, prefetch):
    p, inp, base, _ = decode
    q = {**p, "count_variant": count_variant, "count_block_size": block, "count_prefetch": prefetch}
    _, out = run(inp, q)
    assert torch.equal(out, base)


# the tiled variant's prefetch reads its first tile against M: rows past the rows in use hold
# whatever grouped_mm left there, and the interpreter's arithmetic may overflow on them (the
# results are never stored)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("act", [{"act_variant": "capped", "act_grid_cap": 16},
                                 {"act_variant": "capped", "act_grid_cap": 8192},
                                 {"act_variant": "tiled", "act_grid_cap": 8, "act_prefetch": 1}])
def test_every_activation_geometry_gives_the_same_step_bit_for_bit(decode, act):
    p, inp, base, _ = decode
    _, out = run(inp, {**p, **act})
    assert torch.equal(out, base)


def test_kill_switches_of_the_delegated_variants_are_read_and_recorded(decode):
    p, inp, base, _ = decode
    q = {**p, "count_variant": "shipped", "act_variant": "shipped"}
    env = {"MCORE_COUNT_TOKENS_BLOCK": "64", "MCORE_MOE_ACTIVATION_GRID_CAP": "16"}
    import os

    before = dict(os.environ)
    qq, _ = FAM.resolve("step", q, DEV, env)  # the run's environment, handed down: os.environ is not read
    b = FAM.builder("step")(inp, qq, DEV)
    assert dict(os.environ) == before and not any(k in os.environ for k in env)
    assert b.geometry["count_block_size"] == 64 and b.launch_from["count_block_size"] == "$MCORE_COUNT_TOKENS_BLOCK"
    assert b.geometry["act_num_blocks"] == 16 and b.launch_from["act_grid_cap"] == "$MCORE_MOE_ACTIVATION_GRID_CAP"
    b.reset()
    b.launch()
    assert torch.equal(b.output, base)


@pytest.mark.parametrize("op", ["swiglu", "squared_relu"])
def test_other_activations_match_the_reference_and_their_variants_agree(op):
    p = {**BASE, "op": op, "tokens": 16, "seed": 2}
    inp = layer.build_inputs(p, "cpu")
    _, base = run(inp, p)
    assert layer.check(inp, base, layer.reference(inp, p), p).ok
    _, out = run(inp, {**p, "act_variant": "capped", "act_grid_cap": 16, "count_block_size": 128})
    assert torch.equal(out, base)


def test_several_layers_route_differently_and_each_is_checked():
    p = {**BASE, "layers": 3, "seed": 7}
    inp = layer.build_inputs(p, "cpu")
    b, out = run(inp, p)
    exp = layer.reference(inp, p)
    assert layer.check(inp, out, exp, p).ok
    assert not torch.equal(inp.routing_map[0, :13], inp.routing_map[1, :13])
    assert not torch.equal(out[0], out[1])
    # a wrong last layer is caught even when the first ones are right
    out[2, 3] += 0.5
    c = layer.check(inp, out, exp, p)
    assert not c.ok and "layer 2, token 3" in c.detail


def test_no_live_tokens_writes_nothing_and_a_full_graph_writes_every_row():
    for tokens in (0, 16):
        p = {**BASE, "tokens": tokens}
        inp = layer.build_inputs(p, "cpu")
        _, out = run(inp, p)
        assert layer.check(inp, out, layer.reference(inp, p), p).ok
        poisoned = (out[0].view(torch.int32) == layer._OUT_POISON_BITS).all(dim=1)
        assert int(poisoned.sum()) == 16 - tokens


def _step(inp, params):
    q, _ = FAM.resolve("step", params, DEV, {})
    step = layer._Step(inp, q, DEV)
    inp.out.view(torch.int32).fill_(layer._OUT_POISON_BITS)
    return step


def test_a_miscounting_count_kernel_fails_the_step(decode):
    """An undercount puts pairs into the next expert's block. (An overcount only pads a block
    with rows nobody reads: the step's output cannot show it, scope count does.)"""
    p, inp, _, exp = decode
    step = _step(inp, p)
    good = step.counters[0].launch

    def miscount():
        good()
        assert inp.counts[1] > 0
        inp.counts[1] = 0  # expert 1's pairs now land in expert 2's block, multiplied by its weights

    step.counters[0].launch = miscount
    step.layer(0)
    c = layer.check(inp, inp.out, exp, p)
    assert not c.ok and "beyond the bf16 bound" in c.detail


def test_a_dropped_contribution_is_beyond_the_bound(decode):
    p, inp, _, exp = decode
    step = _step(inp, p)
    step.layer(0)
    assert layer.check(inp, inp.out, exp, p).ok
    y = step.gemm(inp.act_out, inp.fc2[0].transpose(1, 2), inp.ends)  # the FC2 output of that launch
    local = inp.routing_map[0, :13].long() - 4
    t, k = (int(i) for i in ((local >= 0) & (local < 4)).nonzero()[-1])
    inp.dest[t * 4 + k] = -1  # as if the permute had lost that pair
    layer.combine(inp, y, 0, step.g)
    c = layer.check(inp, inp.out, exp, p)
    assert not c.ok and f"token {t}," in c.detail


def test_rows_past_the_live_tokens_must_stay_untouched(decode):
    p, inp, base, exp = decode
    bad = base.clone()
    bad[0, 14] = 0.0
    c = layer.check(inp, bad, exp, p)
    assert not c.ok and "past the live tokens" in c.detail


def test_routing_must_equal_torchs(decode):
    p, inp, base, exp = decode
    saved = inp.probs.clone()
    inp.probs[0, 2, 0] += 1e-3
    try:
        c = layer.check(inp, base, exp, p)
    finally:
        inp.probs.copy_(saved)
    assert not c.ok and "routing differs" in c.detail


def test_count_alone_is_exact_and_agrees_across_blocks():
    p = {**BASE, "scope": "count"}
    inp = layer.build_inputs(p, "cpu")
    _, base = run(inp, p)
    exp = layer.reference(inp, p)
    assert layer.check(inp, base, exp, p).detail == "exact"
    assert layer.nonvacuity(inp, base, p)["counts_sum"] == int(exp.counts.sum()) > 0
    _, out = run(inp, {**p, "count_block_size": 16, "count_variant": "privatized"})
    assert torch.equal(out, base)
    bad = base.clone()
    bad[0] += 1
    assert not layer.check(inp, bad, exp, p).ok


def test_activation_alone_runs_on_the_layers_fc1_output():
    p = {**BASE, "scope": "act", "op": "swiglu"}
    inp = layer.build_inputs(p, "cpu")
    b, base = run(inp, p)
    exp = layer.reference(inp, p)
    c = layer.check(inp, base, exp, p)
    assert c.ok, c.detail
    n_used = int(inp.n_used)
    assert 0 < exp.act_rows.sum() < n_used  # the padded op skips the alignment padding rows
    assert bool(inp.fc1_out[:n_used].any())  # the FC1 output the layer produced, not zeros
    _, out = run(inp, {**p, "act_variant": "capped", "act_grid_cap": 16})
    assert torch.equal(out, base)
    bad = base.clone()
    bad[n_used + 1] = 0
    assert not layer.check(inp, bad, exp, p).ok


def test_cpu_grouped_mm_and_the_loop_agree_with_empty_groups():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 32, generator=g).bfloat16()
    b = torch.randn(4, 24, 32, generator=g).bfloat16().transpose(1, 2)
    offs = torch.tensor([8, 8, 20, 36], dtype=torch.int32)
    fn, name = layer.grouped_mm_impl("cpu")
    loop, loop_name = layer.grouped_mm_impl("cpu", loop=True)
    assert "loop" in loop_name
    assert torch.equal(fn(a, b, offs)[:36], loop(a, b, offs)[:36])
    assert torch.equal(loop(a, b, offs)[8:20], a[8:20] @ b[2])  # group 1 is empty
    assert torch.equal(loop(a, b, offs)[20:36], a[20:36] @ b[3])


def test_cuda_grouped_mm_choice(monkeypatch):
    a = torch.ones(16, 8, dtype=torch.bfloat16)
    b = torch.ones(2, 8, 8, dtype=torch.bfloat16)
    offs = torch.tensor([8, 16], dtype=torch.int32)
    fn, name = layer.grouped_mm_impl("cuda")
    assert name == "torch.nn.functional.grouped_mm"
    assert torch.equal(fn(a, b, offs), a @ b[0])  # called as the step calls it (torch's CPU kernel stands in)
    monkeypatch.delattr(torch.nn.functional, "grouped_mm")
    fn, name = layer.grouped_mm_impl("cuda")
    assert name == "torch._grouped_mm" and torch.equal(fn(a, b, offs), a @ b[0])
    monkeypatch.delattr(torch, "_grouped_mm")
    with pytest.raises(Unavailable, match="grouped_mm"):
        layer.grouped_mm_impl("cuda")


def test_the_upstream_arm_is_unavailable_here_and_the_session_says_so():
    if sys.version_info >= (3, 12):
        pytest.skip("megatron-core may be importable on Python >= 3.12")
    p = {**BASE, "op": "squared_relu"}
    with pytest.raises(Unavailable, match="mcore_fused_moe"):
        FAM.builder("mcore")(layer.build_inputs(p, "cpu"), p, DEV)
    from moebench.core.cases import expand
    from moebench.core.pipeline import CasePipeline, Options
    from moebench.core.spec import load_spec

    spec = load_spec("layer")
    (case,) = [c for c in expand(spec, quick=True) if c.variant == "mcore"]
    rec = CasePipeline(spec, DEV, Options(timing=spec.timing, time_it=False), environ={}).run_case(case)
    assert rec.status == "unavailable" and "install megatron-core" in rec.error


def _fake_megatron(monkeypatch, calls):
    """A stand-in for megatron.core.inference.moe.fused_moe: the reference math, written where
    mcore_fused_moe writes (out rows below the valid tokens)."""
    mod = types.ModuleType("fake_fused_moe")

    class ActivationType:
        SQUARED_RELU = "squared_relu"

    def mcore_fused_moe(hidden_states, probs, fc1_weight, fc2_weight, activation_type, num_local_experts,
                        local_expert_start, valid_tokens, routing_map, disable_fused_quant_kernels=False, out=None):
        calls.append({"activation_type": activation_type, "num_local_experts": num_local_experts,
                      "local_expert_start": local_expert_start})
        v = int(valid_tokens.item())
        params = {**BASE, "op": "squared_relu", "local_experts": num_local_experts,
                  "local_expert_start": local_expert_start}
        o, _ = layer.moe_ref(hidden_states[:v], routing_map[:v], probs[:v], fc1_weight, fc2_weight, params)
        out[:v] = o.float()
        return out

    mcore_fused_moe.__module__ = mod.__name__
    mod.ActivationType, mod.mcore_fused_moe = ActivationType, mcore_fused_moe
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    from moebench.sources import upstream

    monkeypatch.setattr(upstream, "load", lambda name: mcore_fused_moe)
    monkeypatch.setattr(upstream, "status", lambda name: types.SimpleNamespace(source="megatron-core (stand-in)"))


def test_the_upstream_arm_with_a_stand_in_is_checked_against_the_reference_only(monkeypatch, tmp_path):
    calls = []
    _fake_megatron(monkeypatch, calls)
    spec_path = tmp_path / "layer-mcore.yaml"
    spec_path.write_text("""
name: layer-mcore
family: layer
model: qwen3-30b-a3b
variants:
  - {variant: mcore}
  - {variant: step, params: {count_variant: persistent, count_block_size: 128, act_variant: legacy}}
baseline: {variant: step, count_variant: persistent, count_block_size: 1024, act_variant: legacy}
fixed: {tokens: 13, buffer_tokens: 16, num_experts: 16, topk: 4, local_experts: 4, local_expert_start: 4,
        hidden: 64, ffn: 32, align: 4, op: squared_relu, count_grid: 4, layers: 2}
""")
    from moebench.core.cases import expand
    from moebench.core.pipeline import CasePipeline, Options
    from moebench.core.spec import load_spec

    spec = load_spec(str(spec_path))
    session = CasePipeline(spec, DEV, Options(timing=spec.timing, time_it=False), environ={})
    mcore, ours = [session.run_case(c) for c in expand(spec)]
    assert mcore.status == "ok", mcore.error
    assert mcore.checks["baseline_equal"] is None and "atomics" in mcore.checks["baseline_skipped"]
    assert len(calls) == 2 and calls[0] == {"activation_type": "squared_relu", "num_local_experts": 4,
                                            "local_expert_start": 4}  # 2 layers, one checked launch (it compiles)
    assert ours.status == "ok" and ours.checks["baseline_equal"] is True
    assert ours.launch["count_block_size"] == 128 and ours.launch_from["count_block_size"] == "spec"
    # the arm needs megatron-core's op: anything else is an error naming what to set
    bad = {**BASE, "op": "silu_mul_bounded"}
    with pytest.raises(ValueError, match="op: squared_relu"):
        FAM.builder("mcore")(layer.build_inputs(bad, "cpu"), bad, DEV)


def test_the_drivers_environment_reaches_the_delegates_and_a_bad_switch_stops_the_run_first(tmp_path, monkeypatch):
    """The kill switches of the layer's count and act variants come from the environment the run
    driver was given (not os.environ), are resolved once per case, and are checked before any case."""
    monkeypatch.setenv("MCORE_COUNT_TOKENS_BLOCK", "256")  # what the process has: not what the run was given
    spec_path = tmp_path / "layer-env.yaml"
    spec_path.write_text("""
name: layer-env
family: layer
model: qwen3-30b-a3b
variants: [{variant: step, params: {count_variant: shipped, act_variant: shipped}}]
baseline: {variant: step, count_variant: persistent, count_block_size: 1024, act_variant: legacy}
fixed: {tokens: 13, buffer_tokens: 16, num_experts: 16, topk: 4, local_experts: 4, local_expert_start: 4,
        hidden: 64, ffn: 32, align: 4, count_grid: 4, layers: 1}
""")
    from moebench.core.cases import expand
    from moebench.core.driver import Driver, Finished
    from moebench.core.pipeline import Options
    from moebench.core.spec import load_spec
    from moebench.errors import UsageError

    spec = load_spec(str(spec_path))
    env = {"MCORE_COUNT_TOKENS_BLOCK": "64", "MCORE_MOE_ACTIVATION_GRID_CAP": "16"}
    drv = Driver(spec, DEV, Options(timing=spec.timing, time_it=False), environ=env)
    recs = [ev.record for ev in drv.run(expand(spec)) if isinstance(ev, Finished)]
    assert len(recs) == 1 and recs[0].status == "ok", recs[0].error
    assert recs[0].launch["count_block_size"] == 64
    assert recs[0].launch_from["count_block_size"] == "$MCORE_COUNT_TOKENS_BLOCK"
    assert recs[0].launch["act_num_blocks"] == 16
    bad = Driver(spec, DEV, Options(timing=spec.timing, time_it=False), environ={"MCORE_COUNT_TOKENS_BLOCK": "abc"})
    with pytest.raises(UsageError, match="MCORE_COUNT_TOKENS_BLOCK"):
        next(bad.run(expand(spec)))


def test_the_delegated_launch_parameters_follow_the_count_and_act_families():
    count, act = get_family("count"), get_family("act")
    want = (("count_variant",) + tuple(f"count_{n}" for n in count.launch_params) + ("act_variant",)
            + tuple(f"act_{n}" for n in act.launch_params))
    assert FAM.variants["step"].params == want  # the decorator's literal list must keep up
    assert FAM.params["count_variant"].default in count.variants
    assert FAM.params["act_variant"].default in act.variants
    for n in count.launch_params:
        assert FAM.params[f"count_{n}"].default == count.params[n].default


def test_graph_size_and_layers_per_launch():
    decode = {**BASE, "hidden": 2048, "ffn": 768, "local_experts": 32, "topk": 8}
    assert 10 <= catalogue.graph_launches(decode, 200) <= 30  # ~100 µs steps: ~2 ms per replay
    assert catalogue.graph_launches({**decode, "layers": 48}, 200) == 1
    assert catalogue.graph_launches({**decode, "scope": "count"}, 200) == 200
    assert catalogue.layers_per_launch({**decode, "layers": 48}) == 48
    assert catalogue.layers_per_launch({**decode, "scope": "act"}) == 1


@pytest.mark.parametrize("yaml_bits,message", [
    ("axes: {scope: [count], layers: [2]}", "one layer's tensors"),
    ("fixed: {hidden: 100}", "multiples of 8"),
    ("fixed: {count_variant: nope}", "expected one of"),
])
def test_spec_errors(tmp_path, yaml_bits, message):
    from moebench.core.cases import expand
    from moebench.core.spec import load_spec
    from moebench.errors import SpecError

    path = tmp_path / "x.yaml"
    path.write_text(f"""
name: x
family: layer
model: qwen3-30b-a3b
variants: [step]
baseline: {{variant: step}}
fixed: {{tokens: 4, buffer_tokens: 8}}
{yaml_bits}
""".replace("fixed: {tokens: 4, buffer_tokens: 8}\nfixed: {", "fixed: {tokens: 4, buffer_tokens: 8, "))
    with pytest.raises(SpecError, match=message):
        expand(load_spec(str(path)))


class FakeRunner:
    """Times a layer case as the H200 might: the count kernel alone saves 3.2 µs, a layer step
    2.5 µs, a 48-layer graph 110 µs. Made per arm with that arm's environment, as a run driver is."""

    def __init__(self, environ):
        self.n = 0

    def run_case(self, case):
        p = case.params
        on = p["count_block_size"] == 128
        base = {"count": 5.1, "step": 100.0}[p["scope"]] * (p["layers"] if p["scope"] == "step" else 1)
        saving = {"count": 3.2, "step": 2.5}[p["scope"]] if p["layers"] == 1 else 110.0
        self.n += 1
        jitter = 0.01 * (self.n % 3)  # the same spread on both sides
        return Record("layer-count", "layer", case.id, case.variant, case.label, "ok", params=dict(p),
                      timing={"median_us": base - (saving if on else 0.0) + jitter})


def test_an_ab_over_the_scopes_gives_the_conversion_table():
    from moebench.core.cases import expand
    from moebench.core.spec import load_spec

    spec = load_spec("layer-count")
    off = [parse_setting("count_block_size=1024", spec.family, "--off")]
    on = [parse_setting("count_block_size=128", spec.family, "--on")]
    pairs, notes = ab_pairs(spec, expand(spec), off, on)
    assert [p.text for p in pairs] == ["layers=1, scope=count", "layers=1, scope=step", "layers=48, scope=step"]
    records = run_arms(pairs, off, on, arms=4, iters=3, make_runner=FakeRunner)
    assert {r.timing["ab_side"] for r in records} == {OFF, ON}
    from moebench.report.sections import ab_section
    from moebench.report.sections.layer import conversions

    (conv,) = conversions(records)
    assert conv.kernel == "count" and conv.layers == 48
    assert conv.conversion == pytest.approx(2.5 / 3.2, abs=0.01)
    assert conv.projection == pytest.approx(-48 * 3.2, abs=0.5)
    assert conv.many_vs_projection == pytest.approx(110 / (48 * 3.2), abs=0.01)
    md = ab_section(spec.family, records)
    assert "### What the saving is worth in the layer" in md
    assert "| count: -3.2" in md and "| 0.78 |" in md and "48: -110.0" in md
    # the per-step column: the kernel and the one-layer step are projected x 48, the 48-layer graph is measured
    from moebench.core.baseline import launch_layers

    table = ab_markdown(spec_name="layer-count", device="H200", off=off, on=on, arms=4, iters=3, pairs=pairs,
                        layers=48, timer_text="", per_launch=lambda p: launch_layers(spec.family, p.off.params))
    assert "| -153.6 µs |" in table and "| -120.0 µs |" in table and "| -110.0 µs |" in table
    assert "one launch is the whole 48-layer step" in table


def test_ab_command_on_the_layer_family_runs_the_kernels_and_appends_the_conversion(tmp_path, monkeypatch,
                                                                                      capsys):
    """`moebench ab layer-count --quick` end to end: real kernels under the interpreter, each case
    checked, with a stand-in for the GPU timer (the only part that needs a GPU)."""
    import moebench.core.device as device
    from moebench.core.placements import Timed, Timer
    from clirun import run_cli

    monkeypatch.setattr(device, "want_interpreter", lambda requested: False)
    monkeypatch.setattr(device, "detect", lambda interpret: DEV)
    monkeypatch.setattr(device, "require_triton", lambda: None)

    def timed(self, case, rec, builts, **kw):
        p = case.params
        base = 5.0 if p["scope"] == "count" else 100.0 * p["layers"]
        saving = 3.0 if p["scope"] == "count" else 2.0 * p["layers"]
        rec.timing["median_us"] = base - (saving if p["count_block_size"] == 128 else 0.0)
        return Timed(builts, estimate_us=rec.timing["median_us"])

    monkeypatch.setattr(Timer, "time", timed)  # the timer every arm's driver builds
    spec = tmp_path / "layer-count.yaml"  # sweeps/layer-count.yaml's quick shape, with interpreter-sized grids
    spec.write_text("""
name: layer-count
family: layer
model: qwen3-30b-a3b
variants: [{variant: step, label: layer}]
baseline: {variant: step, count_block_size: 1024, act_variant: capped, act_grid_cap: 16}
axes: {scope: [count, step], layers: [1, 2], count_block_size: [1024, 128]}
where: scope == 'step' or layers == 1
fixed: {tokens: 13, buffer_tokens: 16, num_experts: 16, topk: 4, local_experts: 4, local_expert_start: 4,
        hidden: 64, ffn: 32, align: 4, count_grid: 4, act_variant: capped, act_grid_cap: 16}
""")
    code, out, err = run_cli(["ab", str(spec), "--off", "count_block_size=1024", "--on", "count_block_size=128",
                              "--arms", "2", "--iters", "2", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    md = (tmp_path / DEV.slug / "layer-count-ab.md").read_text()
    assert "### What the saving is worth in the layer" in md
    assert "| count: -3.000" in md and "| 0.67 |" in md  # 2 µs of 3 survive in the step
    # per step: the kernel and one step x 48; the 2-layer step is 24 launches of -4 µs
    assert "| layers=1, scope=count | 5.000 | 2.000 |" in md and "| -144.0 µs |" in md
    assert "| layers=2, scope=step | 200.000 | 196.000 | -4.000 |" in md and "one launch per 2 layers" in md


@pytest.mark.parametrize("op", ["silu_mul_bounded", "swiglu"])
def test_the_activation_alone_through_the_session(tmp_path, op):
    """scope act through CasePipeline.run_case, as `ab layer-act` runs it: the reference reads the FC1
    output the builder writes, so it must come after the build (on the H200 a reference taken
    first saw no rows in use and failed every row the kernel wrote)."""
    from moebench.core.cases import expand
    from moebench.core.pipeline import CasePipeline, Options
    from moebench.core.spec import load_spec

    spec_path = tmp_path / "layer-act.yaml"
    spec_path.write_text(f"""
name: layer-act
family: layer
model: qwen3-30b-a3b
variants: [{{variant: step, label: layer}}]
baseline: {{variant: step, act_variant: legacy}}
axes: {{act_variant: [legacy, capped]}}
fixed: {{tokens: 13, buffer_tokens: 16, num_experts: 16, topk: 4, local_experts: 4, local_expert_start: 4,
        hidden: 64, ffn: 32, align: 4, count_grid: 4, act_grid_cap: 16, scope: act, op: {op}}}
""")
    spec = load_spec(str(spec_path))
    session = CasePipeline(spec, DEV, Options(timing=spec.timing, time_it=False), environ={})
    recs = [session.run_case(c) for c in expand(spec)]
    assert [r.status for r in recs] == ["ok", "ok"], [r.error for r in recs]
    assert all(r.checks["baseline_equal"] for r in recs)
    assert recs[0].checks["rows_written"] > 0 and recs[0].checks["rows_written"] <= recs[0].checks["rows_in_use"]


def test_in_the_layer_names_each_cap_and_calls_overlapping_fastest_a_tie():
    """layer.md's "In the layer": a label swept over act_grid_cap names the cap, and two caps whose
    intervals overlap are both marked **tie** (the page once marked one **fastest** at 173.71 vs 173.71)."""
    from moebench.report.sections import layer as layer_sections

    shape = {"tokens": 256, "buffer_tokens": 256, "local_experts": 32, "op": "silu_mul_bounded"}

    def r(label, cap, us, noise):
        return Record("layer", "layer", f"{label}{cap}", "step", label, "ok",
                      params={**shape, "act_variant": "capped", "act_grid_cap": cap},
                      launch={"count_variant": "persistent", "count_block_size": 128, "act_variant": "capped"},
                      timing={"median_us": us, "rel_noise": noise})

    recs = [r("before", 512, 177.0, 0.0005), r("count 128, act cap", 1024, 173.71, 0.0004),
            r("count 128, act cap", 2048, 173.72, 0.0004)]
    md = layer_sections.markdown_sections(recs)
    assert "| count 128, act cap, act_grid_cap=1024 **tie** | 173.71 | 0.07 |" in md
    assert "| count 128, act cap, act_grid_cap=2048 **tie** | 173.72 |" in md
    assert "**fastest**" not in md and "do not say which of them is faster" in md
    recs[2].timing["median_us"] = 175.0
    md = layer_sections.markdown_sections(recs)
    assert "| count 128, act cap, act_grid_cap=1024 **fastest** |" in md and "**tie**" not in md


def test_a_plugin_count_variant_runs_inside_the_layer(tmp_path):
    """count_variant names any variant the count family has when the spec is read, a plugin's
    included (examples/plugins/count_histogram.py): the step with the histogram count is bit-exact
    with the baseline step and matches the reference; without the plugin the name is refused with
    exit 2 listing the variants there are."""
    import json
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = tmp_path / "layer-hist.yaml"
    spec.write_text(f"""
name: layer-hist
family: layer
plugins: [{root / 'examples' / 'plugins' / 'count_histogram.py'}]
model: qwen3-30b-a3b
variants:
  - {{variant: step, label: hist, params: {{count_variant: histogram, count_block_size: 64}}}}
baseline: {{variant: step, count_variant: persistent, count_block_size: 1024, act_variant: legacy}}
fixed: {{tokens: 13, buffer_tokens: 16, num_experts: 16, topk: 4, local_experts: 4, local_expert_start: 4,
        hidden: 64, ffn: 32, align: 4, count_grid: 4, act_variant: legacy, layers: 1}}
""")
    env = {k: v for k, v in os.environ.items() if k != "MOEBENCH_PLUGINS"}
    env.update(TRITON_INTERPRET="1", COLUMNS="200", PYTHONPATH=str(root))

    def moebench(*args):
        return warm.run(args, cwd=root, env=env, timeout=600)

    r = moebench("sweep", spec, "--interpret", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    doc = json.loads(next((tmp_path / "out").rglob("layer-hist.json")).read_text())
    hist = [x for x in doc["records"] if x["launch"].get("count_variant") == "histogram"]
    assert hist and all(x["status"] == "ok" for x in doc["records"]), [x["error"] for x in doc["records"]]
    assert hist[0]["checks"]["baseline_equal"] and hist[0]["checks"]["ref_check"]
    assert hist[0]["launch"]["count_chunking"] == "strided"  # the plugin's own geometry, so its builder ran
    assert hist[0]["launch"]["count_block_size"] == 64
    spec.write_text(spec.read_text().replace(f"plugins: [{root / 'examples' / 'plugins' / 'count_histogram.py'}]\n",
                                             ""))
    r = moebench("validate", spec)
    assert r.returncode == 2 and "count_variant" in r.stderr and "histogram" in r.stderr
    assert "persistent" in r.stderr and "Traceback" not in r.stderr
