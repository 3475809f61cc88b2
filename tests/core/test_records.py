"""The records layer on its own: the stream and its torn tail, resume keys, the output lock, what
a results file must look like, and never shrinking a results file."""

import json
import os
import stat
from pathlib import Path

import pytest

from moebench.core.cases import expand
from moebench.core.device import DeviceInfo
from moebench.core.provenance import record_key, run_settings, settings_diff
from moebench.core.records import Record, load_results, read_stream
from moebench.core.store import (OutputLock, ResultsWriter, atomic_write_text, existing_records, output_file,
                                 previous_records, repair_stream, stream_path)
from moebench.core.spec import load_spec
from moebench.errors import UsageError

CPU = DeviceInfo(backend="interpret", name="CPU (Triton interpreter)", slug="cpu-interpreter", sm_count=132,
                 l2_bytes=0, max_threads_per_sm=2048, total_mem_bytes=0, compute_capability="-", driver=None,
                 cuda=None, torch="2", triton="3", python="3.11")


def setup(tmp_path: Path, environ=None):
    spec = load_spec("count-block")
    cases = expand(spec, quick=True)
    settings = run_settings(spec, CPU, timed=False, cross=(), environ=environ or {})
    keys = {c.id: record_key(c, settings) for c in cases}
    prov = {"sweep": spec.name, "spec_sha256": spec.sha256, "settings": settings}
    return spec, cases, settings, keys, prov


def rec(case, status="ok") -> Record:
    return Record("count-block", "count", case.id, case.variant, case.label, status, params=dict(case.params))


def test_resume_key_is_the_case_and_the_settings(tmp_path):
    spec, cases, settings, keys, _ = setup(tmp_path)
    assert len(set(keys.values())) == len(cases)  # one per case
    again = run_settings(load_spec("count-block"), CPU, timed=False, cross=(), environ={})
    assert {c.id: record_key(c, again) for c in cases} == keys  # stable across loads
    for change in ({"environ": {"MCORE_COUNT_TOKENS_BLOCK": "256"}}, {"cross": ("dobench",)}, {"timed": True}):
        args = {"timed": False, "cross": (), "environ": {}, **change}
        other = run_settings(spec, CPU, **args)
        assert all(record_key(c, other) != keys[c.id] for c in cases), change
    assert "$MCORE_COUNT_TOKENS_BLOCK: unset -> '256'" in settings_diff(
        settings, run_settings(spec, CPU, timed=False, cross=(), environ={"MCORE_COUNT_TOKENS_BLOCK": "256"}))
    assert settings_diff(None, settings) == "no settings recorded"


def test_stream_drops_a_torn_tail_and_repairs_it(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    for c in cases[:4]:
        w.add(rec(c))
    w.close()
    p = stream_path(tmp_path, "s")
    whole = p.read_bytes()
    p.write_bytes(whole + b'{"record": {"sweep": "count-bl')
    s = read_stream(p)
    assert len(s.entries) == 4 and s.torn == 1 and s.complete_bytes == len(whole) and p.read_bytes() != whole
    s = repair_stream(p)
    assert s.torn == 1 and p.read_bytes() == whole
    assert all(e.settings == settings for e in s.entries)
    p.write_bytes(whole + b"not json\n" + b'{"record": {"sweep": 1}}\n')  # complete but unreadable lines
    s = read_stream(p)
    assert len(s.entries) == 4 and s.unreadable == 2 and s.torn == 0


def test_writer_never_appends_onto_a_torn_line(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    p = stream_path(tmp_path, "s")
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    w.add(rec(cases[0]))
    w.close()
    p.write_bytes(p.read_bytes() + b'{"record": {"swe')
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    w.add(rec(cases[1]))
    w.close()
    s = read_stream(p)
    assert [e.record.case_id for e in s.entries] == [cases[0].id, cases[1].id] and not s.unreadable


def test_previous_records_keeps_matching_ok_records_and_says_why_it_drops(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    w.add_many([rec(cases[0]), rec(cases[1], "error"), rec(cases[2])])
    w.close()
    other = run_settings(spec, CPU, timed=False, cross=("dobench",), environ={})
    w = ResultsWriter(tmp_path, "s", {**prov, "settings": other}, ("json",),
                      keys={c.id: record_key(c, other) for c in cases})
    w.add(rec(cases[3]))
    w.close()
    res = previous_records(tmp_path, "s", keys, settings)
    assert set(res.kept) == {cases[0].id, cases[2].id}
    assert res.dropped == {"error (run again)": 1, "made under other settings (cross_checks: ['dobench'] -> [])": 1}
    assert "kept 2 of 9 cases" in res.summary(9)
    res = previous_records(tmp_path, "s", {cases[0].id: keys[cases[0].id]}, settings)
    assert res.other_cases == 3  # records of cases this run does not have are ignored, and counted


def test_finalize_keeps_a_file_that_holds_more_records(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    full = ResultsWriter(tmp_path, "s", prov, ("json", "csv"), keys=keys)
    full.add_many(rec(c) for c in cases)
    assert len(full.finalize([rec(c) for c in cases], complete=True).paths) == 2
    assert existing_records(tmp_path, "s", ("json", "csv"))[0] == len(cases)
    assert not stream_path(tmp_path, "s").exists()
    part = ResultsWriter(tmp_path, "s", prov, ("json", "csv"), keys=keys)
    part.add(rec(cases[0]))
    written = part.finalize([rec(cases[0])], complete=False)
    assert written.paths == [] and written.kept == (tmp_path / "s.json", len(cases))
    assert written.stream == stream_path(tmp_path, "s")  # this run's record is kept there
    assert len(load_results(tmp_path / "s.json")[1]) == len(cases)
    forced = ResultsWriter(tmp_path, "s", prov, ("json",), force=True, keys=keys)
    assert forced.finalize([rec(cases[0])], complete=True).paths
    assert len(load_results(tmp_path / "s.json")[1]) == 1


def test_final_files_take_the_umask(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    old = os.umask(0o002)
    try:
        ResultsWriter(tmp_path, "s", prov, ("json", "csv", "md"), keys=keys).finalize(
            [rec(cases[0])], complete=True, markdown="# s\n")
    finally:
        os.umask(old)
    for f in ("s.json", "s.csv", "s.md"):
        assert stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o664


def test_a_csv_of_another_spec_is_not_replaced(tmp_path):
    """A csv keeps its spec beside it (.NAME.csv.spec): another spec of the same name is refused,
    as for json and md; a csv that says nothing of its spec is not replaced either."""
    spec, cases, settings, keys, prov = setup(tmp_path)
    prov = {**prov, "spec_path": "a/s.yaml"}
    ResultsWriter(tmp_path, "s", prov, ("csv",), keys=keys).finalize([rec(cases[0])], complete=True)
    assert (tmp_path / ".s.csv.spec").is_file()
    before = (tmp_path / "s.csv").read_text()
    other = {**prov, "spec_path": "b/s.yaml", "spec_sha256": "0" * 64}
    with pytest.raises(UsageError, match="another spec named 'count-block'"):
        ResultsWriter(tmp_path, "s", other, ("csv",), keys=keys)
    assert (tmp_path / "s.csv").read_text() == before
    ResultsWriter(tmp_path, "s", other, ("csv",), keys=keys, force=True)  # --force replaces
    ResultsWriter(tmp_path, "s", {**prov, "spec_path": "c/s.yaml"}, ("csv",), keys=keys)  # same content elsewhere
    ResultsWriter(tmp_path, "s", other, ("json", "csv"), keys=keys, force=True).finalize([rec(cases[0])],
                                                                                      complete=True)
    assert not (tmp_path / ".s.csv.spec").exists()  # the JSON twin says it now: no sidecar, none stale
    (tmp_path / "s.json").unlink()
    with pytest.raises(UsageError, match="does not say which spec made it"):
        ResultsWriter(tmp_path, "s", prov, ("csv",), keys=keys)


def test_an_atomic_write_goes_through_a_symlink(tmp_path):
    target = tmp_path / "real" / "x.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "x.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]  # no temporary file left


def test_output_file_refuses_an_input_a_folder_and_an_existing_file(tmp_path):
    inp = tmp_path / "in.json"
    inp.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(inp)
    for path in (inp, link):
        with pytest.raises(UsageError, match="is one of the inputs"):
            output_file(path, inputs=[inp], force=True)
    with pytest.raises(UsageError, match="is a folder"):
        output_file(tmp_path, force=True)
    with pytest.raises(UsageError, match="exists; not replaced"):
        output_file(inp)
    made = tmp_path / "new" / "deeper" / "x.png"
    assert output_file(made) == made and not (tmp_path / "new").exists()  # made only when written
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is not a folder"):
        output_file(tmp_path / "file" / "x.png")


def test_the_code_hash_of_a_plugin_covers_the_modules_it_imports(tmp_path, monkeypatch):
    """Editing a module that a plugin imports from its own folder changes the plugin's code hash,
    so --resume re-runs its cases."""
    import sys

    from moebench.core.provenance import _source_sha

    (tmp_path / "helper_for_hash.py").write_text("N = 1\n")
    plug = tmp_path / "plug.py"
    plug.write_text("import helper_for_hash\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "helper_for_hash", raising=False)
    __import__("helper_for_hash")
    try:
        before = _source_sha(f"plugin {plug}")
        (tmp_path / "helper_for_hash.py").write_text("N = 2\n")
        assert _source_sha(f"plugin {plug}") != before
    finally:
        sys.modules.pop("helper_for_hash", None)


def test_output_lock_is_exclusive_and_leaves_nothing_behind(tmp_path):
    with OutputLock(tmp_path, "s") as lock:
        assert lock.path.read_text().startswith(f"pid {os.getpid()}: moebench")
        with pytest.raises(UsageError, match=f"another moebench is writing these results \\(pid {os.getpid()}"):
            OutputLock(tmp_path, "s").__enter__()
        with OutputLock(tmp_path, "other"):  # another output name is another lock
            pass
    assert not (tmp_path / ".s.lock").exists()
    with OutputLock(tmp_path, "s"):  # free again
        pass


@pytest.mark.parametrize("text,key", [
    ('{"provenance": [], "records": []}', "provenance: expected an object"),
    ('{"records": [{"sweep": "s"}]}', "records[0].family: missing"),
    ('{"records": [{"sweep": "s", "family": "f", "case_id": 1, "variant": "v", "label": "l", "status": "ok"}]}',
     "records[0].case_id: expected a string"),
    ('{"provenance": {"shard": "0/2"}, "records": []}', "provenance.shard: expected a list or null"),
])
def test_load_results_names_the_bad_key(tmp_path, text, key):
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(UsageError, match=key.replace("[", "\\[").replace("]", "\\]")):
        load_results(f)


REAL = Path(__file__).resolve().parents[2] / "results" / "h200" / "count-block.json"


@pytest.mark.parametrize("edit,key", [
    # each once an internal error (exit 3) in render and merge, or in every reader (the list)
    (lambda d: d["provenance"]["device"].update(l2_bytes=None), "provenance.device.l2_bytes: expected a number, got"),
    (lambda d: d["provenance"]["ceilings"].update(empty_us=None), "provenance.ceilings.empty_us: expected a number"),
    (lambda d: d["provenance"]["timing"].update(rerun_rel="x"), "provenance.timing.rerun_rel: expected a number or null"),
    (lambda d: d["provenance"].update(shard=[1]), "provenance.shard: expected [index, count]"),
    (lambda d: d["provenance"].update(shard=[0, float("inf")]), "provenance.shard: expected [index, count]"),
    (lambda d: d["records"][3]["params"].update(tokens=[256]), "records[3].params.tokens: expected a number, a string"),
    (lambda d: d["records"][3]["timing"].update(timer=7), "records[3].timing.timer: expected the timer's name"),
    # once printed as a time by show and render, while compare and recommend refused it
    (lambda d: d["records"][3]["timing"].update(median_us=-1.0), "records[3].timing.median_us: expected a positive"),
    (lambda d: d["records"][3]["timing"].update(median_us=0), "records[3].timing.median_us: expected a positive"),
    (lambda d: d["records"][3]["timing"].update(rel_noise=float("nan")), "records[3].timing.rel_noise: expected a fin"),
    # once a page's KeyError naming the wrong family ("a record of family 'count' has no 'op'")
    (lambda d: d["records"][3].update(family="act"), "records[3].family: 'act', where the file's records are of fam"),
], ids=["l2-null", "ceiling-null", "rerun-text", "shard-short", "shard-inf", "param-list", "timer-number", "negative-time",
        "zero-time", "nan-noise", "two-families"])
def test_a_value_the_pages_compute_with_is_checked_on_reading(tmp_path, edit, key):
    doc = json.loads(REAL.read_text())
    edit(doc)
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=key.replace("[", "\\[").replace("]", "\\]")):
        load_results(f)


@pytest.mark.parametrize("src", ["count-block-ab.json", "pr/count-block-pr.json"])
def test_an_ab_or_pr_file_of_a_sweeps_name_is_named_as_one(tmp_path, src):
    """A sweep named `foo-pr` meets `moebench pr foo`'s file: it was called another spec's results, or
    a file holding more records than the run has cases."""
    from moebench.core.store import other_spec

    (tmp_path / "foo-pr.json").write_bytes((REAL.parent / src).read_bytes())
    prov = {"sweep": "foo-pr", "spec_path": "foo-pr.yaml", "spec_sha256": "0" * 64}
    assert existing_records(tmp_path, "foo-pr", ("json",)) == (0, None)
    kind = "pr" if "pr" in src else "ab"
    assert f"foo-pr.json holds `moebench {kind}` results of the spec" in other_spec(tmp_path, "foo-pr", prov, ("json",))


def test_a_stream_reads_as_results(tmp_path):
    spec, cases, settings, keys, prov = setup(tmp_path)
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    w.add_many([rec(cases[0], "error"), rec(cases[0]), rec(cases[1])])
    w.close()
    p, recs = load_results(stream_path(tmp_path, "s"))
    assert p["complete"] is False and p["sweep"] == "count-block" and p["settings"] == settings
    assert [(r.case_id, r.status) for r in recs] == [(cases[0].id, "ok"), (cases[1].id, "ok")]  # latest per case
    assert json.loads(stream_path(tmp_path, "s").read_text().splitlines()[0])["run"]["settings"] == settings


def test_a_stream_of_two_different_runs_is_not_one_results_file(tmp_path):
    """A second run into the same output appends to the stream. Read as results, its records once
    went under the first run's header: the later run's cold-L2 times passed a warm-L2 gate, and
    `history add` filed them under the first run's commit. A resumed run (same spec, commit and
    settings, another timestamp) still reads as one, under its latest header."""
    spec, cases, settings, keys, prov = setup(tmp_path)
    for later in ({**prov, "timestamp": "later"}, {**prov, "git_commit": "b" * 40}):
        w = ResultsWriter(tmp_path, "s", {**prov, "git_commit": "a" * 40}, ("json",), keys=keys)
        w.add_many([rec(cases[0]), rec(cases[1])])
        w.close()
        w = ResultsWriter(tmp_path, "s", {"git_commit": "a" * 40, **later}, ("json",), keys=keys)
        w.add(rec(cases[1]))
        w.close()
        if "timestamp" in later:
            p, recs = load_results(stream_path(tmp_path, "s"))
            assert p["timestamp"] == "later" and len(recs) == 2
        else:
            with pytest.raises(UsageError, match="records of 2 runs that differ in git_commit"):
                load_results(stream_path(tmp_path, "s"))
        stream_path(tmp_path, "s").unlink()
    w = ResultsWriter(tmp_path, "s", prov, ("json",), keys=keys)
    w.add(rec(cases[0]))
    w.close()
    w = ResultsWriter(tmp_path, "s", {**prov, "settings": {**settings, "timing": {"l2": "cold"}}}, ("json",), keys=keys)
    w.add(rec(cases[0]))  # every record the reader keeps is the later run's: one run, read as it
    w.close()
    assert load_results(stream_path(tmp_path, "s"))[0]["settings"]["timing"] == {"l2": "cold"}


# ============================================================================ whose commit


def _commit_in(root, env_extra=None):
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "MOEBENCH_COMMIT"}
    env.update(PYTHONPATH=str(root), **(env_extra or {}))
    r = subprocess.run([sys.executable, "-c", "from moebench.core.provenance import git_commit; print(git_commit())"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_provenance_names_only_moebenchs_own_commit(tmp_path):
    """A copy of the tree without .git, inside another git repository: that repository's commit is
    not moebench's."""
    import shutil
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[2]
    outer = tmp_path / "outer"
    outer.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=outer, check=True)
    (outer / "other.txt").write_text("not moebench\n")
    subprocess.run(git + ["add", "."], cwd=outer, check=True)
    subprocess.run(git + ["commit", "-qm", "other"], cwd=outer, check=True)
    theirs = subprocess.run(["git", "rev-parse", "HEAD"], cwd=outer, capture_output=True, text=True).stdout.strip()
    copy = outer / "vendor" / "moebench-copy"
    shutil.copytree(src / "moebench", copy / "moebench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(src / "pyproject.toml", copy / "pyproject.toml")
    got = _commit_in(copy)
    assert theirs[:12] not in got and got == "None"
    assert _commit_in(copy, {"MOEBENCH_COMMIT": "abc123"}) == "abc123"


def test_provenance_names_the_checkouts_commit():
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True)
    if head.returncode != 0:
        import pytest

        pytest.skip("this tree has no .git")
    assert _commit_in(src).startswith(head.stdout.strip())


def test_provenance_names_a_checkouts_commit_under_a_path_with_a_space(tmp_path):
    """moebench's own repository in a folder whose name has a space: its HEAD, -dirty when changed."""
    import shutil
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[2]
    repo = tmp_path / "my work" / "moebench"
    shutil.copytree(src / "moebench", repo / "moebench", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "."], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert _commit_in(repo) == head
    (repo / "moebench" / "__init__.py").write_text("# changed\n" + (repo / "moebench" / "__init__.py").read_text())
    assert _commit_in(repo) == head + "-dirty"
