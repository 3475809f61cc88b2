"""The commands that read (show, compare, recommend, plot, render, merge, validate, list), and a sweep
of a host-only family, run where torch and triton cannot be imported: each runs in a subprocess in
which `import torch` fails."""

import json
from pathlib import Path

import pytest

import warm

from moebench.core.cases import expand
from moebench.core.device import DeviceInfo
from moebench.core.provenance import provenance
from moebench.core.records import Record
from moebench.core.store import ResultsWriter
from moebench.core.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
GPU = DeviceInfo(backend="cuda", name="NVIDIA H200", slug="h200", sm_count=132, l2_bytes=60 << 20,
                 max_threads_per_sm=2048, total_mem_bytes=141 << 30, compute_capability="9.0", driver="580",
                 cuda="13.0", torch="2.11", triton="3.6", python="3.12")



def _timed_results(dest: Path, stem: str, scale: float = 1.0, shard=None, cases=None) -> Path:
    """A count-block results file as a GPU run writes it, with made-up but plausible timings."""
    spec = load_spec("count-block")
    cases = cases if cases is not None else expand(spec)
    recs = []
    for c in cases:
        us = scale * (1.5 + c.params["tokens"] / 2000 + c.params["block_size"] / 400)
        recs.append(Record(spec.name, "count", c.id, c.variant, c.label, "ok", params=dict(c.params),
                           checks={"ref_check": "exact", "baseline_equal": True},
                           launch={"grid": 132, "block_size": c.params["block_size"], "num_warps": 4},
                           timing={"timer": "graph-replay", "median_us": round(us, 4), "rel_noise": 0.002},
                           work={"bytes": c.params["tokens"] * 32, "ctas": 132}))
    prov = provenance(spec, GPU, quick=False, verify=False, ceilings={},
                      extra={"timed": True, "cross_checks": [], "shard": list(shard) if shard else None})
    ResultsWriter(dest, stem, prov, ("json",)).finalize(recs, complete=True)
    return dest / f"{stem}.json"


def _blocked(*args, cwd=ROOT, env=None):
    r = warm.run(args, cwd=cwd, blocked=True,
                 env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})})
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("readers")
    from moebench.parallel.shards import partition

    halves = partition(expand(load_spec("count-block")), 2)
    return {"a": _timed_results(d, "count-block"), "b": _timed_results(d / "b", "count-block", scale=1.2),
            "s0": _timed_results(d / "s", "count-block.shard0of2", shard=(0, 2), cases=halves[0]),
            "s1": _timed_results(d / "s", "count-block.shard1of2", shard=(1, 2), cases=halves[1]), "dir": d}


def test_blocking_works():
    code, _, err = _blocked("sweep", "count-block", "--quick", "--out", "/nonexistent")
    assert code != 0 and ("torch" in err or "triton" in err)


@pytest.mark.parametrize("cmd", [
    lambda f: ["show", f["a"]],
    lambda f: ["show", f["a"], "--reference", "seed-000-count-block-gb200"],
    lambda f: ["compare", f["a"], f["b"]],
    lambda f: ["recommend", f["a"], "--over", "tokens"],
    lambda f: ["plot", f["a"], "-o", f["dir"] / "curve.png"],
    lambda f: ["merge", f["s0"], f["s1"], "-o", f["dir"] / "merged"],
    lambda f: ["validate", *sorted((ROOT / "sweeps").glob("*.yaml"))],
    lambda f: ["list"],
    lambda f: ["sweep", "count-block", "--dry-run"],
    lambda f: ["sweep", "combine-lds", "--quick", "--out", f["dir"] / "host-run"],
], ids=["show", "show-reference", "compare", "recommend", "plot", "merge", "validate", "list", "dry-run",
        "host-only-sweep"])
def test_reader_runs_without_torch(files, cmd):
    code, out, err = _blocked(*cmd(files))
    assert code == 0, err
    assert "Traceback" not in err and out.strip()


def test_render_runs_without_torch(files, tmp_path):
    doc = json.loads(files["a"].read_text())
    p = tmp_path / "count-block.json"
    p.write_text(json.dumps(doc))
    code, out, err = _blocked("render", p)
    assert code == 0, err
    assert (tmp_path / "count-block.md").read_text().startswith("# count-block")


# ============================================================================ a results file is data


def _bundle(d: Path, spec_path: str) -> tuple[Path, Path]:
    """An attacker's results bundle: t.json whose provenance names SPEC_PATH; beside it evil.yaml,
    a spec whose `plugins:` runs p.py, which writes a marker file."""
    d.mkdir(parents=True, exist_ok=True)
    marker = d / "p-ran"
    (d / "p.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (d / "evil.yaml").write_text("name: evil\nfamily: count\nplugins: [p.py]\nvariants: [persistent]\n"
                                 "axes: {tokens: [1]}\n")
    src = json.loads(_timed_results(d / "src", "count-block").read_text())
    src["provenance"].update(spec_path=spec_path, sweep="evil")
    t = d / "t.json"
    t.write_text(json.dumps(src))
    shard = json.loads(t.read_text())
    shard["provenance"]["shard"] = [0, 1]
    (d / "t.shard0of1.json").write_text(json.dumps(shard))
    return t, marker


@pytest.mark.parametrize("cmd", [
    lambda t: ["render", t],
    lambda t: ["merge", t.parent / "t.shard0of1.json", "-o", t.parent / "m/"],
    lambda t: ["show", t],
    lambda t: ["compare", t, t],
    lambda t: ["recommend", t, "--over", "tokens"],
    lambda t: ["plot", t, "-o", t.parent / "t.png"],
], ids=["render", "merge", "show", "compare", "recommend", "plot"])
def test_readers_run_no_code_a_results_file_names(tmp_path, cmd):
    t, marker = _bundle(tmp_path / "bundle", "evil.yaml")
    code, out, err = _blocked(*cmd(t), cwd=tmp_path / "bundle")
    assert code == 0, err
    assert not marker.exists(), "a reader ran the plugin of the spec a results file names"


def test_render_reads_the_results_file_alone(tmp_path):
    t, marker = _bundle(tmp_path / "bundle", "/etc/passwd")
    code, out, err = _blocked("render", t, cwd=tmp_path)
    assert code == 0, err
    page = t.with_suffix(".md").read_text()
    assert "root:" not in out + err + page and not marker.exists()
    assert page.startswith("# evil") and "## median_us" in page


def test_render_keeps_the_description_and_pivot_from_the_results_file(tmp_path):
    p = _timed_results(tmp_path, "count-block")
    code, out, err = _blocked("render", p, cwd=tmp_path)
    assert code == 0, err
    page = p.with_suffix(".md").read_text()
    spec = load_spec("count-block")
    assert spec.description.strip().splitlines()[0] in page
    assert f"{spec.pivot['rows']} \\ {spec.pivot['cols']}" in page


@pytest.mark.parametrize("name,made_by", [("count-block-ab", "ab"), ("pr/count-block-pr", "pr")])
def test_render_refuses_the_results_of_ab_and_pr_naming_the_command(tmp_path, name, made_by):
    """Their pages are not sweep pages: render says which command remakes them and leaves the page."""
    src = ROOT / "results" / "h200" / f"{name}.json"
    p = tmp_path / src.name
    p.write_text(src.read_text())
    page = p.with_suffix(".md")
    page.write_text("# the page\n")
    code, _, err = _blocked("render", p, cwd=tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"the results of `moebench {made_by}`" in err and f"run `moebench {made_by}` again" in err
    assert page.read_text() == "# the page\n"


@pytest.mark.parametrize("cmd", [
    lambda t: ["show", t],
    lambda t: ["recommend", t, "--over", "tokens"],
    lambda t: ["plot", t, "-o", t.parent / "t.png"],
], ids=["show", "recommend", "plot"])
def test_readers_do_not_load_installed_plugins(tmp_path, cmd):
    t, marker = _bundle(tmp_path / "bundle", "evil.yaml")
    code, _, err = _blocked(*cmd(t), cwd=tmp_path, env={"MOEBENCH_PLUGINS": str(tmp_path / "bundle" / "p.py")})
    assert code == 0, err
    assert not marker.exists(), "a reader imported a plugin"


@pytest.mark.parametrize("cmd", ["show", "recommend", "plot", "merge"])
def test_a_reader_of_one_number_per_case_refuses_an_ab_file(tmp_path, cmd):
    """An ab file holds one record per measurement: show, recommend and plot would read the last
    iteration of each case as the case's number, so each refuses it as compare does; merge, which
    said the file disagreed with itself, names it too."""
    ab = ROOT / "results" / "h200" / "count-block-ab.json"
    out = {"plot": ["-o", tmp_path / "t.png"], "merge": ["-o", tmp_path / "m"]}.get(cmd, [])
    code, _, err = _blocked(cmd, ab, *out, cwd=tmp_path)
    assert code == 2 and f"{cmd} needs one record per case" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args,msg", [
    (["--metric", "gbps"], "a higher gbps is better"),  # once recommended the slowest block size
    (["--metric", "routing"], "does not know whether a higher or a lower 'routing' is better"),
], ids=["higher-is-better", "not-a-number"])
def test_recommend_ranks_only_by_a_metric_where_lower_is_better(args, msg):
    code, _, err = _blocked("recommend", ROOT / "results" / "h200" / "count-block.json", *args)
    assert code == 2 and msg in err and "Traceback" not in err
    assert "gflops" not in err and "expected a time" in err  # it offers only what it would take


@pytest.mark.parametrize("extra", [[], ["--emit", "env"]], ids=["table", "emit"])
def test_recommend_refuses_a_zero_time(tmp_path, extra):
    """A zero median once made every regret infinite (the table) or divided by zero (--emit, exit 3)."""
    doc = json.loads((ROOT / "results" / "h200" / "count-block.json").read_text())
    for r in doc["records"]:
        r["timing"]["median_us"] = 0
    f = tmp_path / "zero.json"
    f.write_text(json.dumps(doc))
    code, _, err = _blocked("recommend", f, *extra, cwd=tmp_path)
    assert code == 2 and "records[0].timing.median_us: expected a positive number, got 0" in err


def _shards(d: Path, edit1=lambda prov: None) -> tuple[Path, Path]:
    from moebench.parallel.shards import partition

    halves = partition(expand(load_spec("count-block")), 2)
    paths = []
    for i in range(2):
        p = _timed_results(d, f"count-block.shard{i}of2", shard=(i, 2), cases=halves[i])
        doc = json.loads(p.read_text())
        doc["provenance"]["settings"] = {"switches": {"MCORE_COUNT_TOKENS_BLOCK": "64"}, "baseline": None}
        if i == 1:
            edit1(doc["provenance"])
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths[0], paths[1]


def test_merge_refuses_shards_of_other_kill_switch_settings(tmp_path):
    s0, s1 = _shards(tmp_path, lambda prov: prov["settings"]["switches"].update(MCORE_COUNT_TOKENS_BLOCK="1024"))
    code, out, err = _blocked("merge", s0, s1, "-o", tmp_path / "m")
    assert code == 2 and "kill-switch settings differ" in err and len(err.strip().splitlines()) == 1
    assert "'64'" in err and "'1024'" in err
    assert not (tmp_path / "m.json").exists()


def test_merge_into_a_new_folder(tmp_path):
    s0, s1 = _shards(tmp_path)
    code, out, err = _blocked("merge", s0, s1, "-o", f"{tmp_path / 'newdir'}/", cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "newdir" / "count-block.json").is_file() and not (tmp_path / "newdir.json").exists()
    doc = json.loads((tmp_path / "newdir" / "count-block.json").read_text())
    assert [r["case_id"] for r in doc["records"]] == [c.id for c in expand(load_spec("count-block"))]
    assert "complete" in out and "INCOMPLETE" not in out


@pytest.mark.parametrize("edit, key", [
    (lambda p: p["page"].update(pivot={"rows": 3}), "provenance.page.pivot.rows"),
    (lambda p: p["page"].update(description=["x"]), "provenance.page.description"),
    (lambda p: p.update(cases={"a": 1}), "provenance.cases.a"),
], ids=["pivot", "description", "cases"])
def test_render_names_a_bad_page_key(tmp_path, edit, key):
    doc = json.loads(_timed_results(tmp_path / "src", "count-block").read_text())
    edit(doc["provenance"])
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    code, _, err = _blocked("render", p, cwd=tmp_path)
    assert code == 2 and key in err and len(err.strip().splitlines()) == 1


def test_merge_reads_each_case_against_a_baseline_of_another_shard(tmp_path):
    s0, s1 = _shards(tmp_path)
    docs = [json.loads(p.read_text()) for p in (s0, s1)]
    base_ids = set(docs[0]["provenance"]["cases"].values())
    # every baseline launch in shard 0, every other case in shard 1
    recs = [r for d in docs for r in d["records"]]
    docs[0]["records"] = [r for r in recs if r["case_id"] in base_ids]
    docs[1]["records"] = [r for r in recs if r["case_id"] not in base_ids]
    for p, d in zip((s0, s1), docs):
        p.write_text(json.dumps(d))
    code, out, err = _blocked("merge", s0, s1, "-o", tmp_path / "m")
    assert code == 0, err
    merged = json.loads((tmp_path / "m.json").read_text())["records"]
    by = {r["case_id"]: r for r in merged}
    bmap = docs[0]["provenance"]["cases"]
    other = [r for r in merged if r["case_id"] not in base_ids]
    assert other and all(r["work"]["baseline_us"] == by[bmap[r["case_id"]]]["timing"]["median_us"] for r in other)


def test_show_of_a_timed_file_with_an_unknown_pivot_metric_does_not_say_it_is_untimed(tmp_path):
    doc = json.loads((ROOT / "results" / "h200" / "count-block.json").read_text())
    doc["provenance"]["page"]["pivot"]["metric"] = "bogus"
    f = tmp_path / "pm.json"
    f.write_text(json.dumps(doc))
    code, _, err = _blocked("show", f, cwd=tmp_path)
    assert code == 0 and "has no bogus (the pivot's metric is not one of its columns)" in err
    assert "no timings" not in err
