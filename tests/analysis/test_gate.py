"""The CI gate fails closed and never passes a regression: UNCLEAR fails it (NOISY passes, named, and
only on measured run-to-run terms), other timer settings or devices stop it (read the same way from a
results file and from a stream), a stated noise is checked against its parts and its model, a case
that failed in NEW fails it, each metric knows its direction, the SM clock and --cycles. Each attack
is built in the test from committed H200 results or small constructed files."""

import copy
import hashlib
import itertools
import json
from pathlib import Path

import pytest

from moebench.analysis.compare import classify, compare_files, compare_records
from moebench.core.records import Record
from tests.clirun import run_cli

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results" / "h200"
H200X2 = ROOT / "results" / "h200x2"
TIMING = {"l2": "warm", "groups": 4, "placements": 8, "launches_per_graph": 200, "min_replays": 20}


def _model(path: Path, terms: dict[str, float], *, device="NVIDIA H200", sweep="s") -> dict:
    """A noise model file at `path` and the provenance.noise_model that names it (beside its results)."""
    path.write_text(json.dumps({"device": device, "sweep": sweep, "runs": 6,
                                "cases": {c: {"rerun_rel": v} for c, v in terms.items()}}))
    return {"setting": path.name, "path": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _file(path: Path, medians: list[float], *, noise=0.002, rerun=0.002, timing=None, device="NVIDIA H200",
          mhz=None, work=None, model=None, l2=None) -> Path:
    recs = []
    for i, us in enumerate(medians):
        t = {"median_us": us, "rel_noise": noise}
        if rerun is not None:
            t["rerun_rel"] = rerun
        if mhz is not None:
            t.update(sm_clock_start_mhz=mhz, sm_clock_end_mhz=mhz)
        recs.append(Record("s", "count", f"c{i}", "persistent", "persistent", "ok", params={"tokens": 2 ** i},
                           timing=t, work=dict(work[i]) if work else {}))
    dev = {"name": device, "backend": "cuda", "sm_count": 132, **({"l2_bytes": l2} if l2 else {})}
    prov = {"sweep": "s", "device": dev,
            "timing": dict(TIMING, **(timing or {})), **({"noise_model": model} if model else {})}
    path.write_text(json.dumps({"provenance": prov, "records": [r.to_json() for r in recs]}))
    return path


def _gate(capsys, a, b, *extra):
    return run_cli(["compare", str(a), str(b), "--fail-on-regression", *map(str, extra)], capsys)


def test_all_unclear_fails_the_gate(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 20, noise=0.3, rerun=0.005)
    b = _file(tmp_path / "b.json", [1.3] * 20, noise=0.3, rerun=0.005)  # all 30% slower, inside the noise
    code, out, err = _gate(capsys, a, b)
    assert code == 2 and "20 of 20 cases are UNCLEAR" in err and "--allow-unclear" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = _gate(capsys, a, b, "--allow-unclear")  # let through, but the gate vouched for no case
    assert code == 2 and "no case is SAME or FASTER" in err


def test_a_case_inside_its_wide_measured_term_is_noisy_passes_and_is_named(tmp_path, capsys):
    # one case carries a measured run-to-run term of 7.5% (each run precise to 0.9%); its two runs sit
    # 8.6% apart, inside the stated ±10.7%, which cannot resolve 5%: NOISY, and the gate says so
    model = _model(tmp_path / "m.json", {"c1": 0.0753})
    a = _file(tmp_path / "a.json", [1.0, 3.50, 2.0], noise=0.0758, rerun=0.0753, model=model)
    b = _file(tmp_path / "b.json", [1.0, 3.80, 2.0], noise=0.0758, rerun=0.0753, model=model)
    for p in (a, b):  # each record states its within-run part as the timer does; the others are narrow
        doc = json.loads(p.read_text())
        for r in doc["records"]:
            narrow = r["case_id"] != "c1"
            r["timing"].update(rel_noise_within=0.002 if narrow else 0.009)
            if narrow:
                r["timing"].update(rel_noise=0.0054, rerun_rel=0.005)
        p.write_text(json.dumps(doc))
    code, out, err = _gate(capsys, a, b)
    assert code == 0 and "2 SAME, 0 FASTER, 0 SLOWER, 1 NOISY, 0 UNCLEAR" in " ".join(out.split())
    assert "1 of 3 cases are NOISY" in " ".join(err.split()) and "c1 persistent: +8.57%" in " ".join(err.split())
    code, _, err = _gate(capsys, a, b, "--strict-noise")
    assert code == 2 and "--strict-noise fails them" in " ".join(err.split())
    # a gate that could vouch for no case does not pass: at 0.5% every case is UNCLEAR (let through),
    # none SAME
    code, _, err = _gate(capsys, a, b, "--threshold", "0.5", "--allow-unclear")
    assert code == 2 and "can vouch for no case" in " ".join(err.split())
    # a change past that noise is still caught: 3.50 -> 4.00 µs (+14%) is SLOWER
    c = _file(tmp_path / "c.json", [1.0, 4.00, 2.0], noise=0.0758, rerun=0.0753, model=model)
    assert _gate(capsys, a, c)[0] == 1
    # the same wide term with no model behind it is assumed: capped at 0.5%, so +8.6% is SLOWER
    d = _file(tmp_path / "d.json", [1.0, 3.80, 2.0], noise=0.0758, rerun=0.0753)
    code, _, err = _gate(capsys, _file(tmp_path / "e.json", [1.0, 3.50, 2.0], noise=0.0758, rerun=0.0753), d)
    assert code == 1 and "state a run-to-run term other than an assumed one may be" in " ".join(err.split())


def test_an_assumed_term_never_makes_a_case_noisy(tmp_path, capsys):
    """Issue 32: `within=None` counted the whole half-width as within-run, so an assumed floor made
    cases NOISY (the h200x2 pair at --threshold 10: 3 NOISY, exit 0)."""
    assert classify(10.0, 10.3, 0.043, 0.043, 0.05, within=None)[0] == "UNCLEAR"
    assert classify(10.0, 10.3, 0.043, 0.043, 0.05, within=(0.03, 0.03))[0] == "NOISY"
    # runs each precise to 3%, a 0.5% term assumed (no model): a 3% change inside the 4.3% noise
    a = _file(tmp_path / "a.json", [1.0] * 3, noise=0.0304, rerun=0.005)
    b = _file(tmp_path / "b.json", [1.03] * 3, noise=0.0304, rerun=0.005)
    code, out, err = _gate(capsys, a, b)
    assert code == 2 and "0 NOISY, 3 UNCLEAR" in " ".join(out.split()) and "UNCLEAR" in err
    # the same with the term measured (a model next to the files holds the cases): NOISY, passes
    model = _model(tmp_path / "m.json", {f"c{i}": 0.005 for i in range(3)})
    a = _file(tmp_path / "a.json", [1.0] * 3, noise=0.0304, rerun=0.005, model=model)
    b = _file(tmp_path / "b.json", [1.03] * 3, noise=0.0304, rerun=0.005, model=model)
    code, out, _ = _gate(capsys, a, b, "--allow-unclear")
    assert "3 NOISY" in " ".join(out.split())


def _doctored(tmp_path: Path, edit, name="new.json") -> tuple[Path, Path]:
    """results/h200/count-block.json, and a copy with `edit(record_index, timing)` applied to each record."""
    doc = json.loads((H200 / "count-block.json").read_text())
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    for i, r in enumerate(doc["records"]):
        edit(i, r["timing"])
    new = tmp_path / name
    new.write_text(json.dumps(doc))
    return base, new


def test_a_file_cannot_state_any_noise(tmp_path, capsys):
    """Issue 32: cases 2-20 1.5x slower, each stating rel_noise 1.0 (within 0.003, rerun 1.0): exit 0,
    19 NOISY. The run-to-run term is the named model's, not the record's: 19 SLOWER."""
    def wide(i, t):
        if i:
            t.update(median_us=t["median_us"] * 1.5, rel_noise=1.0, rel_noise_within=0.003, rerun_rel=1.0)

    base, new = _doctored(tmp_path, wide)
    code, out, err = _gate(capsys, base, new)
    assert code == 1 and "19 SLOWER" in out and "19 records state a run-to-run term other than their noise " \
        "model's (results/h200/noise/count-block.json)" in " ".join(err.split())


@pytest.mark.parametrize("parts, slower", [((0.5, 0.0033, 0.017), 1.5), ((0.3, 0.0, 0.0), 1.2)])
def test_a_record_whose_noise_parts_disagree_is_refused(tmp_path, capsys, parts, slower):
    def one(i, t):
        if i == 3:
            t.update(median_us=t["median_us"] * slower, rel_noise=parts[0], rel_noise_within=parts[1],
                     rerun_rel=parts[2])

    base, new = _doctored(tmp_path, one)
    code, _, err = _gate(capsys, base, new)
    assert code == 2 and f"rel_noise {parts[0]:g} is not hypot(" in err and "checked, not trusted" in err
    assert len(err.strip().splitlines()) == 1


def test_the_named_model_is_verified_by_its_hash(tmp_path, capsys):
    """provenance.noise_model was never read: pointing it at another file, or naming a wrong sha256,
    changed nothing. A model that is not the one named is not used (the term is then assumed)."""
    for edit in (lambda nm: nm.update(sha256="0" * 64), lambda nm: nm.update(path="../../etc/passwd"),
                 lambda nm: nm.update(path="/etc/passwd")):
        base, new = _doctored(tmp_path, lambda i, t: None)
        doc = json.loads(new.read_text())
        edit(doc["provenance"]["noise_model"])
        new.write_text(json.dumps(doc))
        rep, notes = compare_files(base, new, noise="none")
        assert any("no model used" in n for n in notes + rep.notes), notes + rep.notes
        assert "no verified noise model" in rep.noise_models["NEW"]
        assert "measured model results/h200/noise/count-block.json" in rep.noise_models["BASE"]


def test_a_named_model_is_found_by_its_sha256_or_its_archived_copy(tmp_path):
    from moebench.analysis.comparable import named

    call5 = json.loads((H200 / "repro/call5/fresh/count-block-run1.json").read_text())["provenance"]["noise_model"]
    m, why = named(call5, None)  # its model was re-calibrated since: the archive holds the bytes it names
    assert why == "" and m.path == "results/h200/noise/archive/count-block-968f7250c8b0.json"
    results = tmp_path / "r.json"
    nm = _model(tmp_path / "m.json", {"c": 0.01})
    assert named(nm, results)[0].cases == {"c": 0.01}
    for bad in ({**nm, "sha256": "0" * 64}, {**nm, "path": "../m.json"}, {**nm, "path": str(tmp_path / "m.json")},
                {**nm, "path": ["m.json"]}):
        m, why = named(bad, results)
        assert m is None and "no model used" in why
    assert named({"setting": "none", "path": None}, results) == (None, "")


def test_a_model_of_another_device_or_sweep_is_not_used_unless_asked(tmp_path, capsys):
    base, new = _doctored(tmp_path, lambda i, t: None)
    doc = json.loads(new.read_text())
    terms = {r["case_id"]: 1.0 for r in doc["records"]}  # a ±100% model would hide anything
    for kw, said in (({"device": "NVIDIA B200"}, "measured on NVIDIA B200"), ({"sweep": "act-grid"}, "act-grid")):
        doc["provenance"]["noise_model"] = _model(tmp_path / "m.json", terms, **{"sweep": "count-block", **kw})
        new.write_text(json.dumps(doc))
        rep, _ = compare_files(base, new, noise="none")
        assert any(said in n and "not used" in n for n in rep.notes) and "no verified" in rep.noise_models["NEW"]
        rep, _ = compare_files(base, new, noise="none", allow_foreign_model=True)
        assert any("used as asked" in n for n in rep.notes) and "m.json (sha256" in rep.noise_models["NEW"]
    # and --noise FILE of another device is refused with one line
    code, _, err = _gate(capsys, base, new, "--noise", str(tmp_path / "m.json"))
    assert code == 2 and "not 'count-block'" in err and "--allow-foreign-model" in err


def _stream(path: Path, prov: dict, records: list[dict]) -> Path:
    head = {k: prov.get(k) for k in ("sweep", "spec_sha256", "command", "timestamp", "git_commit")}
    lines = [{"run": {**head, "settings": prov["settings"]}}] + [{"record": r} for r in records]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("edit, said", [
    (lambda s: s["device"].update(name="NVIDIA B200", sm_count=148), "NVIDIA B200 (148 SMs)"),
    (lambda s: s["timing"].update(l2="cold"), "l2: 'warm' -> 'cold'"),
    (lambda s: s["switches"].update(MCORE_COUNT_TOKENS_BLOCK="64"), "$MCORE_COUNT_TOKENS_BLOCK"),
], ids=["device", "l2", "switch"])
def test_streams_are_held_to_the_device_and_settings_gates(tmp_path, capsys, edit, said):
    """Issue 32: two .partial.jsonl, the second on a B200 with a cold L2 and times x0.8: exit 0, 20
    FASTER (their device and settings are under `settings`, which the rule did not read)."""
    doc = json.loads((H200 / "count-block.json").read_text())
    a = _stream(tmp_path / "a.partial.jsonl", doc["provenance"], doc["records"])
    other = copy.deepcopy(doc)
    edit(other["provenance"]["settings"])
    for r in other["records"]:
        r["timing"]["median_us"] *= 0.8
    b = _stream(tmp_path / "b.partial.jsonl", other["provenance"], other["records"])
    code, _, err = _gate(capsys, a, b)
    assert code == 2 and said in err and ("--allow-device" in err or "--allow-settings" in err)
    assert _gate(capsys, a, _stream(tmp_path / "c.partial.jsonl", doc["provenance"], doc["records"]))[0] == 0


def test_a_case_that_failed_only_in_new_fails_the_gate(tmp_path, capsys):
    doc = json.loads((H200 / "count-block.json").read_text())
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    extra = copy.deepcopy(doc["records"][0])
    extra.update(case_id="f" * 12, status="mismatch", timing={})
    doc["records"].append(extra)
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    code, out, err = _gate(capsys, base, new)
    assert code == 1 and "1 cases failed in NEW (ffffffffffff persistent: mismatch)" in err


@pytest.mark.parametrize("setting", [{"l2": "cold"}, {"groups": 1}, {"placements": 1}])
def test_other_timer_settings_stop_the_comparison(tmp_path, capsys, setting):
    a = _file(tmp_path / "a.json", [1.0] * 20)
    b = _file(tmp_path / "b.json", [0.8] * 20, timing=setting)  # cold L2 "20 FASTER", groups=1 "20 SLOWER"
    key = next(iter(setting))
    code, _, err = _gate(capsys, a, b)
    assert code == 2 and "other settings" in err and f"{key}:" in err and "--allow-settings" in err
    code, out, _ = _gate(capsys, a, b, "--allow-settings")
    assert code == 0 and "20 FASTER" in out


@pytest.mark.parametrize("setting", [{"min_replays": 200}, {"noise": "auto"}, {"noise": "none", "rerun_rel": 0.01}])
def test_settings_that_only_decide_how_long_or_the_stated_noise_may_differ(tmp_path, capsys, setting):
    # an older file has no timing.noise (absent): its half-widths are its own, the medians the same kind
    a = _file(tmp_path / "a.json", [1.0] * 4)
    b = _file(tmp_path / "b.json", [1.0] * 4, timing=setting)
    assert _gate(capsys, a, b)[0] == 0


def test_another_device_stops_the_comparison(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 4)
    b = _file(tmp_path / "b.json", [1.0] * 4, device="NVIDIA B200")
    code, _, err = _gate(capsys, a, b)
    assert code == 2 and "NVIDIA B200" in err and "--allow-device" in err
    code, _, err = _gate(capsys, a, b, "--allow-device")
    assert code == 0 and "cross-device" in err


def test_another_l2_size_under_one_name_stops_the_comparison(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 4, l2=60 << 20)
    b = _file(tmp_path / "b.json", [1.0] * 4, l2=40 << 20)
    code, _, err = _gate(capsys, a, b)
    assert code == 2 and "l2_bytes 62914560 -> 41943040" in err and "--allow-device" in err
    unstated = _file(tmp_path / "c.json", [1.0] * 4)  # a file that states no L2 is held to the rest
    assert _gate(capsys, a, unstated)[0] == 0


def test_throughput_is_higher_is_better(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 20, work=[{"gbps": 100.0}] * 20)
    b = _file(tmp_path / "b.json", [1.0] * 20, work=[{"gbps": 70.0}] * 20)  # a 30% throughput loss
    code, out, err = _gate(capsys, a, b, "--metric", "gbps")
    assert code == 1 and "20 SLOWER" in out and "higher is better" in out
    code, out, _ = _gate(capsys, b, a, "--metric", "gbps")
    assert code == 0 and "20 FASTER" in out


def test_a_metric_of_unknown_direction_is_refused(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 2, work=[{"occupancy_pct": 6.0}] * 2)
    code, _, err = _gate(capsys, a, a, "--metric", "occupancy_pct")
    assert code == 2 and "higher or a lower 'occupancy_pct'" in err


def test_the_migrated_h200x2_runs_are_judged_with_todays_model(capsys):
    """results/h200x2: a one-GPU and a two-worker count-block run of one commit (74adf47, before the
    per-process ceilings fix), re-stated once with today's fields and model. With the 5% floor the
    gate assumed for them, their 6.7% case hid; under the measured model it is SLOWER at 5%, and at
    10% nothing is (one case stays UNCLEAR)."""
    a, b = H200X2 / "count-block-one-gpu.json", H200X2 / "count-block-devices-all.json"
    for p in (a, b):
        doc = json.loads(p.read_text())
        assert "migrated once" in doc["provenance"]["migrated"]
        assert all(abs(r["timing"]["rel_noise"] - (r["timing"]["rel_noise_within"] ** 2 + r["timing"]["rerun_rel"] ** 2)
                       ** 0.5) < 1e-5 for r in doc["records"])
    code, out, err = _gate(capsys, a, b)
    assert code == 1 and "1 SLOWER" in out and "+6.7% (persistent tokens=256, block_size=1024)" in out
    assert "measured model results/h200/noise/count-block.json" in out
    code, out, _ = _gate(capsys, a, b, "--threshold", "10", "--allow-unclear")
    assert code == 0 and "0 SLOWER, 0 NOISY, 1 UNCLEAR" in " ".join(out.split())


def test_every_same_commit_pair_of_the_repro_calls_passes():
    """results/h200/repro/call5-7: 24 count-block runs of 732d085 on two GPUs, 12 act-grid, and 6 + 6
    of 3238bc1: every pair of one commit passes the gate (exit 0), as `moebench compare` judges it."""
    groups: dict[tuple, list[Path]] = {}
    for f in sorted((H200 / "repro").glob("call[567]/*/*-run*.json")):
        prov = json.loads(f.read_text())["provenance"]
        groups.setdefault((prov["git_commit"], prov["sweep"]), []).append(f)
    assert sorted(len(v) for v in groups.values()) == [6, 6, 12, 24]
    pairs = [p for files in groups.values() for p in itertools.combinations(files, 2)]
    failed = [(a, b, why) for a, b in pairs for code, why in [compare_files(a, b)[0].gate()] if code]
    assert len(pairs) == 372 and not failed, failed[:3]


def _relabelled(tmp_path: Path) -> tuple[Path, Path]:
    """results/h200/count-block.json, and a copy whose BLOCK 128 / 256 tokens case carries the
    records of BLOCK 1024 at 256 tokens: a real regression of that case."""
    doc = json.loads((H200 / "count-block.json").read_text())
    at = {(r["params"]["block_size"], r["params"]["tokens"]): r for r in doc["records"]}
    slow = copy.deepcopy(doc)
    target = next(r for r in slow["records"] if (r["params"]["block_size"], r["params"]["tokens"]) == (128, 256))
    target["timing"] = copy.deepcopy(at[(1024, 256)]["timing"])
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(doc))
    new.write_text(json.dumps(slow))
    return base, new


def test_the_gate_still_fails_on_a_real_regression(tmp_path, capsys):
    base, new = _relabelled(tmp_path)
    code, out, err = _gate(capsys, base, new, "--allow-unclear")
    assert code == 1 and "1 SLOWER" in out and "block_size=128" in out
    code, _, err = _gate(capsys, base, new)
    assert code == 1 and "SLOWER" in err


def test_clocks_that_differ_are_said_and_cycles_compare_them(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [2.0] * 4, mhz=1980)
    b = _file(tmp_path / "b.json", [2.64] * 4, mhz=1500)  # the same cycles at a lower clock
    code, out, err = _gate(capsys, a, b)
    assert code == 1 and "SM clocks differ: BASE 1980 MHz, NEW 1500 MHz" in err and "--cycles" in err
    assert "3960 / 3960" in out  # the cycles column
    code, out, err = _gate(capsys, a, b, "--cycles")
    assert code == 0 and "4 SAME" in out and "compared in cycles" in err
    code, _, err = _gate(capsys, a, _file(tmp_path / "c.json", [2.0] * 4), "--cycles")
    assert code == 2 and "could not be judged" in err


def test_show_has_a_cycles_column(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [2.0, 3.0], mhz=1980)
    code, out, err = run_cli(["show", str(a), "--rows", "label", "--cols", "tokens", "--metric", "cycles"], capsys)
    assert code == 0, err
    assert "3,960" in out and "5,940" in out


def test_a_case_unavailable_in_both_files_does_not_blind_the_gate():
    """act-grid's upstream cases are `unavailable` where Megatron is not installed: two such runs
    of one commit pass the gate on the cases both measured (an H200 repro run failed closed on all
    15 pairs before)."""
    from moebench.errors import UsageError

    def rec(cid, status, us):
        t = {"median_us": us, "rel_noise": 0.00707, "rel_noise_within": 0.005, "rerun_rel": 0.005} if us else {}
        return Record("s", "act", cid, "v", "v", status, params={"rows": 1}, timing=t)

    base = [rec("a", "ok", 2.0), rec("u", "unavailable", None)]
    new = [rec("a", "ok", 2.001), rec("u", "unavailable", None)]
    code, why = compare_records(base, new).gate()
    assert code == 0, why
    # NEW lost a case BASE measured: still blind, the gate fails closed
    code, why = compare_records([rec("a", "ok", 2.0), rec("u", "ok", 3.0)], new).gate()
    assert code == 2 and "could not be judged" in why
    # nothing measured on either side: nothing compared
    try:
        code, _ = compare_records([rec("u", "unavailable", None)], [rec("u", "unavailable", None)]).gate()
    except UsageError:
        code = 2  # no timings at all: refused before any verdict
    assert code == 2


def test_two_gpus_of_one_model_compare_with_a_note(tmp_path, capsys):
    a = _file(tmp_path / "a.json", [1.0] * 4)
    b = _file(tmp_path / "b.json", [1.0] * 4)
    for p, uuid in ((a, "GPU-82e5abc4-a10c"), (b, "GPU-9ba9c8ba-b47e")):
        doc = json.loads(p.read_text())
        doc["provenance"]["device"]["uuid"] = uuid
        p.write_text(json.dumps(doc))
    code, _, err = _gate(capsys, a, b)
    assert code == 0 and "two GPUs of one model (GPU-82e5abc4, GPU-9ba9c8ba)" in " ".join(err.split())
    code, _, err = _gate(capsys, a, a)
    assert code == 0 and "two GPUs" not in err


def test_detect_spells_the_uuid_as_nvml_does():
    from types import SimpleNamespace

    from moebench.core.device import gpu_uuid

    assert gpu_uuid(SimpleNamespace(uuid="82e5abc4-a10c-cb1f")) == "GPU-82e5abc4-a10c-cb1f"
    assert gpu_uuid(SimpleNamespace(uuid="MIG-1234")) == "MIG-1234"
    assert gpu_uuid(SimpleNamespace()) is None


def test_a_file_without_its_device_is_named_as_such(tmp_path, capsys):
    """NEW without provenance.device once read "NEW on None (None SMs)"."""
    doc = json.loads((ROOT / "results/h200/count-block.json").read_text())
    doc["provenance"].pop("device")
    doc["provenance"].pop("settings", None)
    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc))
    code, _, err = run_cli(["compare", str(ROOT / "results/h200/count-block.json"), str(new), "--fail-on-regression"],
                           capsys)
    assert code == 2 and "NEW on a device the file does not name (no provenance.device.name)" in err
    assert "None" not in err


def test_a_file_without_timings_is_named_as_such_not_as_a_missing_metric():
    """An interpreter run's records carry compile_s alone; the gate once answered "--metric: BASE has
    no column 'median_us'; its timing columns: compile_s" to a user who gave no --metric."""
    from moebench.analysis.compare import check_times
    from moebench.errors import UsageError

    recs = [Record("s", "count", "c1", "v", "v", "ok", params={"tokens": 1}, timing={"compile_s": 0.2})]
    with pytest.raises(UsageError, match=r"^BASE holds no timings \(an interpreter or a verify run records none\)$"):
        check_times(recs, "BASE", "median_us")


def test_an_unjudged_case_names_the_part_of_the_interval_it_lacks():
    """A NEW record without rel_noise was said to lack "the run-to-run term (rerun_rel)"."""
    def rec(**t):
        return Record("s", "count", "c1", "v", "v", "ok", params={"tokens": 1},
                      timing={"median_us": 2.0, "rel_noise": 0.007, "rel_noise_within": 0.005, "rerun_rel": 0.005, **t})

    rep = compare_records([rec()], [rec(rel_noise=None, rel_noise_within=None)])
    assert rep.rows[0].note == "no interval stated: NEW has no timing.rel_noise"
    rep = compare_records([rec(rerun_rel=None, rel_noise_within=None)], [rec(rel_noise=None, rel_noise_within=None)])
    assert rep.rows[0].note == "no interval stated: BASE has no timing.rerun_rel; NEW has no timing.rel_noise"
