"""`recommend --emit env|json` and `--check`: the kill-switch values a runtime reads, written only
where they beat the shipped default beyond the stated intervals, and the check that re-runs the
switch's readers with and without the emitted environment. No GPU: the check's run is replaced
by a stand-in that honours the switch (and, once, by the real session under the interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import warm

from clirun import run_cli
from moebench.analysis.recommend import check_cases, decide, emit_document, env_text, judge_check, switches
from moebench.core.records import Record
from moebench.errors import UsageError
from moebench.core.family import catalogue

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "results" / "h200" / "count-block.json"
COUNT = catalogue()["count"]
VAR = "MCORE_COUNT_TOKENS_BLOCK"
# the seed-000 PR's table (GB200, µs per launch), block -> times at 256, 1024, 4096, 16384 tokens
TABLE = {64: [2.05, 2.35, 5.51, 16.07], 128: [2.11, 2.44, 4.66, 13.34],
         256: [2.93, 3.03, 4.56, 13.26], 1024: [8.08, 8.07, 8.23, 13.57]}
TOKENS = [256, 1024, 4096, 16384]
FULL = json.loads(REAL.read_text())["records"][0]["params"]  # every parameter of the family, as a run records them


def recs(rel: float = 0.004, table=TABLE) -> list[Record]:
    out = []
    for b, ts in table.items():
        for tok, us in zip(TOKENS, ts):
            params = {**FULL, "tokens": tok, "block_size": b}
            out.append(Record("count-block", "count", f"c{b}-{tok}", "persistent", "persistent", "ok", params=params,
                              timing={"median_us": us, "rel_noise": rel}))
    return out


def test_switches_come_from_the_variant_declarations():
    sw = switches(COUNT)["block_size"]
    assert (sw.var, sw.default, sw.readers) == (VAR, 128, ("shipped",))
    act = switches(catalogue()["act"])["grid_cap"]
    assert (act.var, act.default) == ("MCORE_MOE_ACTIVATION_GRID_CAP", 8192)


def test_emits_a_value_that_beats_the_default_beyond_noise():
    [d] = decide(recs(), COUNT, weights_text="256=1")
    assert d.emit and d.value == 64 and "intervals separated" in d.reason
    m = d.mix()
    assert m["choice_us"] == pytest.approx(2.05) and m["default_us"] == pytest.approx(2.11)
    assert m["choice_interval"][1] < m["default_interval"][0]


def test_overlapping_intervals_keep_the_default_with_the_reason():
    [d] = decide(recs(rel=0.02), COUNT, weights_text="256=1")  # 2.05 +- 2% overlaps 2.11 +- 2%
    assert not d.emit and d.value == 128 and "overlap" in d.reason and "64" in d.reason


def test_the_mix_decides():
    [d] = decide(recs(), COUNT, weights_text="4096=0.5,16384=0.5")  # the long buckets: 256 wins there
    assert d.choice.value == 256 and d.emit
    [d] = decide(recs(), COUNT)  # all four shapes alike: the default is the fastest on average
    assert not d.emit and d.value == 128 and "default block_size=128 is the fastest over the mix" in d.reason


def test_a_default_not_measured_is_kept_and_said():
    [d] = decide(recs(table={k: v for k, v in TABLE.items() if k != 128}), COUNT)
    assert not d.emit and d.value == 128 and "no time at every shape" in d.reason


def test_document_states_device_driver_commit_and_evidence():
    [d] = decide(recs(), COUNT, weights_text="256=0.7,1024=0.3")
    prov = {"device": {"name": "NVIDIA H200", "driver": "580.1", "cuda": "13.0", "torch": "2.11", "triton": "3.6"},
            "git_commit": "abc123", "sweep": "count-block", "spec_sha256": "f" * 64, "timestamp": "t"}
    doc = emit_document([d], prov, "x.json")
    assert doc["environment"] == {VAR: "64"} and doc["device"] == "NVIDIA H200" and doc["commit"] == "abc123"
    case = doc["switches"][0]["cases"][0]
    assert case["shape"] == {"tokens": 256} and case["weight"] == pytest.approx(0.7)
    assert case["choice_us"] == 2.05 and case["default_us"] == 2.11 and case["delta"] == pytest.approx(2.05 / 2.11 - 1)
    text = env_text(doc)
    assert f"\n{VAR}=64\n" in text and "driver 580.1" in text and "commit abc123" in text
    assert all(line.startswith("#") or line == f"{VAR}=64" for line in text.splitlines())
    json.dumps(doc)  # plain data


def test_the_upstream_kernel_stands_for_the_runtime_unless_told():
    base = recs()
    both = base + [Record(r.sweep, r.family, r.case_id + "u", "upstream", "upstream", r.status, params=r.params,
                          timing=dict(r.timing)) for r in base]
    assert decide(both, COUNT)[0].variant == "upstream"
    assert decide(both, COUNT, variant="persistent")[0].variant == "persistent"
    with pytest.raises(UsageError, match="--variant: 'strided'"):
        decide(both, COUNT, variant="strided")


def test_a_variant_is_found_under_the_label_its_spec_gave_it():
    """Records are labelled by their spec entry ("upstream b128 w4 (Megatron)"); the measured
    variant was once looked up by label, so a file with labels could never emit."""
    both = [Record(r.sweep, r.family, r.case_id + v[0], v, f"{v} b{r.params['block_size']} (mine)", r.status,
                   params=r.params, timing=dict(r.timing)) for r in recs() for v in ("persistent", "upstream")]
    d = decide(both, COUNT)[0]
    assert d.variant == "upstream" and sorted(d.default.case_ids.values()) == ["c128-1024u", "c128-16384u",
                                                                              "c128-256u", "c128-4096u"]
    assert decide(both, COUNT, variant="persistent")[0].choice.case_ids[(256,)].endswith("p")


# ----------------------------------------------------------------------------- the CLI


def _planted(tmp_path: Path, factor: float = 0.8) -> Path:
    """The H200 count-block file with BLOCK 64 made faster at every shape: 64 beats 128 beyond noise."""
    doc = json.loads(REAL.read_text())
    for r in doc["records"]:
        if r["params"]["block_size"] == 64:
            r["timing"]["median_us"] *= factor
    p = tmp_path / "count-block.json"
    p.write_text(json.dumps(doc))
    return p


def test_cli_emit_env_and_json(tmp_path, capsys):
    f = _planted(tmp_path)
    code, out, _ = run_cli(["recommend", str(f), "--emit", "env"], capsys)
    commit = json.loads(REAL.read_text())["provenance"]["git_commit"][:12]  # the evidence names the file's commit
    assert code == 0 and f"\n{VAR}=64\n" in out and "NVIDIA H200" in out and commit in out
    code, out, _ = run_cli(["recommend", str(f), "--emit", "json", "-o", str(tmp_path / "e.json")], capsys)
    assert code == 0 and "Wrote" in out
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["environment"] == {VAR: "64"} and len(doc["switches"][0]["cases"]) == 4
    code, out, _ = run_cli(["recommend", str(REAL), "--emit", "env", "--weights", "256=0.7,16384=0.3"], capsys)
    assert code == 0 and f"\n{VAR}=128\n" in out and "default kept" in out
    code, _, err = run_cli(["recommend", str(f), "--emit", "yaml"], capsys)
    assert code == 2 and "expected env or json" in err
    code, _, err = run_cli(["recommend", str(f), "--check"], capsys)
    assert code == 2 and "go with --emit" in err


def test_cli_check_without_a_gpu_says_so(tmp_path, capsys):
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check"], capsys)
    assert code == 2 and "cannot check here: no CUDA device" in err and "Traceback" not in err


def _fake_runner(calls: list, emitted_us=None, status: str = "ok", read: bool = True, rel: float | None = 0.005):
    """Stands in for the run: a `shipped` count kernel whose time follows the block the switch gives
    it (the planted file's 128 and 64 times), or `emitted_us` under the switch."""
    doc = json.loads(REAL.read_text())
    times = {(r["params"]["block_size"], r["params"]["tokens"]): r["timing"]["median_us"] for r in doc["records"]}

    def run(spec, cases, device, environ):
        calls.append(dict(environ))
        block = int(environ[VAR]) if read and VAR in environ else 128
        out = []
        for c in cases:
            us = times[(block, c.params["tokens"])] * (0.8 if block == 64 else 1.0)
            if emitted_us is not None and VAR in environ:
                us = emitted_us
            out.append(Record("check", "count", c.id, c.variant, c.label, status,
                              error="" if status == "ok" else "megatron-core is not installed",
                              params=c.params, launch={"block_size": block},
                              launch_from={"block_size": f"${VAR}" if VAR in environ else "shipped default"},
                              timing={"median_us": us, "rel_noise": rel} if status == "ok" else {}))
        return out

    return run


H200 = SimpleNamespace(name="NVIDIA H200", backend="cuda", sm_count=132, l2_bytes=62914560)


@pytest.fixture
def gpu(monkeypatch):
    import moebench.cli.analysis as A

    monkeypatch.setattr(A, "cuda_device", lambda *a: H200)
    return A


def test_cli_check_on_another_device_or_settings_runs_nothing(tmp_path, capsys, monkeypatch, gpu):
    calls: list = []
    monkeypatch.setattr(gpu, "run_cases", _fake_runner(calls))
    monkeypatch.setattr(gpu, "cuda_device", lambda *a: SimpleNamespace(**{**vars(H200), "name": "NVIDIA B200"}))
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check"], capsys)
    assert code == 2 and "the check would measure something else" in err and "NVIDIA B200" in err and not calls
    f = _planted(tmp_path)
    doc = json.loads(f.read_text())
    doc["provenance"]["timing"]["l2"] = "cold"
    f.write_text(json.dumps(doc))
    monkeypatch.setattr(gpu, "cuda_device", lambda *a: H200)
    code, _, err = run_cli(["recommend", str(f), "--emit", "env", "--check"], capsys)
    assert code == 2 and "l2: 'cold' -> 'warm'" in err and not calls


def test_cli_check_confirms_the_gain_with_the_environment_injected(tmp_path, capsys, monkeypatch, gpu):
    calls: list = []
    monkeypatch.setattr(gpu, "run_cases", _fake_runner(calls))
    before = dict(os.environ)
    out_file = tmp_path / "count.env"
    code, out, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check", "-o", str(out_file)],
                             capsys)
    assert code == 0, out + err
    assert dict(os.environ) == before  # the environment was handed to the run, never set
    assert VAR not in calls[0] and calls[1][VAR] == "64"
    text = out_file.read_text()
    assert "# check MCORE_COUNT_TOKENS_BLOCK: held:" in text and "shipped over the mix" in text
    assert "check MCORE_COUNT_TOKENS_BLOCK=64: held" in out


def test_cli_check_says_when_the_gain_did_not_hold(tmp_path, capsys, monkeypatch, gpu):
    monkeypatch.setattr(gpu, "run_cases", _fake_runner([], emitted_us=50.0))
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "json", "--check"], capsys)
    assert code == 1 and "did not hold" in err


def test_cli_check_without_an_interval_cannot_check(tmp_path, capsys, monkeypatch, gpu):
    """As decide refuses to emit on a time without an interval, --check refuses to call it held."""
    monkeypatch.setattr(gpu, "run_cases", _fake_runner([], rel=None))
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check"], capsys)
    assert code == 2 and "cannot check here" in err and "without a stated interval" in err


def test_cli_check_notices_a_switch_that_was_not_read(tmp_path, capsys, monkeypatch, gpu):
    monkeypatch.setattr(gpu, "run_cases", _fake_runner([], read=False))
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check"], capsys)
    assert code == 1 and "the variable was not read" in err


def test_cli_check_with_an_unavailable_kernel_cannot_check(tmp_path, capsys, monkeypatch, gpu):
    monkeypatch.setattr(gpu, "run_cases", _fake_runner([], status="unavailable"))
    code, _, err = run_cli(["recommend", str(_planted(tmp_path)), "--emit", "env", "--check"], capsys)
    assert code == 2 and "cannot check here" in err and "megatron-core is not installed" in err


def test_check_cases_run_in_the_real_session_and_read_the_injected_switch():
    """The cases --check builds run in the session (interpreter, untimed), and the `shipped` kernel
    takes its block from the mapping handed to the run."""
    from moebench.core.device import detect
    from moebench.core.driver import Summary, run_sweep
    from moebench.core.pipeline import Options
    from moebench.core.spec import load_spec

    small = [Record(r.sweep, r.family, r.case_id, r.variant, r.label, r.status,
                    params={**r.params, "buffer_tokens": 64, "tokens": {256: 5, 1024: 40}[r.params["tokens"]]},
                    timing=r.timing) for r in recs() if r.params["tokens"] in (256, 1024)]
    [d] = decide(small, COUNT, weights_text="5=1")
    assert d.emit and d.value == 64
    cases = check_cases(d, COUNT, small)
    assert [c.variant for c in cases] == ["shipped"] and cases[0].params["block_size"] is None
    spec = load_spec("count-block")
    for env, want in (({}, 128), ({VAR: "64"}, 64)):
        evs = list(run_sweep(spec, cases, Options(timing=spec.timing, time_it=False), detect(True), environ=env))
        [r] = evs[-1].records
        assert isinstance(evs[-1], Summary) and r.status == "ok", r.error
        assert r.launch["block_size"] == want
        assert r.launch_from["block_size"] == (f"${VAR}" if env else f"default 128 (${VAR} unset)")
    # untimed records cannot confirm anything: the verdict says so
    [row] = judge_check(d, cases, [r], [r])
    assert row["verdict"] == "cannot check here"


def test_emit_runs_without_torch(tmp_path):
    r = warm.run(["recommend", _planted(tmp_path), "--emit", "env"], cwd=ROOT, blocked=True,
                 env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and f"{VAR}=64" in r.stdout, r.stderr


# ----------------------------------------------------------------------------- nothing injected


def _injected(tmp_path: Path, edit) -> Path:
    """The planted file (BLOCK 64 wins) with `edit(doc)` applied."""
    f = _planted(tmp_path)
    doc = json.loads(f.read_text())
    edit(doc)
    f.write_text(json.dumps(doc))
    return f


def _tokens(doc, value):
    for r in doc["records"]:
        if r["params"]["tokens"] == 256:
            r["params"]["tokens"] = value


def test_sourcing_the_emitted_env_runs_nothing(tmp_path, capsys):
    """Issue 33: results-file text went into the .env unescaped; sourcing it (`set -a; . ./x.env`)
    ran commands from a driver string with a newline and a tokens value with newlines. Comments now
    carry no control character, so the file sources to the one variable and nothing runs."""
    def edit(doc):
        prov = doc["provenance"]
        prov["device"]["driver"] = "580.159.04\ntouch X1"
        prov["sweep"] = "count-block\r\ntouch X2\n"
        prov["git_commit"] = "abc\x1b[2J\u2028touch X3"
        _tokens(doc, "256\ntouch X4\n$(touch X5)")

    f = _injected(tmp_path, edit)
    env = tmp_path / "x.env"
    code, _, err = run_cli(["recommend", str(f), "--emit", "env", "-o", str(env)], capsys)
    assert code == 0, err
    text = env.read_text()
    assert all(line.startswith("#") or line == f"{VAR}=64" for line in text.splitlines()), text
    r = subprocess.run(["sh", "-c", "set -a; . ./x.env; echo \"$MCORE_COUNT_TOKENS_BLOCK\""], cwd=tmp_path,
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout == "64\n", r.stderr
    assert not list(tmp_path.glob("X*")), "sourcing the emitted file ran a command"


@pytest.mark.parametrize("block", ["$(touch X)", "64; touch X", "64\ntouch X", 64.5, -1, "64", 96, True])
def test_a_block_size_that_is_not_a_legal_value_is_refused(tmp_path, capsys, block):
    """Issue 33: block sizes `$(touch X)`, `64; touch X`, `64\\ntouch X` ran commands when the file
    was sourced; 64.5, -1 and strings were emitted as they were. Only the family's legal values pass."""
    def edit(doc):
        for r in doc["records"]:
            if r["params"]["block_size"] == 64:
                r["params"]["block_size"] = block
                r["launch"]["block_size"] = block

    f = _injected(tmp_path, edit)
    env = tmp_path / "x.env"
    code, _, err = run_cli(["recommend", str(f), "--emit", "env", "-o", str(env)], capsys)
    assert code == 2 and "block_size" in err and "legal values (a power of two" in err and not env.exists()
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.glob("X*"))


def test_a_negative_or_contradictory_noise_is_a_malformed_input(tmp_path, capsys):
    """Issue 33: a negative noise on the default's records emitted a value for a 0.3% gain."""
    def edit(rel, within=None):
        def go(doc):
            for r in doc["records"]:
                if r["params"]["block_size"] == 64:
                    r["timing"]["median_us"] = r["timing"]["median_us"] / 0.8 * 0.997  # 0.3% faster only
                if r["params"]["block_size"] == 128:
                    r["timing"]["rel_noise"] = rel
                    if within is not None:
                        r["timing"]["rel_noise_within"] = within
        return go

    for rel, within, said in ((-0.5, None, "timing.rel_noise: expected a finite, non-negative number, got -0.5"),
                              (float("nan"), None, "timing.rel_noise: expected a finite, non-negative number, got nan"),
                              (0.0, 0.0, "rel_noise 0 is not hypot(")):
        code, out, err = run_cli(["recommend", str(_injected(tmp_path, edit(rel, within))), "--emit", "env"], capsys)
        assert code == 2 and said in err and f"{VAR}=64" not in out, err


def test_weights_overflow_and_duplicates(tmp_path, capsys):
    """Issue 33: `--weights 256=1e308,16384=1e308` gave exit 3; `--weights 256=1,256=2` kept the last."""
    f = _planted(tmp_path)
    code, big, err = run_cli(["recommend", str(f), "--emit", "json", "--weights", "256=1e308,16384=1e308"], capsys)
    assert code == 0, err
    code, one, _ = run_cli(["recommend", str(f), "--emit", "json", "--weights", "256=1,16384=1"], capsys)
    assert json.loads(big)["switches"][0]["mix"] == json.loads(one)["switches"][0]["mix"]
    code, _, err = run_cli(["recommend", str(f), "--weights", "256=1e308,16384=1e308"], capsys)
    assert code == 0, err
    for cmd in (["--emit", "env"], []):
        code, _, err = run_cli(["recommend", str(f), *cmd, "--weights", "256=1,256=2"], capsys)
        assert code == 2 and "tokens=256 is given twice" in err
