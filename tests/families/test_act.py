"""Activation family (seed 001) under the Triton interpreter, on tiny shapes: each op against the
torch reference, every grid policy bit-exact with every other, rows past the live bound and
padding rows left poisoned, a check that is not vacuous and that can fail, and the spec rules."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton or a kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from moebench.core.cases import expand  # noqa: E402
from moebench.errors import SpecError, UsageError  # noqa: E402
from moebench.core.family import get_family  # noqa: E402
from moebench.families.act import widths  # noqa: E402
from moebench.families.act import kernels as act  # noqa: E402
from moebench.core.spec import load_spec  # noqa: E402

OPS = ("silu_mul_bounded", "swiglu", "squared_relu")
FAM = get_family("act")


def params(**over) -> dict:
    p = {"op": "silu_mul_bounded", "rows": 24, "live_rows": 11, "ffn": 40, "in_cols": 0, "pad_frac": 0.25,
         "seed": 3, "grid_cap": 8192, "num_warps": 4}
    p.update(over)
    return p


def build(variant: str, inp, p: dict, env=None):
    """A variant's launch, its parameters resolved as the session resolves them."""
    q, _ = FAM.resolve(variant, p, None, env or {})
    return FAM.builder(variant)(inp, q, None)


def run(variant: str, inp, p: dict, env=None):
    built = build(variant, inp, p, env)
    built.reset()
    built.launch()
    return built


def poisoned(rows: torch.Tensor) -> torch.Tensor:
    """(R, N) bf16 -> (R,) bool: the row holds the poison in every element."""
    return (rows.view(torch.int16) == act._POISON_BITS).all(dim=1)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (act.ordered_bits(a) - act.ordered_bits(b)).abs()


# ----------------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("op", OPS)
def test_matches_torch_reference_within_one_ulp(op):
    p = params(op=op)
    inp = act.build_inputs(p, "cpu")
    out = run("capped", inp, p).output
    work = inp.work_rows
    ref = act.activation_ref(inp.x[work], op, inp.n_cols)
    d = ulps(out[work], ref)
    assert int(d.max()) <= 1
    assert not torch.isnan(out[work]).any()
    chk = act.check(inp, out, act.reference(inp, p), p)
    assert chk.ok, chk.detail
    assert chk.detail == "exact" or chk.detail.startswith("max 1 ulp (")


@pytest.mark.parametrize("op", OPS)
def test_grid_policies_are_bit_exact(op):
    """legacy min(M, 512), capped at 4 (3 rows per CTA), at 8192 (more CTAs than rows) and
    shipped: the same bits."""
    p = params(op=op)
    inp = act.build_inputs(p, "cpu")
    base = run("legacy", inp, p).output.clone()
    for variant, cap in (("capped", 4), ("capped", 8192), ("live-bound", 4), ("live-bound", 8192),
                         ("shipped", None)):
        b = run(variant, inp, dict(p, grid_cap=cap), {"MCORE_MOE_ACTIVATION_GRID_CAP": "8"})
        assert torch.equal(b.output, base), (variant, cap, b.geometry)
    assert b.geometry["num_blocks"] == 8


@pytest.mark.parametrize("variant", ["capped", "live-bound"])
@pytest.mark.parametrize("op", OPS)
def test_rows_past_live_and_padding_rows_stay_poisoned(op, variant):
    p = params(op=op, pad_frac=0.3)
    inp = act.build_inputs(p, "cpu")
    out = run(variant, inp, dict(p, grid_cap=4)).output
    V = p["live_rows"]
    assert poisoned(out[V:]).all()
    if op == "silu_mul_bounded":
        assert inp.perm is None and inp.work_rows[:V].all()
    else:
        pad = inp.perm == -1
        assert pad[:V].any(), "the map must put padding rows below the live bound"
        assert torch.equal(inp.work_rows, (torch.arange(p["rows"]) < V) & ~pad)
        assert poisoned(out[:V][pad[:V]]).all()
    assert not poisoned(out[inp.work_rows]).any()


@pytest.mark.parametrize("op", OPS)
def test_check_is_not_vacuous(op):
    p = params(op=op)
    inp = act.build_inputs(p, "cpu")
    out = run("legacy", inp, p).output
    nv = act.nonvacuity(inp, out, p)
    n_work = int(inp.work_rows.sum())
    assert n_work > 0
    assert nv["rows_written"] == n_work
    assert nv["rows_poisoned_ok"] == p["rows"] - n_work
    assert nv["nonzero_out"] > 0
    assert inp.x.abs().sum() > 0  # seeded random inputs, never zeros


@pytest.mark.parametrize("op", ("silu_mul_bounded", "swiglu"))
def test_check_fails_on_a_corrupted_output(op):
    p = params(op=op)
    inp = act.build_inputs(p, "cpu")
    expected = act.reference(inp, p)
    built = run("capped", inp, p)
    out = built.output
    assert act.check(inp, out, expected, p).ok
    live = torch.nonzero(inp.work_rows).flatten()
    idle = torch.nonzero(~inp.work_rows).flatten()

    bits = out.view(torch.int16)
    keep = out.clone()
    bits[live[2], 5] += 2  # two ulps off
    chk = act.check(inp, out, expected, p)
    assert not chk.ok and "max 2 ulp > 1" in chk.detail

    out.copy_(keep)
    out[idle[0], 0] = 1.0  # a row past the live bound (or a padding row) written
    chk = act.check(inp, out, expected, p)
    assert not chk.ok and "1 rows past the live bound or padded were written" in chk.detail

    out.copy_(keep)
    bits[live[0]] = act._POISON_BITS  # a live row never written
    chk = act.check(inp, out, expected, p)
    assert not chk.ok and "live rows never written" in chk.detail

    out.copy_(keep)
    inp.out_buf[0, 0] = 0.0  # a guard row
    chk = act.check(inp, out, expected, p)
    assert not chk.ok and "guard rows" in chk.detail


def test_reset_poisons_the_whole_output():
    p = params()
    inp = act.build_inputs(p, "cpu")
    built = run("capped", inp, p)
    assert not poisoned(built.output).all()
    built.reset()
    assert poisoned(inp.out_buf).all()


@pytest.mark.parametrize("launcher", ["act_rows", "act_rows_live_bound"])
@pytest.mark.parametrize("op", OPS)
def test_inner_column_loop(op, launcher):
    """N = 40 in 16-column chunks (three, the last masked) gives the same bits as one chunk."""
    p = params(op=op)
    inp = act.build_inputs(p, "cpu")
    whole = run("capped", inp, p).output.clone()
    inp.out_buf.view(torch.int16).fill_(act._POISON_BITS)
    getattr(act, launcher)(inp, 4, 16, 4)()
    assert torch.equal(inp.out, whole)


def test_the_loop_bound_is_in_the_work_model():
    """The seed kernel walks every row slot to the capacity M; live-bound stops at the live rows."""
    p = params(rows=16384, live_rows=256, ffn=768)
    geo = {"num_blocks": 512, "block_n": 1024, "num_warps": 4, "n_cols": 768, "in_cols": 1536}
    assert act.work(p, dict(geo, loop_bound="capacity"), None)["loop_iters_per_cta"] == 32
    assert act.work(p, dict(geo, loop_bound="live"), None)["loop_iters_per_cta"] == 1
    assert act.work(dict(p, live_rows=0), dict(geo, loop_bound="capacity"), None)["loop_iters_per_cta"] == 0


def test_in_cols_sets_the_widths():
    assert widths(params(op="swiglu", in_cols=0)) == (80, 40)
    assert widths(params(op="swiglu", in_cols=48)) == (48, 24)
    assert widths(params(op="squared_relu", in_cols=0)) == (40, 40)
    assert widths(params(op="squared_relu", in_cols=33)) == (33, 33)
    p = params(op="squared_relu", in_cols=33, live_rows=5)
    inp = act.build_inputs(p, "cpu")
    assert inp.x.shape == (24, 33) and inp.out.shape == (24, 33)
    chk = act.check(inp, run("capped", inp, p).output, act.reference(inp, p), p)
    assert chk.ok, chk.detail


def test_no_live_rows_writes_nothing():
    p = params(live_rows=0)
    inp = act.build_inputs(p, "cpu")
    out = run("capped", inp, p).output
    assert poisoned(out).all()
    assert act.check(inp, out, act.reference(inp, p), p).ok


# ----------------------------------------------------------------------------------- geometry


def test_grid_policies():
    assert act.capped_blocks(16384, 8192) == 8192
    assert act.capped_blocks(1000, 8192) == 1024
    assert act.capped_blocks(16384, 512) == act.legacy_blocks(16384) == 512
    assert act.legacy_blocks(100) == 100
    assert act.capped_blocks(100, 512) == 128  # the kill switch differs from legacy below 512 rows
    assert act.block_n(768) == 1024 and act.block_n(96) == 128 and act.block_n(3000) == 1024


def test_shipped_reads_the_env_cap():
    p = params(rows=2048)
    inp = act.build_inputs(dict(p, rows=2048, live_rows=1), "cpu")
    assert build("shipped", inp, p, {}).geometry["num_blocks"] == 2048
    assert build("shipped", inp, p, {"MCORE_MOE_ACTIVATION_GRID_CAP": "512"}).geometry["num_blocks"] == 512
    with pytest.raises(UsageError, match="power of two"):
        build("shipped", inp, p, {"MCORE_MOE_ACTIVATION_GRID_CAP": "500"})


def test_work_model_at_the_decode_shape():
    """The PR's numbers: 2048 live rows x (1536 + 768) bf16 = 9.44 MB; 8192 x 128 vs 512 x 128."""
    p = params(rows=16384, live_rows=2048, ffn=768)
    geo = {"num_blocks": 8192, "block_n": 1024, "num_warps": 4, "n_cols": 768, "in_cols": 1536}
    w = act.work(p, geo, None)
    assert w["bytes"] == 2048 * (1536 + 768) * 2 + 4
    assert (w["ctas"], w["ctas_with_work"], w["threads_per_cta"], w["rows_per_cta"]) == (8192, 2048, 128, 1)
    w = act.work(p, dict(geo, num_blocks=512), None)
    assert (w["ctas"], w["ctas_with_work"], w["rows_per_cta"]) == (512, 512, 4)
    # squared ReLU reads N per row; a quarter of the rows below V are padding, each reads its map entry
    w = act.work(dict(p, op="squared_relu"), dict(geo, in_cols=768), None)
    assert w["rows_active"] == 1536
    assert w["bytes"] == 1536 * (768 + 768) * 2 + 4 + 2048 * 4


@pytest.mark.parametrize("frac", (0.0, 0.25, 0.3, 1.0))
def test_padding_count_matches_the_work_model(frac):
    pad = act.padding_rows(1000, frac)
    for live in (0, 1, 7, 333, 1000):
        assert int(pad[:live].sum()) == act.padded_below(live, frac)


# ----------------------------------------------------------------------------------- specs


SPEC = """\
name: t
family: act
model: qwen3-30b-a3b
variants: [{variant: capped, axes: {grid_cap: [64]}}, legacy]
baseline: {variant: legacy}
axes:
  live_rows: [7, 40]
fixed:
  rows: 64
"""


def spec_file(tmp_path, extra: str = "", body: str = SPEC):
    path = tmp_path / "t.yaml"
    path.write_text(body + extra)  # extra: more `fixed:` lines, indented
    return str(path)


def test_a_good_spec_expands(tmp_path):
    cases = expand(load_spec(spec_file(tmp_path)))
    assert len(cases) == 4
    assert {c.params["ffn"] for c in cases} == {768}  # moe_ffn from the model config
    assert {c.params["grid_cap"] for c in cases} == {64, None}


def test_cap_not_a_power_of_two_is_a_spec_error(tmp_path):
    body = SPEC.replace("grid_cap: [64]", "grid_cap: [64, 96]")
    with pytest.raises(SpecError, match=r"grid_cap\[1\]: must be a power of two, got 96"):
        load_spec(spec_file(tmp_path, body=body))


def test_live_rows_above_capacity_is_a_spec_error(tmp_path):
    spec = load_spec(spec_file(tmp_path, body=SPEC.replace("[7, 40]", "[7, 65]")))
    with pytest.raises(SpecError, match="must not exceed the capture-time row capacity"):
        expand(spec)


@pytest.mark.parametrize("op", ("silu_mul_bounded", "swiglu"))
def test_odd_input_width_of_a_gated_op_is_a_spec_error(tmp_path, op):
    spec = load_spec(spec_file(tmp_path, f"  op: {op}\n  in_cols: 1535\n"))
    with pytest.raises(SpecError, match="in_cols must be even"):
        expand(spec)


def test_odd_input_width_is_fine_for_squared_relu(tmp_path):
    cases = expand(load_spec(spec_file(tmp_path, "  op: squared_relu\n  in_cols: 1535\n")))
    assert {c.params["in_cols"] for c in cases} == {1535}


@pytest.mark.parametrize("name", ("act-grid", "act-grid-rows"))
def test_builtin_specs_expand(name):
    spec = load_spec(name)
    assert spec.baseline == {"variant": "legacy"}
    for kw in ({}, {"quick": True}):
        assert expand(spec, **kw)
    if spec.verify:
        assert len(expand(spec, verify=True)) == 180
        assert expand(spec, verify=True, quick=True)


def test_quick_sweep_runs_clean():
    """The CI smoke shape through the runner: every case verified and equal to legacy."""
    from moebench.core.device import detect
    from moebench.core.pipeline import CasePipeline, Options

    spec = load_spec("act-grid-rows")
    runner = CasePipeline(spec, detect(True), Options(timing=spec.timing, time_it=False))
    recs = [runner.run_case(c) for c in expand(spec, quick=True)]
    assert [r.status for r in recs] == ["ok"] * len(recs), [r.error for r in recs]
    assert all(r.checks["baseline_equal"] for r in recs)
    assert all(r.checks["rows_written"] == 12 for r in recs)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("live", [0, 5, 37])
@pytest.mark.parametrize("tile_rows,tile_cols,cap", [(1, 32, 4), (4, 64, 512), (8, 16, 3)])
def test_tiled_variant_bit_exact_with_legacy(live, tile_rows, tile_cols, cap, prefetch):
    from moebench.core.device import detect
    from moebench.families.act import kernels as A

    dev = detect(True)
    p = {"op": "silu_mul_bounded", "rows": 40, "live_rows": live, "ffn": 96, "in_cols": 0, "pad_frac": 0.25,
         "seed": 5, "grid_cap": cap, "num_warps": 4, "tile_rows": tile_rows, "tile_cols": tile_cols,
         "prefetch": prefetch}
    inp = A.build_inputs(p, "cpu")
    legacy = FAM.builder("legacy")(inp, p, dev)
    legacy.reset()
    legacy.launch()
    want = legacy.output.clone()
    tiled = FAM.builder("tiled")(inp, p, dev)
    tiled.reset()
    tiled.launch()
    assert torch.equal(tiled.output, want)
    chk = A.check(inp, tiled.output, A.reference(inp, p), p)
    assert chk.ok, chk.detail
    if live:
        assert A.nonvacuity(inp, tiled.output, p)["rows_written"] == live
