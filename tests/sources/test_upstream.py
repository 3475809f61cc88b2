"""Upstream kernels: where they would come from (no import, no torch), and the whole path from a
Megatron-LM checkout to an `upstream` record, with a stand-in checkout written here.

The stand-in kernels are this test's own code. They have Megatron's names and argument names,
which is all moebench relies on, so the test exercises the import from a checkout, the launch by
argument name and the bit-exact check against the seed baseline under the interpreter."""

import json
import os
from pathlib import Path

import pytest

import warm

from moebench.sources import upstream

ROOT = Path(__file__).resolve().parents[2]

PERMUTE = '''
import triton
import triton.language as tl


@triton.jit
def _count_local_tokens_kernel_persistent(routing_map_ptr, tokens_per_expert_ptr, valid_tokens_ptr, topk,
                                          local_expert_start, num_local_experts: tl.constexpr, num_sms,
                                          BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    n = tl.load(valid_tokens_ptr) * topk
    for start in tl.range(pid * BLOCK_SIZE, n, num_sms * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        m = offs < n
        e = tl.load(routing_map_ptr + offs, mask=m, other=-1) - local_expert_start
        tl.atomic_add(tokens_per_expert_ptr + e, 1, mask=m & (e >= 0) & (e < num_local_experts))


@triton.jit
def _count_local_tokens_kernel(routing_map_ptr, tokens_per_expert_ptr, valid_tokens_ptr, topk, local_expert_start,
                               num_local_experts: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < tl.load(valid_tokens_ptr) * topk
    e = tl.load(routing_map_ptr + offs, mask=m, other=-1) - local_expert_start
    tl.atomic_add(tokens_per_expert_ptr + e, 1, mask=m & (e >= 0) & (e < num_local_experts))
'''

ACTIVATIONS = '''
import triton
import triton.language as tl


@triton.jit
def _row(x_ptr, out_ptr, row, N, GATED: tl.constexpr, BLOCK_N: tl.constexpr):
    for n in tl.range(0, N, BLOCK_N):
        o = n + tl.arange(0, BLOCK_N)
        m = o < N
        if GATED:
            g = tl.load(x_ptr + row * 2 * N + o, mask=m).to(tl.float32)
            y = g * tl.sigmoid(g) * tl.load(x_ptr + row * 2 * N + N + o, mask=m).to(tl.float32)
        else:
            r = tl.maximum(tl.load(x_ptr + row * N + o, mask=m).to(tl.float32), 0.0)
            y = r * r
        tl.store(out_ptr + row * N + o, y.to(tl.bfloat16), mask=m)


@triton.jit
def _silu_mul_bounded_kernel(input_ptr, output_ptr, n_rows_ptr, N, max_rows, BLOCK_N: tl.constexpr,
                             NUM_BLOCKS: tl.constexpr):
    for row in tl.range(tl.program_id(0), tl.load(n_rows_ptr), NUM_BLOCKS):
        _row(input_ptr, output_ptr, row, N, True, BLOCK_N)


@triton.jit
def _swiglu_kernel(input_ptr, output_ptr, src_idx_ptr, n_used_ptr, N, max_rows, BLOCK_N: tl.constexpr,
                   NUM_BLOCKS: tl.constexpr):
    for row in tl.range(tl.program_id(0), tl.load(n_used_ptr), NUM_BLOCKS):
        if tl.load(src_idx_ptr + row) >= 0:
            _row(input_ptr, output_ptr, row, N, True, BLOCK_N)
'''

SPEC_COUNT = """
name: up-count
family: count
model: qwen3-30b-a3b
variants: [persistent, nonpersistent, upstream, upstream-nonpersistent]
baseline: {variant: persistent, block_size: 1024}
axes: {block_size: [16, 128], tokens: [0, 13, 40]}
fixed: {buffer_tokens: 48, grid: 5}
"""

SPEC_ACT = """
name: up-act
family: act
model: qwen3-30b-a3b
variants: [capped, upstream]
baseline: {variant: legacy}
axes: {op: [silu_mul_bounded, swiglu, squared_relu], grid_cap: [4, 64]}
fixed: {rows: 40, live_rows: 23, ffn: 24}
"""


def _checkout(root: Path, squared_relu: bool = False) -> Path:
    moe = root / "megatron" / "core" / "inference" / "moe"
    moe.mkdir(parents=True)
    for d in (root / "megatron", root / "megatron" / "core", root / "megatron" / "core" / "inference", moe):
        (d / "__init__.py").write_text("")
    (moe / "permute.py").write_text(PERMUTE)
    (moe / "activations.py").write_text(ACTIVATIONS)
    return root


def _sweep(tmp_path: Path, spec: str, env_extra: dict) -> tuple[int, dict, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    env = {k: v for k, v in os.environ.items() if k != upstream.ENV}
    env.update(env_extra, TRITON_INTERPRET="1", COLUMNS="200")
    r = warm.run(["sweep", path, "--out", tmp_path / "out", "--format", "json,md"], cwd=ROOT, env=env)
    files = list((tmp_path / "out").rglob("*.json"))
    doc = json.loads(files[0].read_text()) if files else {}
    return r.returncode, doc, r.stderr


def test_status_reads_source_text_only(tmp_path, monkeypatch):
    monkeypatch.setenv(upstream.ENV, str(_checkout(tmp_path)))
    assert upstream.status("count_persistent").present
    assert upstream.status("swiglu").present
    st = upstream.status("squared_relu")  # the stand-in checkout has no squared ReLU
    assert not st.present and "has no _squared_relu_kernel" in st.why and "_swiglu_kernel" in st.why
    monkeypatch.setenv(upstream.ENV, str(tmp_path / "nowhere"))
    assert "has no megatron.core.inference.moe.permute" in upstream.status("count").why


def test_unavailable_without_any_source(monkeypatch):
    monkeypatch.delenv(upstream.ENV, raising=False)
    if upstream.installed_version():
        pytest.skip("megatron-core is installed here")
    st = upstream.status("count_persistent")
    assert not st.present and upstream.ENV in st.why and "Python >= 3.12" in st.why


def test_count_upstream_from_a_checkout_matches_the_seed(tmp_path):
    code, doc, err = _sweep(tmp_path, SPEC_COUNT, {upstream.ENV: str(_checkout(tmp_path / "mlm"))})
    assert code == 0, err
    recs = doc["records"]
    up = [r for r in recs if r["variant"].startswith("upstream")]
    assert len(up) == 12 and all(r["status"] == "ok" for r in up), [r["error"] for r in up]
    assert all(r["checks"]["baseline_equal"] and r["checks"]["ref_check"] == "exact" for r in up)
    assert any(r["checks"]["counts_sum"] > 0 for r in up)  # not vacuous
    assert doc["provenance"]["upstream"]["megatron_lm"].endswith("mlm")


def test_act_upstream_from_a_checkout_and_a_missing_kernel(tmp_path):
    code, doc, err = _sweep(tmp_path, SPEC_ACT, {upstream.ENV: str(_checkout(tmp_path / "mlm"))})
    assert code == 0, err  # a missing kernel is unavailable, not a failure
    by = {}
    for r in doc["records"]:
        by.setdefault((r["variant"], r["params"]["op"]), []).append(r)
    for op in ("silu_mul_bounded", "swiglu"):
        assert all(r["status"] == "ok" and r["checks"]["baseline_equal"] for r in by[("upstream", op)])
    missing = by[("upstream", "squared_relu")]
    assert all(r["status"] == "unavailable" and "_squared_relu_kernel" in r["error"] for r in missing)
    assert all(r["status"] == "ok" for r in by[("capped", "squared_relu")])


def test_without_megatron_the_sweep_runs_and_exits_0(tmp_path):
    if upstream.installed_version():
        pytest.skip("megatron-core is installed here")
    code, doc, err = _sweep(tmp_path, SPEC_COUNT, {})
    assert code == 0, err
    st = {r["variant"]: r["status"] for r in doc["records"]}
    assert st["persistent"] == "ok" and st["upstream"] == "unavailable"
    assert "unavailable" in err and upstream.ENV in err


def test_twins_section_and_conformance_page(tmp_path):
    """The page of a run with upstream variants pairs each with the seed kernel at the same launch;
    `moebench conformance` writes the combined csv/json/md."""
    code, doc, err = _sweep(tmp_path, SPEC_COUNT, {upstream.ENV: str(_checkout(tmp_path / "mlm"))})
    assert code == 0, err
    text = next((tmp_path / "out").rglob("up-count.md")).read_text()
    assert "## Beside the upstream kernel" in text and "12/12 bit-exact" in text
    res = next((tmp_path / "out").rglob("up-count.json"))
    r = warm.run(["conformance", res, "-o", tmp_path / "conf"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "conf.md").read_text()
    assert "12 twin pairs" in page and "No timings" in page
    assert json.loads((tmp_path / "conf.json").read_text())["pairs"][0]["bit_exact"] is True


def test_a_failed_twin_is_a_pair_that_is_not_bit_exact_and_a_file_given_twice_counts_once(tmp_path):
    """A pair whose upstream case failed its check was once dropped: "69 twin pairs, 69 bit-exact",
    exit 0. Given twice, a file once counted every pair twice."""
    from moebench.core.records import load_results
    from moebench.report.conformance import twins

    n = len(twins(load_results(ROOT / "results" / "h200" / "count-grid.json")[1]))
    doc = json.loads((ROOT / "results" / "h200" / "count-grid.json").read_text())
    bad = next(r for r in doc["records"] if r["variant"] == "upstream")
    bad.update(status="mismatch", error="counts differ")
    bad["checks"].update(ref_check="mismatch")  # baseline_equal stays as it was: the status alone says it failed
    f = tmp_path / "cg.json"
    f.write_text(json.dumps(doc))
    r = warm.run(["conformance", f, f, "-o", tmp_path / "c"], cwd=ROOT)
    fails = sum(bad["case_id"] == p["upstream_case_id"] for p in json.loads((tmp_path / "c.json").read_text())["pairs"])
    assert r.returncode == 1 and f"{n} twin pairs, {n - fails} bit-exact; {n - fails}/{n - fails} within" in r.stdout
    assert len(json.loads((tmp_path / "c.json").read_text())["pairs"]) == n


def test_the_conformance_summary_states_the_median_ratio_of_an_even_count():
    from types import SimpleNamespace

    from moebench.report.conformance import Twin, summary

    def twin(ours, theirs):
        rec = lambda us: SimpleNamespace(timing={"median_us": us}, checks={"baseline_equal": True}, status="ok")  # noqa: E731
        return Twin("count", {}, {}, rec(ours), rec(theirs), 0.05)

    line = summary([twin(1.0, 1.0), twin(1.02, 1.0), twin(1.04, 1.0), twin(0.98, 1.0)])
    assert "median 1.010," in line and "range 0.980 to 1.040" in line  # the upper middle would say 1.020
