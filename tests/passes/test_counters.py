"""The counters pass without a GPU: ncu's real CSV (the H200 probe) parsed, kernels split per case at
the markers and aggregated, the bound verdicts and the work-model check, the tool run through a fake
ncu on PATH (a permission error, a missing tool, a profile), the child re-creating cases from its
job under the interpreter, and `sweep --counters` on the CPU: unavailable, with why, exit 0."""

import json
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clirun import run_cli, small_count_spec
from moebench.passes import counters as K
from moebench.core import passes as P
from moebench.core.records import Record

FIXTURE = Path(__file__).parent / "data" / "ncu.csv"  # ncu 2025.3.1 on an H200, 4 configs x 6 launches
CUDA = SimpleNamespace(backend="cuda", name="NVIDIA H200")
INTERP = SimpleNamespace(backend="interpret", name="cpu")


def kernels():
    return K.parse_ncu_csv(FIXTURE.read_text())


def marker(i):
    return K.Kernel(-1, K.MARKER_KERNEL, f"({i + 1}, 1, 1)", {"gpu__time_duration.sum": 900.0})


# ----------------------------------------------------------------------------------- parsing


def test_parse_the_real_ncu_csv():
    ks = kernels()
    assert len(ks) == 24 and [k.id for k in ks] == list(range(24))
    k = ks[0]
    assert k.name == "_count_persistent_kernel" and k.grid == "(132, 1, 1)" and K.grid_x(k.grid) == 132
    assert set(K.METRICS) <= set(k.metrics)  # every metric the pass asks for, as the probe returned it
    assert k.get("dram__bytes_read.sum") == 12288  # "12,288"
    assert k.get("lts__t_bytes.sum") == 173632
    assert k.get("gpu__time_duration.sum") == 3264  # ns
    assert k.get("sm__cycles_elapsed.avg.per_second") == pytest.approx(1953097147.95)
    assert k.get("sm__warps_active.avg.pct_of_peak_sustained_active") == pytest.approx(6.21)
    assert ks[12].get("gpu__time_duration.sum") == 15936


def test_number_reads_units_and_blanks():
    assert K.number("1,024.5", "byte") == 1024.5
    assert K.number("1.5", "Kbyte") == 1500
    assert K.number("3.2", "usecond") == pytest.approx(3200)
    assert K.number("1.95", "Ghz") == pytest.approx(1.95e9)
    assert K.number("n/a", "%") is None and K.number("", "") is None and K.number("x", "") is None


def test_no_header_no_kernels():
    assert K.parse_ncu_csv("==ERROR== something\n") == []


# ----------------------------------------------------------------------------------- one case


def test_kernels_split_at_the_markers():
    ks = kernels()
    seq = [ks[0], marker(0), ks[1], ks[2], marker(1), marker(2), ks[3], marker(7)]
    got = K.split_cases(seq, 3)
    assert got == {0: [ks[1], ks[2]], 1: [], 2: [ks[3]]}  # ks[0] precedes every marker; marker 7 is out of range


def test_aggregate_sums_weights_and_takes_the_longest_kernels_geometry():
    ks = kernels()
    a, b = ks[0], ks[12]  # 3.264 us at 6.21% and 15.936 us at 4.90%
    c = K.aggregate([a, b])
    assert c["kernels"] == 2 and c["kernel_us"] == pytest.approx((3264 + 15936) / 1e3)
    assert c["instructions"] == a.get("smsp__inst_executed.sum") + b.get("smsp__inst_executed.sum")
    assert c["l2_bytes"] == 173632 + b.get("lts__t_bytes.sum")
    want = (6.21 * 3264 + 4.90 * 15936) / (3264 + 15936)
    assert c["achieved_occupancy_pct"] == pytest.approx(want, abs=0.01)
    assert c["ctas"] == 132 and c["theoretical_occupancy_pct"] == 100 and c["registers_per_thread"] == 16
    assert c["limiter"] == "grid: 0.06 waves"  # 132 CTAs where 16 per SM fit: the grid is the limit
    assert [k["us"] for k in c["kernel_list"]] == [3.264, 15.936]
    assert c["active_lanes_pct"] is None and c["atomics"] is None  # optional metrics not in this CSV


def test_limiter_is_the_smallest_launch_limit_past_one_wave():
    k = K.Kernel(0, "k", "(4096, 1, 1)", {
        "launch__waves_per_multiprocessor": 3.9, "launch__occupancy_limit_registers": 4,
        "launch__occupancy_limit_shared_mem": 32, "launch__occupancy_limit_blocks": 32,
        "launch__occupancy_limit_warps": 8, "gpu__time_duration.sum": 1000.0,
        "smsp__inst_executed.sum": 1000.0, "smsp__thread_inst_executed.sum": 16000.0,
        "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum": 64.0})
    c = K.aggregate([k])
    assert c["limiter"] == "registers" and c["limits_blocks_per_sm"]["warps"] == 8
    assert c["active_lanes_pct"] == 50.0 and c["atomics"] == 64
    k.metrics["launch__occupancy_limit_warps"] = 4
    assert K.aggregate([k])["limiter"] == "registers + block size (warps per SM)"


@pytest.mark.parametrize("counters,work,lean,bound,why", [
    ({"dram_pct": 90, "l2_pct": 50, "sm_pct": 10, "achieved_occupancy_pct": 80}, {"x_empty": 1.2}, 1.0,
     "launch", "1.20x the empty-kernel floor"),
    ({"dram_pct": 72, "l2_pct": 50, "sm_pct": 10, "achieved_occupancy_pct": 80}, {"x_empty": 9}, 1.0,
     "bandwidth", "DRAM throughput 72% of peak"),
    ({"dram_pct": 1, "l2_pct": 65, "sm_pct": 10, "achieved_occupancy_pct": 80}, {"x_empty": 9}, 1.0,
     "bandwidth", "L2 throughput 65% of peak"),
    ({"dram_pct": 1, "l2_pct": 5, "sm_pct": 70, "achieved_occupancy_pct": 80}, {"x_empty": 9}, 1.0,
     "compute", "SM throughput 70%"),
    ({"dram_pct": 1, "l2_pct": 5, "sm_pct": 20, "achieved_occupancy_pct": 80}, {"x_empty": 9}, 4.0,
     "work", "4.0x the instructions of the leanest launch"),
    ({"dram_pct": 1, "l2_pct": 5, "sm_pct": 2, "achieved_occupancy_pct": 6}, {"x_empty": 3}, 1.0,
     "latency", "too few warps resident"),
    ({"dram_pct": 1, "l2_pct": 5, "sm_pct": 2, "achieved_occupancy_pct": 60}, {"x_empty": 3}, 1.0,
     "latency", "warps resident but stalled"),
    ({"dram_pct": 45, "l2_pct": 5, "sm_pct": 2, "achieved_occupancy_pct": 60}, {"x_empty": 3}, 1.0,
     "mixed", "busiest unit at 45%"),
    ({}, {}, None, "unknown", "no throughput counters"),
])
def test_verdict_first_match_with_its_numbers(counters, work, lean, bound, why):
    v = K.verdict(counters, work, lean)
    assert v["bound"] == bound and why in v["why"]
    for k in ("dram_pct", "l2_pct", "sm_pct", "achieved_occupancy_pct"):
        if k in counters:
            assert v[k] == counters[k]  # the numbers that decided it travel with it


def test_work_check_flags_traffic_far_from_the_model():
    near = K.work_check({"l2_bytes": 11_000, "dram_read_bytes": 0, "dram_write_bytes": 0}, {"bytes": 10_000})
    assert near["x_model"] == 1.1 and not near["far"] and "note" not in near
    far = K.work_check({"l2_bytes": 173632, "dram_read_bytes": 12288, "dram_write_bytes": 0}, {"bytes": 8452})
    assert far["far"] and far["x_model"] == pytest.approx(20.54) and "20.5x the work model's 8.5 KB" in far["note"]
    low = K.work_check({"l2_bytes": 1000}, {"bytes": 10_000})
    assert low["far"] and low["x_model"] == 0.1
    assert K.work_check({"l2_bytes": 1000}, {}) is None


# ----------------------------------------------------------------------------------- records


def _spec():
    from moebench.core.spec import load_spec

    return load_spec("count-block")


def _cases_and_records(n=3):
    from moebench.core.cases import expand

    spec = _spec()
    cases = [c for c in expand(spec) if c.params["tokens"] == 256][:n]
    recs = []
    for c in cases:
        r = Record(spec.name, "count", c.id, c.variant, c.label, "ok", params=dict(c.params),
                   launch={"block_size": c.params["block_size"], "grid": 132, "num_warps": 4})
        r.timing["median_us"] = 5.0
        r.work.update({"bytes": 8452, "x_empty": 2.5})
        recs.append(r)
    return spec, cases, recs


def test_attach_sets_counters_verdicts_and_the_leanest_of_each_shape():
    spec, cases, recs = _cases_and_records(3)
    ks = kernels()
    # case 0: one kernel of the 256-token probe config; case 1: 4x its instructions; case 2: nothing ran
    heavy = K.Kernel(99, "_count_persistent_kernel", "(132, 1, 1)", dict(ks[1].metrics))
    heavy.metrics["smsp__inst_executed.sum"] = 4 * ks[0].get("smsp__inst_executed.sum")
    got = K.Profiled([marker(0), ks[0], marker(1), heavy, marker(2)])
    K.attach(spec, cases, recs, got, {cases[2].id: "RuntimeError: boom"}, tool_name="ncu", tool_version="2025.3.1",
             l2="warm")
    a, b, c = (r.cross for r in recs)
    assert a["counters"]["achieved_occupancy_pct"] == 6.21 and a["counters"]["tool_version"] == "2025.3.1"
    assert a["verdict"]["bound"] == "latency" and a["verdict"]["x_leanest_instructions"] == 1.0
    assert b["verdict"]["bound"] == "work" and b["verdict"]["x_leanest_instructions"] == 4.0
    assert a["work_check"]["far"]  # 173 KB through L2 for a 8.5 KB model: the atomics' sectors
    assert c["counters"] == {"unavailable": "the counters child could not run this case: RuntimeError: boom"}
    assert "verdict" not in c


def test_collect_on_the_cpu_marks_every_record_unavailable():
    spec, cases, recs = _cases_and_records(2)
    K.collect(spec, INTERP, cases, recs, tool=K.Ncu({"PATH": ""}))
    assert all("no CUDA device" in r.cross["counters"]["unavailable"] for r in recs)
    assert K.note(recs).startswith("counters: unavailable for 2 case(s): no CUDA device")


def test_collect_without_the_tool_says_where_it_looked(tmp_path):
    spec, cases, recs = _cases_and_records(1)
    K.collect(spec, CUDA, cases, recs, environ={"PATH": str(tmp_path), K.NCU_ENV: str(tmp_path / "nope")})
    assert recs[0].cross["counters"] == {"unavailable": f"Nsight Compute not found (looked for ${K.NCU_ENV}="
                                                        f"{tmp_path / 'nope'})"}
    assert K.find_ncu({"PATH": str(tmp_path)})[0] in (None, K.NCU_DEFAULT)


FAKE_NCU = r'''#!{python}
"""A stand-in for ncu: --version, --query-metrics, and a profile that reads the job the child would
have run and prints ncu's CSV for it: a marker, then the probe's first kernel, per case."""
import csv, json, os, sys
args = sys.argv[1:]
if "--version" in args:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 1) (public-release)")
    sys.exit(0)
if "--query-metrics" in args:
    print("Device NVIDIA H200\nMetric Name   Metric Description\nsmsp__thread_inst_executed  # of thread instructions")
    sys.exit(0)
open(os.environ["FAKE_NCU_ARGS"], "w").write(json.dumps(args))
if os.environ.get("FAKE_NCU_MODE") == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
job = json.load(open(args[-1]))
rows = [r for r in csv.reader(open(os.environ["FAKE_NCU_FIXTURE"])) if len(r) > 10]
head, body = rows[0], [r for r in rows[1:] if r[0] == "0"]
out = csv.writer(sys.stdout, quoting=csv.QUOTE_ALL)
print("==PROF== Connected to process 1")
out.writerow(head)
n = 0
for i, c in enumerate(job["cases"]):
    out.writerow([str(n), "1", "python3", "h", "_moebench_counters_mark", "1", "7", "(1, 1, 1)", f"({{i + 1}}, 1, 1)",
                  "0", "9.0", "Command line profiler metrics", "gpu__time_duration.sum", "ns", "1,000"])
    n += 1
    for r in body:
        out.writerow([str(n)] + r[1:])
    n += 1
json.dump({{"cases": [{{"id": c["id"], "index": i}} for i, c in enumerate(job["cases"])]}}, open(job["manifest"], "w"))
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "ncu"
    path.parent.mkdir()
    path.write_text(FAKE_NCU.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": str(path.parent) + os.pathsep + os.environ.get("PATH", ""), "FAKE_NCU_FIXTURE": str(FIXTURE),
           "FAKE_NCU_ARGS": str(tmp_path / "args.json")}
    return SimpleNamespace(path=path, env=env, args=tmp_path / "args.json")


def test_a_profile_through_ncu_on_path(fake_ncu, tmp_path):
    spec, cases, recs = _cases_and_records(2)
    env = dict(fake_ncu.env, MOEBENCH_COUNTERS_RAW=str(tmp_path / "raw"))
    K.collect(spec, CUDA, cases, recs, environ=env, l2="warm")
    args = json.loads(fake_ncu.args.read_text())
    for flag, value in (("--clock-control", "none"), ("--graph-profiling", "node"), ("--profile-from-start", "off"),
                        ("--cache-control", "none"), ("--print-units", "base")):
        assert args[args.index(flag) + 1] == value
    metrics = args[args.index("--metrics") + 1].split(",")
    assert metrics[:len(K.METRICS)] == list(K.METRICS)
    assert "smsp__thread_inst_executed.sum" in metrics  # listed by --query-metrics
    assert "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum" not in metrics  # not listed: not asked for
    assert args[-3:-1] == ["-m", "moebench.passes.counters_child"]
    job = json.loads(Path(args[-1]).read_text()) if Path(args[-1]).exists() else json.loads(
        (tmp_path / "raw" / spec.name / "job.json").read_text())
    assert [c["id"] for c in job["cases"]] == [c.id for c in cases] and job["spec"].endswith("count-block.yaml")
    assert job["cases"][0]["launch"]["grid"] == 132 and job["warm_replays"] == K.WARM_REPLAYS
    for r in recs:
        c = r.cross["counters"]
        assert c["tool"] == "ncu" and c["tool_version"] == "2025.3.1.0" and c["kernel_us"] == 3.264
        assert c["metrics_missing"] == ["l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",
                                        "l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum"]
        assert r.cross["verdict"]["bound"] == "latency" and r.cross["work_check"]["far"]
    assert (tmp_path / "raw" / spec.name / "ncu.csv").exists()


def test_cold_l2_flushes_caches_and_skips_the_warm_replays(fake_ncu, tmp_path):
    spec, cases, recs = _cases_and_records(1)
    K.collect(spec, CUDA, cases, recs, environ=dict(fake_ncu.env, MOEBENCH_COUNTERS_RAW=str(tmp_path / "raw")),
              l2="cold")
    args = json.loads(fake_ncu.args.read_text())
    assert args[args.index("--cache-control") + 1] == "all"
    assert json.loads((tmp_path / "raw" / spec.name / "job.json").read_text())["warm_replays"] == 0


def test_no_counter_permission_is_one_line_and_the_run_goes_on(fake_ncu):
    spec, cases, recs = _cases_and_records(2)
    K.collect(spec, CUDA, cases, recs, environ=dict(fake_ncu.env, FAKE_NCU_MODE="perm"))
    for r in recs:
        why = r.cross["counters"]["unavailable"]
        assert "no permission to read the GPU's performance counters (ncu: ERR_NVGPUCTRPERM)" in why
        assert "verdict" not in r.cross


def test_moebench_ncu_names_the_tool(fake_ncu, tmp_path):
    spec, cases, recs = _cases_and_records(1)
    env = {"PATH": "", K.NCU_ENV: str(fake_ncu.path), "FAKE_NCU_FIXTURE": str(FIXTURE),
           "FAKE_NCU_ARGS": str(tmp_path / "a.json")}
    K.collect(spec, CUDA, cases, recs, environ=env)
    assert recs[0].cross["counters"]["kernel_us"] == 3.264


# ----------------------------------------------------------------------------------- the child


def test_the_child_recreates_cases_from_its_job_and_goes_on_past_a_bad_one(tmp_path):
    from moebench.core.cases import expand
    from moebench.passes.counters_child import run

    spec = _spec()
    cases = expand(spec, quick=True)[:2]
    recs = [Record(spec.name, "count", c.id, c.variant, c.label, "ok", params=dict(c.params),
                   launch={"block_size": c.params["block_size"], "grid": 4, "num_warps": 4}) for c in cases]
    job = K.job_document(spec, cases, recs, warm_replays=0, manifest=str(tmp_path / "m.json"))
    job["cases"].insert(1, dict(job["cases"][0], id="bad", variant="no-such-variant"))
    entries = run(json.loads(json.dumps(job)))  # through JSON, as the child reads it
    assert [e["id"] for e in entries] == [cases[0].id, "bad", cases[1].id]
    assert "error" not in entries[0] and "error" not in entries[2]
    assert "KeyError" in entries[1]["error"] or "no-such-variant" in entries[1]["error"]


# ----------------------------------------------------------------------------------- the pass and the CLI


def test_the_pass_is_registered_and_not_refused_on_the_cpu():
    cls = P.catalogue()["counters"]
    assert cls.has_after_all() and cls.in_workers
    assert [p.name for p in P.select(("counters",), backend="interpret", timed=False, workers=False)] == ["counters"]
    assert [p.name for p in P.select(("counters",), backend="cuda", timed=True, workers=True)] == ["counters"]


def test_sweep_counters_on_the_cpu_is_unavailable_and_exits_0(tmp_path, capsys):
    spec = tmp_path / "small.yaml"
    spec.write_text(small_count_spec("small"))
    code, out, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r"), "--counters"], capsys)
    assert code == 0, err
    assert "counters: unavailable for 12 case(s): no CUDA device" in err
    doc = json.loads((tmp_path / "r" / "cpu-interpreter" / "small.json").read_text())
    assert doc["provenance"]["cross_checks"] == ["counters"]
    assert all("no CUDA device" in r["cross"]["counters"]["unavailable"] for r in doc["records"])
    page = (tmp_path / "r" / "cpu-interpreter" / "small.md").read_text()
    assert "## Hardware counters\n\nUnavailable: no CUDA device" in page


# ----------------------------------------------------------------------------------- the page


def test_the_page_has_the_verdicts_the_occupancy_curve_and_the_flags():
    from moebench.report.counters import section

    spec, cases, recs = _cases_and_records(3)
    for r in recs:
        r.work["occupancy_pct"] = 2.2
    ks = kernels()
    K.attach(spec, cases, recs, K.Profiled([marker(0), ks[0], marker(1), ks[6], marker(2), ks[12]]), {},
             tool_name="ncu", tool_version="2025.3.1", l2="warm")
    md = section(spec, recs)
    assert md.startswith("## Hardware counters") and "ncu 2025.3.1" in md
    assert "| variant | block_size | µs | kernel µs |" in md and "**latency**" in md
    assert "### Occupancy curve: block_size × tokens" in md
    assert "| 64 | 5.00 · 6% / 2% · latency |" in md  # µs · achieved / arithmetic occupancy · bound
    assert "### Work model against the measured traffic" in md and "⚑" in md
    assert section(spec, [Record("s", "count", "x", "persistent", "persistent", "ok")]) == ""


def test_the_sweep_page_carries_the_section():
    from moebench.report.sweep import sweep_markdown

    spec, cases, recs = _cases_and_records(1)
    recs[0].cross["counters"] = K.unavailable("Nsight Compute not found (looked for ncu on PATH)")
    md = sweep_markdown(spec, recs, {"device": {"backend": "cuda"}})
    assert "## Hardware counters\n\nUnavailable: Nsight Compute not found" in md


# ----------------------------------------------------------------------------------- the plot


def _act_records():
    """An act-grid-like run with counters: two caps x two live-row counts, the capped variant."""
    recs = []
    for cap, occ_arith in ((512, 22.0), (8192, 100.0)):
        for live, ach in ((2048, 11.0), (16384, 40.0)):
            r = Record("act-grid", "act", f"c{cap}-{live}", "capped", "capped", "ok",
                       params={"op": "silu_mul_bounded", "rows": 16384, "live_rows": live, "grid_cap": cap})
            r.timing["median_us"] = 5.0 + cap / 1e4 + live / 1e3
            r.work["occupancy_pct"] = occ_arith
            r.cross["counters"] = {"achieved_occupancy_pct": ach * (2 if cap == 8192 else 1)}
            recs.append(r)
    return recs


def test_plot_counters_draws_time_and_measured_beside_arithmetic_occupancy(tmp_path, capsys):
    from moebench.analysis.plot import plot_counters

    recs = _act_records()
    drawn = plot_counters(recs, {"sweep": "act-grid", "device": {"name": "NVIDIA H200"}}, tmp_path / "c.png")
    assert drawn.series == 2 and drawn.points == 4 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert drawn.panels == ["median_us", "achieved vs arithmetic occupancy"]
    res = tmp_path / "act-grid.json"
    res.write_text(json.dumps({"provenance": {"sweep": "act-grid"}, "records": [r.to_json() for r in recs]}))
    code, out, err = run_cli(["plot", str(res), "--counters", "-o", str(tmp_path / "act-grid-counters.png")], capsys)
    assert code == 0, err
    assert (tmp_path / "act-grid-counters.png").exists() and "2 line(s), 4 point(s)" in out


def test_plot_counters_without_counters_says_why(tmp_path, capsys):
    recs = _act_records()
    for r in recs:
        r.cross["counters"] = K.unavailable("no CUDA device (interpreter)")
    res = tmp_path / "a.json"
    res.write_text(json.dumps({"provenance": {}, "records": [r.to_json() for r in recs]}))
    code, _, err = run_cli(["plot", str(res), "--counters"], capsys)
    assert code == 2 and "no measured occupancy in these results" in err and "no CUDA device" in err


def test_a_failing_counters_pass_leaves_the_timings_and_says_why(monkeypatch):
    spec, cases, recs = _cases_and_records(2)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(K, "collect", boom)
    opts = SimpleNamespace(timing=SimpleNamespace(l2="warm"))
    K.Counters().after_all(P.AfterAll(spec, CUDA, opts, cases, recs))
    assert all(r.cross["counters"] == {"unavailable": "the counters pass failed: OSError: disk full"} for r in recs)
    assert all(r.timing["median_us"] == 5.0 for r in recs)


def test_the_child_runs_the_launch_values_its_record_ran(monkeypatch, tmp_path):
    """A kill switch the parent read (shipped's BLOCK_SIZE from $MCORE_COUNT_TOKENS_BLOCK) reaches the
    child through the record's launch values, not through the child's environment."""
    from moebench.core.cases import expand
    from moebench.passes.counters_child import run

    spec = _spec()
    fam = spec.family
    seen = []
    real = type(fam).builder

    def builder(self, name):
        b = real(self, name)

        def wrapped(inp, params, device):
            seen.append(params["block_size"])
            return b(inp, params, device)

        return wrapped

    monkeypatch.setattr(type(fam), "builder", builder)
    monkeypatch.delenv("MCORE_COUNT_TOKENS_BLOCK", raising=False)
    c = expand(spec, quick=True)[0]
    job = {"spec": str(spec.path), "manifest": str(tmp_path / "m.json"), "warm_replays": 0, "cases": [
        {"id": "s", "variant": "shipped", "label": "shipped", "params": dict(c.params, block_size=None),
         "launch": {"block_size": 1024, "grid": 4, "num_warps": 4}}]}
    (entry,) = run(job)
    assert "error" not in entry and seen == [1024]  # the shipped default would be 128


def test_the_child_resolves_with_the_runs_environment_from_its_job(monkeypatch, tmp_path):
    """The job carries the run's kill switches; the child's own environment is never read."""
    from moebench.core.cases import expand
    from moebench.passes.counters_child import run

    spec = _spec()
    seen = []
    real = type(spec.family).build

    def build(self, variant, inputs, params, device):
        seen.append(params["block_size"])
        return real(self, variant, inputs, params, device)

    monkeypatch.setattr(type(spec.family), "build", build)
    monkeypatch.setenv("MCORE_COUNT_TOKENS_BLOCK", "256")  # the child's own: must not count
    c = expand(spec, quick=True)[0]
    rec = Record(spec.name, "count", "s", "shipped", "shipped", "ok", params=dict(c.params, block_size=None))
    case = type(c)(c.family, "shipped", "shipped", dict(c.params, block_size=None), "s")
    job = K.job_document(spec, [case], [rec], warm_replays=0, manifest=str(tmp_path / "m.json"),
                         environ={"MCORE_COUNT_TOKENS_BLOCK": "512", "HOME": "/not/a/switch"})
    assert job["environ"] == {"MCORE_COUNT_TOKENS_BLOCK": "512"}  # the switches only
    (entry,) = run(json.loads(json.dumps(job)))
    assert "error" not in entry and seen == [512]


def test_an_ncu_without_print_units_is_run_again_without_it(fake_ncu, tmp_path):
    text = fake_ncu.path.read_text().replace(
        'job = json.load', 'if "--print-units" in args:\n    print("==ERROR== unrecognised option \'--print-units\'")\n'
        '    sys.exit(1)\njob = json.load')
    fake_ncu.path.write_text(text)
    spec, cases, recs = _cases_and_records(1)
    K.collect(spec, CUDA, cases, recs, environ=fake_ncu.env)
    assert "--print-units" not in json.loads(fake_ncu.args.read_text())
    assert recs[0].cross["counters"]["kernel_us"] == 3.264
