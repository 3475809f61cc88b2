"""The CI gate fails closed (issue 24 item 3, issue 23 items 2 and 4): UNCLEAR fails it (NOISY passes,
named), other timer
settings or devices stop it, each metric knows its direction, each file's own noise model, the SM
clock and --cycles. Built from committed H200 results and small constructed files."""

import copy
import json
from pathlib import Path

import pytest

from moebench.analysis.compare import LEGACY_RERUN_REL, compare_records, judged_noise
from moebench.core.records import Record
from tests.clirun import run_cli

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results" / "h200"
H200X2 = ROOT / "results" / "h200x2"
TIMING = {"l2": "warm", "groups": 4, "placements": 8, "launches_per_graph": 200, "min_replays": 20}


def _file(path: Path, medians: list[float], *, noise=0.002, rerun=0.002, timing=None, device="NVIDIA H200",
          mhz=None, work=None) -> Path:
    recs = []
    for i, us in enumerate(medians):
        t = {"median_us": us, "rel_noise": noise}
        if rerun is not None:
            t["rerun_rel"] = rerun
        if mhz is not None:
            t.update(sm_clock_start_mhz=mhz, sm_clock_end_mhz=mhz)
        recs.append(Record("s", "count", f"c{i}", "persistent", "persistent", "ok", params={"tokens": 2 ** i},
                           timing=t, work=dict(work[i]) if work else {}))
    prov = {"sweep": "s", "device": {"name": device, "backend": "cuda", "sm_count": 132},
            "timing": dict(TIMING, **(timing or {}))}
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
    code, _, _ = _gate(capsys, a, b, "--allow-unclear")
    assert code == 0


def test_a_case_inside_its_wide_measured_term_is_noisy_passes_and_is_named(tmp_path, capsys):
    # one case carries a measured run-to-run term of 7.5% (each run precise to 0.9%); its two runs sit
    # 8.6% apart, inside the stated ±10.7%, which cannot resolve 5%: NOISY, and the gate says so
    a = _file(tmp_path / "a.json", [1.0, 3.50, 2.0], noise=0.0758, rerun=0.0753)
    b = _file(tmp_path / "b.json", [1.0, 3.80, 2.0], noise=0.0758, rerun=0.0753)
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
    # a gate that could vouch for no case does not pass: at 0.5% the narrow cases are NOISY too (±0.76%
    # stated, ±0.28% within), the wide one UNCLEAR (let through), none SAME
    code, _, err = _gate(capsys, a, b, "--threshold", "0.5", "--allow-unclear")
    assert code == 2 and "it can vouch for no case" in " ".join(err.split())
    # a change past that noise is still caught: 3.50 -> 4.00 µs (+14%) is SLOWER
    c = _file(tmp_path / "c.json", [1.0, 4.00, 2.0], noise=0.0758, rerun=0.0753)
    assert _gate(capsys, a, c)[0] == 1


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


def test_each_file_keeps_its_own_noise_model():
    new = Record("s", "count", "c", "v", "v", "ok", timing={"median_us": 1.0, "rel_noise": 0.006, "rerun_rel": 0.005})
    old = Record("s", "count", "c", "v", "v", "ok", timing={"median_us": 1.0, "rel_noise": 0.0002})
    assert judged_noise(new) == 0.006
    assert judged_noise(old) == pytest.approx((0.0002 ** 2 + LEGACY_RERUN_REL ** 2) ** 0.5)
    rep = compare_records([old], [new])
    assert "older moebench" in rep.noise_models["BASE"] and "rerun_rel 0.5%" in rep.noise_models["NEW"]


def test_two_runs_of_one_commit_do_not_cry_wolf(capsys):
    """Issue 23: the one-GPU and the two-worker count-block runs of one commit exited 1 (SLOWER
    +6.68% at BLOCK 1024 / 256 tokens, noise ±0.02%): files with within-run noise only."""
    a, b = H200X2 / "count-block-one-gpu.json", H200X2 / "count-block-devices-all.json"
    code, out, err = _gate(capsys, a, b)
    assert code != 1 and "0 SLOWER" in out and "│ SLOWER" not in out
    assert "within-run noise only" in out and f"+{100 * LEGACY_RERUN_REL:g}% run-to-run floor" in out
    code, out, _ = _gate(capsys, a, b, "--allow-unclear")
    assert code == 0 and "0 SLOWER" in out


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
    from moebench.errors import UsageError
    """act-grid's upstream cases are `unavailable` where Megatron is not installed: two such runs
    of one commit pass the gate on the cases both measured (an H200 repro run failed closed on all
    15 pairs before)."""
    from moebench.analysis.compare import compare_records
    from moebench.core.records import Record

    def rec(cid, status, us):
        t = {"median_us": us, "rel_noise": 0.01, "rel_noise_within": 0.005, "rerun_rel": 0.005} if us else {}
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
