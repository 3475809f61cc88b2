"""The measured noise model (moebench.core.noise): how a run finds it (auto path, another device's
model ignored with a note, a malformed file is one line and exit 2, a case missing from it gets the
default), the timer adding its term, the provenance and page line."""

import json
from types import SimpleNamespace

import pytest

from clirun import run_cli
from moebench.core import noise as N
from moebench.core.cases import expand
from moebench.core.device import detect
from moebench.core.placements import Placements, Timer
from moebench.core.records import Record, load_results
from moebench.core.spec import PACKAGE_ROOT, Timing, apply_timing_overrides, load_spec
from moebench.core.timing import Samples
from moebench.errors import SpecError, UsageError

DEV = SimpleNamespace(name="NVIDIA H200", slug="h200")


def _model(path, device="NVIDIA H200", cases=None, **over):
    doc = {"device": device, "sweep": "s", "commit": "abc123def4567890", "runs": 4, "method": {"groups": 4},
           "cases": cases if cases is not None else {"c1": {"label": "x", "params": {}, "spread_rel": 0.1,
                                                          "rerun_rel": 0.04}}}
    doc.update(over)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_auto_finds_the_repository_model_of_this_device_and_sweep(tmp_path):
    _model(tmp_path / "results" / "h200" / "noise" / "s.json")
    c = N.resolve("auto", sweep="s", device_name=DEV.name, device_slug=DEV.slug, root=tmp_path)
    assert c.model is not None and c.model.path == "results/h200/noise/s.json" and not c.note
    assert c.term("c1", 0.005) == (0.04, "measured: results/h200/noise/s.json (4 runs, abc123def456)")
    # the model never lowers the floor
    assert c.term("c1", 0.05)[0] == 0.05
    # another sweep, or no model folder: no model, no note
    none = N.resolve("auto", sweep="other", device_name=DEV.name, device_slug=DEV.slug, root=tmp_path)
    assert none.model is None and not none.note and none.term("c1", 0.005) == (0.005, "default 0.5%")
    prov = c.provenance()
    assert prov["path"] == "results/h200/noise/s.json" and len(prov["sha256"]) == 64 and prov["runs"] == 4


def test_a_case_missing_from_the_model_gets_the_default_and_says_so(tmp_path):
    c = N.resolve(str(_model(tmp_path / "m.json")), sweep=None, device_name=DEV.name, device_slug="h200",
                  root=tmp_path)
    term, which = c.term("not-there", 0.005)
    assert term == 0.005 and which == "default 0.5% (case not in m.json)"


def test_auto_ignores_another_devices_model_with_a_note(tmp_path):
    _model(tmp_path / "results" / "h200" / "noise" / "s.json", device="NVIDIA H100 80GB HBM3")
    c = N.resolve("auto", sweep="s", device_name=DEV.name, device_slug=DEV.slug, root=tmp_path)
    assert c.model is None and "measured on NVIDIA H100 80GB HBM3, not NVIDIA H200: ignored" in c.note
    assert c.provenance()["note"] == c.note and c.provenance()["path"] is None
    # named explicitly, it is used as asked, with the note
    c = N.resolve(str(tmp_path / "results" / "h200" / "noise" / "s.json"), sweep="s", device_name=DEV.name,
                  device_slug=DEV.slug, root=tmp_path)
    assert c.model is not None and "used as asked" in c.note


def test_none_and_a_missing_path(tmp_path):
    _model(tmp_path / "results" / "h200" / "noise" / "s.json")
    assert N.resolve("none", sweep="s", device_name=DEV.name, device_slug=DEV.slug, root=tmp_path).model is None
    with pytest.raises(UsageError, match="no such noise model file"):
        N.resolve(str(tmp_path / "nope.json"), sweep="s", device_name=DEV.name, device_slug="h200", root=tmp_path)


@pytest.mark.parametrize("doc,key", [
    ("{not json", "JSON"),
    ("[1, 2]", "expected an object"),
    (json.dumps({"device": "NVIDIA H200", "runs": 1, "cases": {}}), "runs: expected the number of runs"),
    (json.dumps({"runs": 3, "cases": {}}), "device: expected the GPU's name"),
    (json.dumps({"device": "NVIDIA H200", "runs": 3, "cases": []}), "cases: expected an object"),
    (json.dumps({"device": "NVIDIA H200", "runs": 3, "cases": {"c1": {"rerun_rel": "0.1"}}}),
     "cases.c1.rerun_rel: expected a number between 0 and 1"),
    (json.dumps({"device": "NVIDIA H200", "runs": 3, "cases": {"c1": {"rerun_rel": 2}}}), "between 0 and 1"),
])
def test_a_malformed_model_is_one_line_naming_file_and_key(tmp_path, doc, key):
    p = tmp_path / "results" / "h200" / "noise" / "s.json"
    p.parent.mkdir(parents=True)
    p.write_text(doc)
    with pytest.raises(SpecError) as e:
        N.resolve("auto", sweep="s", device_name=DEV.name, device_slug=DEV.slug, root=tmp_path)
    assert key in str(e.value) and "s.json" in str(e.value) and "\n" not in str(e.value)


def test_the_cli_exits_2_on_a_malformed_model_before_any_case(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": "x", "runs": 3, "cases": {"c1": {"rerun_rel": null}}}')
    code, out, err = run_cli(["sweep", "count-block", "--quick", "--interpret", "--out", str(tmp_path / "o"),
                              "--timing", f"noise={bad}"], capsys)
    assert code == 2 and "bad.json: cases.c1.rerun_rel: expected a number" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--interpret", "--out", str(tmp_path / "o"),
                            "--timing", "noise="], capsys)
    assert code == 2 and "--timing noise: expected auto, none or the path" in err


def test_a_missing_model_file_is_named_as_it_was_given(tmp_path, capsys):
    """The setting from --timing is named as that option, as its other errors are; from the spec, by its key."""
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--interpret", "--out", str(tmp_path / "o"),
                            "--timing", f"noise={tmp_path / 'nope.json'}"], capsys)
    assert code == 2 and err.startswith(f"error: --timing noise: {tmp_path / 'nope.json'}: no such noise model file")
    spec = tmp_path / "s.yaml"
    spec.write_text(load_spec("count-block").path.read_text() + f"timing: {{noise: {tmp_path / 'nope.json'}}}\n")
    code, _, err = run_cli(["sweep", str(spec), "--quick", "--interpret", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith(f"error: timing.noise: {tmp_path / 'nope.json'}: no such noise model file")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_timing_setting_is_validated_in_specs_and_overrides():
    t = Timing()
    assert t.noise == "auto"
    apply_timing_overrides(t, "noise=none")
    assert t.noise == "none"
    with pytest.raises(UsageError, match="noise"):
        apply_timing_overrides(t, "noise=3")


def test_the_auto_path_is_under_the_repository_root():
    assert N.auto_path("count-block", "h200") == PACKAGE_ROOT / "results" / "h200" / "noise" / "count-block.json"
    # a sweep name read from a results file never builds a path outside the models folder
    for sweep, slug in (("../../../etc/x", "h200"), ("count-block", "../h200"), ("..", "h200"), ({"a": 1}, "h200")):
        assert N.auto_path(sweep, slug) is None
    assert "not a plain name" in N.resolve("auto", sweep="../../x", device_name="NVIDIA H200", device_slug="h200").note


# ----------------------------------------------------------------------------------- the timer


def _time_one(timing, device, case_id_in_model: bool, tmp_path):
    spec = load_spec("count-block")
    spec.timing = timing
    case = expand(spec, quick=True)[0]
    cases = {case.id if case_id_in_model else "other": {"rerun_rel": 0.03}}
    model = _model(tmp_path / "results" / device.slug / "noise" / "count-block.json", device=device.name, cases=cases)
    N.bind(timing, N.resolve("auto", sweep="count-block", device_name=device.name, device_slug=device.slug,
                             root=tmp_path))

    def time_groups(make_group, **kw):  # one group, every sample 2.0 µs: within-run noise 0
        make_group(0)
        xs = [2.0] * 40
        return Samples(xs, kw["launches_per_graph"], 40, 0.01, "noise", [xs])

    timer = Timer(timing, Placements(timing, device, time_it=True), time_groups=time_groups,
                  clocks=lambda i: {"sm_mhz": None, "sm_max_mhz": None}, sleep=lambda s: None)
    rec = Record("count-block", "count", case.id, case.variant, case.label, "ok", params=dict(case.params))
    timer.time(case, rec, [SimpleNamespace(launch=lambda: None)], launches_per_graph=200)
    return rec, model


def test_the_timer_adds_the_models_term_for_the_case(tmp_path):
    dev = detect(True)
    rec, model = _time_one(Timing(), dev, True, tmp_path)
    t = rec.timing
    assert t["rerun_rel"] == 0.03 and t["rel_noise_within"] == 0.0 and t["rel_noise"] == pytest.approx(0.03)
    assert t["noise_model"] == f"measured: results/{dev.slug}/noise/count-block.json (4 runs, abc123def456)"


def test_the_timer_falls_back_to_the_default_for_a_case_not_in_the_model(tmp_path):
    dev = detect(True)
    rec, _ = _time_one(Timing(), dev, False, tmp_path)
    assert rec.timing["rerun_rel"] == 0.005 and rec.timing["rel_noise"] == pytest.approx(0.005)
    assert rec.timing["noise_model"].startswith("default 0.5% (case not in ")


def test_an_unresolved_auto_setting_times_with_the_default():
    dev = detect(True)
    timing = Timing()
    timer = Timer(timing, Placements(timing, dev, time_it=True))
    c = timer.noise()
    assert c.model is None and c.term("x", timing.rerun_rel) == (0.005, "default 0.5%")
    # an explicit model path is read by the timer itself (a command that did not resolve it)
    timing.noise = "none"
    assert Timer(timing, Placements(timing, dev, time_it=True)).noise().model is None


def test_the_bound_choice_pickles_with_the_timing(tmp_path):
    import pickle

    timing = Timing()
    N.bind(timing, N.resolve(str(_model(tmp_path / "m.json")), sweep=None, device_name=DEV.name,
                             device_slug="h200", root=tmp_path))
    timing.noise = str(tmp_path / "m.json")
    N.bind(timing, N.bound(timing) or N.resolve(timing.noise, sweep=None, device_name=DEV.name, device_slug="h200"))
    again = pickle.loads(pickle.dumps(timing))
    assert N.bound(again) is not None and N.bound(again).model.cases == {"c1": 0.04}
    # a setting changed after binding is not silently served by the old choice
    again.noise = "none"
    assert N.bound(again) is None


def test_the_page_line_names_the_model_and_the_cases_outside_it():
    recs = [Record("s", "count", c, "p", "p", "ok", timing={"median_us": 1.0, "noise_model": w})
            for c, w in (("a", "measured: m.json (4 runs, abc)"), ("b", "default 0.5% (case not in m.json)"))]
    prov = {"timing": {"rerun_rel": 0.005}, "noise_model": {"setting": "auto", "path": "m.json", "sha256": "f" * 64,
                                                           "applied": "measured: m.json (4 runs, abc)"}}
    line = N.page_line(prov, recs)
    assert "measured: m.json (4 runs, abc)" in line and "1 of 2 cases are not in it" in line
    prov["noise_model"] = {"setting": "auto", "path": None}
    assert "default 0.5% run-to-run term" in N.page_line(prov, recs)
    assert "none recorded" in N.page_line({"timing": {"rerun_rel": 0.005}}, recs)
    assert N.page_line(prov, [Record("s", "count", "a", "p", "p", "ok")]) is None


def test_a_quick_interpreter_sweep_page_says_which_noise_model(tmp_path, capsys):
    # the interpreter times nothing: the page says there is no timing, the model is not recorded
    code, _, err = run_cli(["sweep", "count-block", "--quick", "--interpret", "--out", str(tmp_path), "--format",
                            "json", "--timing", "noise=none"], capsys)
    assert code == 0, err
    prov, _ = load_results(next(tmp_path.glob("*/count-block-quick.json")))
    assert prov["timing"]["noise"] == "none" and "noise_model" not in prov


def test_the_sweep_page_header_names_the_timer_and_the_noise_model():
    from moebench.report.sweep import sweep_markdown

    prov, recs = load_results(PACKAGE_ROOT / "results" / "h200" / "count-block.json")
    for r in recs:
        r.timing["noise_model"] = "measured: results/h200/noise/count-block.json (6 runs, abc)"
    recs[0].timing["noise_model"] = "default 0.5% (case not in results/h200/noise/count-block.json)"
    prov["timing"]["rerun_rel"] = 0.005
    prov["noise_model"] = {"setting": "auto", "path": "results/h200/noise/count-block.json", "sha256": "ab" * 32,
                           "applied": "measured: results/h200/noise/count-block.json (6 runs, abc)"}
    md = sweep_markdown(load_spec("count-block"), recs, prov)
    lines = md.splitlines()
    i = next(k for k, x in enumerate(lines) if x.startswith("- Timer: CUDA-graph replay"))
    assert lines[i + 1].startswith("- Noise model: measured: results/h200/noise/count-block.json (6 runs, abc), "
                                   "sha256 abababababab")
    assert f"1 of {len(recs)} cases are not in it" in lines[i + 1]


def test_a_results_file_given_as_a_noise_model_is_named_as_one():
    """It once read "device: expected the GPU's name, got null"."""
    with pytest.raises(SpecError, match="a results file, not a noise model"):
        N.load(PACKAGE_ROOT / "results/h200/count-block.json")
