"""`moebench pr` on the CPU: the real kernels under the interpreter on tiny quick shapes; the timed
sections through a stand-in for the GPU timer (as the `ab` tests do), so every section the page has
is built from a run. Plugin arms load into copies of the registries (`isolated`)."""

import json
import re
import shutil
from pathlib import Path

import pytest

from clirun import run_cli
from moebench.analysis.ab import OFF, ON, ab_pairs, parse_setting
from moebench.passes import counters
from moebench.core.cases import expand
from moebench.core.family import catalogue
from moebench.core.records import Record
from moebench.core.spec import load_spec
from moebench.errors import UsageError
from moebench.report.pr import SECTIONS, TITLES, build, counters_sentence
from moebench.sources import arms, plugins, upstream

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
BLOCK_LINE = 'grid, block, nw = params["grid"], params["block_size"], params["num_warps"]'


@pytest.fixture
def isolated(monkeypatch):
    """Plugins and arms loaded by a test go into copies of the registries, put back afterwards."""
    monkeypatch.setenv(plugins.ENV, "")
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(arms, "_ARMS", [])
    monkeypatch.setattr(arms, "_CHECKOUTS", {})
    monkeypatch.setattr(upstream, "_LOADED", {})
    monkeypatch.setattr(upstream, "_MODULES", {})
    for fam in catalogue().values():
        monkeypatch.setattr(fam, "variants", dict(fam.variants))


TINY = """
name: tiny
family: count
model: qwen3-30b-a3b
variants: [persistent]
baseline: {variant: persistent, block_size: 1024}
axes: {tokens: [7, 40]}
fixed: {buffer_tokens: 64, grid: 4, block_size: 64}
verify:
  axes: {seed: [0, 1], tokens: [0, 40]}
"""


def _tiny(tmp_path) -> str:
    (tmp_path / "tiny.yaml").write_text(TINY)
    return str(tmp_path / "tiny.yaml")


def _doc(tmp_path, stem="count-block-pr-quick"):
    doc = json.loads((tmp_path / "cpu-interpreter" / f"{stem}.json").read_text())
    return doc, (tmp_path / "cpu-interpreter" / f"{stem}.md").read_text()


def _section(md: str, title: str) -> str:
    return md.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]


def test_param_arms_on_the_cpu_fill_what_needs_no_timings(tmp_path, capsys):
    code, out, err = run_cli(["pr", "count-block", "--quick", "--off", "block_size=1024", "--on", "block_size=128",
                              "--out", str(tmp_path), "--markdown"], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path)
    assert out.startswith(md.split("\n", 1)[0])
    assert re.findall(r"^### (.+)$", md, re.M) == [TITLES[s] for s in SECTIONS]
    # correctness: the ON records are the verify run's block-128 cases, checked against BLOCK 1024 (the OFF arm)
    code, _, err = run_cli(["verify", "count-block", "--quick", "--out", str(tmp_path / "v")], capsys)
    assert code == 0, err
    verify = {r["case_id"]: r for r in json.loads(
        (tmp_path / "v" / "cpu-interpreter" / "count-block-verify-quick.json").read_text())["records"]}
    on = [r for r in doc["records"] if r["timing"]["pr_run"] == "correctness" and r["timing"]["pr_side"] == ON]
    assert on and all(verify[r["case_id"]]["checks"] == r["checks"] for r in on)
    assert len(on) == len([r for r in verify.values() if r["params"]["block_size"] == 128])
    n = doc["numbers"]["correctness"]
    assert n["equal"] == n["n"] == len(on) and f"**{len(on)}/{len(on)} bit-exact (ON against OFF)**" in md
    # what changed: each arm's launch; the timed sections say why they are missing
    rows = {line.split(" | ")[0].strip("| "): line for line in _section(md, "What changed").splitlines()
            if line.startswith(("| OFF", "| ON"))}
    assert "block_size=1024 (spec)" in rows["OFF"] and "block_size=128 (spec)" in rows["ON"]
    assert "interpreter: nothing compiled" in rows["ON"]
    assert "needs a GPU" in _section(md, "Measured gain") and "needs a GPU" in _section(md, "Kill switch")
    assert counters.why_unavailable(type("D", (), {"backend": "interpret"})(), counters.Ncu()) in md
    proto = _section(md, "Protocol")
    for cmd in ("moebench verify count-block --quick", "moebench sweep count-block --quick --counters",
                "moebench ab count-block --quick --off block_size=1024 --on block_size=128 --arms 4 --iters 5"):
        assert f"`{cmd}`" in proto


def test_an_earlier_page_is_not_replaced_without_force(tmp_path, capsys):
    """Two pr runs of one spec with other arms write the same NAME-pr files: the second refuses
    before it runs anything (exit 2), and --force replaces them."""
    page = tmp_path / "cpu-interpreter" / "count-block-pr-quick.md"
    page.parent.mkdir(parents=True)
    page.write_text("an earlier page\n")
    args = ["pr", "count-block", "--quick", "--off", "block_size=1024", "--on", "block_size=64", "--out", str(tmp_path),
            "--sections", "changed"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "exists; not replaced" in err and page.read_text() == "an earlier page\n"
    code, _, err = run_cli(args + ["--force"], capsys)
    assert code == 0, err
    assert page.read_text().startswith("## Performance")


def test_plugin_arms_prove_which_code_ran(tmp_path, capsys, isolated):
    """Two files registering the same variant name, one per arm: both run in one process, and the
    page names each arm's file and a hash of its code."""
    src = (EXAMPLES / "count_histogram.py").read_text()
    assert BLOCK_LINE in src
    a, b = tmp_path / "mine_a.py", tmp_path / "mine_b.py"
    a.write_text(src.replace('"histogram"', '"mine"'))
    b.write_text(src.replace('"histogram"', '"mine"').replace('params["block_size"], params', "128, params"))
    code, _, err = run_cli(["pr", _tiny(tmp_path), "--off", f"plugin={a}", "--on", f"plugin={b}", "--out",
                            str(tmp_path), "--sections", "changed,correctness,protocol"], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path, "tiny-pr")
    code_of = doc["provenance"]["pr"]["code"]
    assert list(code_of[OFF]) == ["mine@off"] and list(code_of[ON]) == ["mine@on"]
    (sa, ha), (sb, hb) = ((c["source"], c["sha256"]) for side in (OFF, ON) for c in code_of[side].values())
    assert sa == f"plugin {a.resolve()}" and sb == f"plugin {b.resolve()}" and ha != hb and ha and hb
    assert ha[:12] in md and hb[:12] in md and "block_size=128" in _section(md, "What changed")
    assert "block_size=64 (spec)" in _section(md, "What changed")  # the OFF arm's file reads the spec's
    assert re.findall(r"^### (.+)$", md, re.M) == ["What changed", "Correctness", "Protocol"]
    n = doc["numbers"]["correctness"]
    assert n["equal"] == n["n"] > 0 and n["did_work"] > 0
    assert "moebench pr only" not in md  # no separation section asked for: its command is not listed
    assert {r["variant"] for r in doc["records"]} == {"mine@off", "mine@on"}


def test_a_failed_case_is_on_the_page_and_exits_1(tmp_path, capsys, isolated):
    src = (EXAMPLES / "count_histogram.py").read_text().replace('"histogram"', '"mine"')
    bad = tmp_path / "bad.py"  # counts every pair twice
    bad.write_text(src.replace("hist += tl.histogram(", "hist += 2 * tl.histogram("))
    (tmp_path / "good.py").write_text(src)
    code, _, err = run_cli(["pr", _tiny(tmp_path), "--off", f"plugin={tmp_path / 'good.py'}", "--on", f"plugin={bad}",
                            "--out", str(tmp_path), "--sections", "correctness"], capsys)
    doc, md = _doc(tmp_path, "tiny-pr")
    n = doc["numbers"]["correctness"]
    assert code == 1 and "mismatch" in err and n["equal"] < n["n"] and n["did_work"] > 0
    assert re.search(r"\*\*\d+ case\(s\) failed\*\*, e\.g\. correctness ON `\w+` mine@on: mismatch", md)


def test_variant_arms_a_plugin_against_the_built_in(tmp_path, capsys, isolated):
    plug = tmp_path / "count_histogram.py"
    shutil.copy(EXAMPLES / "count_histogram.py", plug)
    code, out, err = run_cli(["pr", _tiny(tmp_path), "--plugin", str(plug), "--off", "variant=persistent",
                              "--on", "variant=histogram", "--out", str(tmp_path), "--sections",
                              "summary,changed,correctness"], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path, "tiny-pr")
    assert "bit-exact" in out and "### Protocol" not in md
    n = doc["numbers"]["correctness"]
    assert n["equal"] == n["n"] and n["ref"][ON]["exact"] == n["n"]
    assert {(r["timing"]["pr_side"], r["variant"]) for r in doc["records"]} == {(OFF, "persistent"), (ON, "histogram")}
    assert "chunking=strided" in _section(md, "What changed") and f"plugin {plug.resolve()}" in md


# A stand-in for Megatron's count kernel: this test's own code, with Megatron's kernel and argument names.
PERMUTE = """
import triton
import triton.language as tl


@triton.jit
def _count_local_tokens_kernel_persistent(routing_map_ptr, tokens_per_expert_ptr, valid_tokens_ptr, topk,
                                          local_expert_start, num_local_experts: tl.constexpr, num_sms,
                                          BLOCK_SIZE: tl.constexpr):
    n = tl.load(valid_tokens_ptr) * topk
    for start in tl.range(tl.program_id(0) * BLOCK_SIZE, n, num_sms * BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        e = tl.load(routing_map_ptr + offs, mask=offs < n, other=-1) - local_expert_start
        tl.atomic_add(tokens_per_expert_ptr + e, 1, mask=(offs < n) & (e >= 0) & (e < num_local_experts))
"""


def test_checkout_arms_run_each_checkouts_kernel_file(tmp_path, capsys, isolated):
    """Two Megatron-LM checkouts, one per arm: each arm's `upstream` runs its own checkout's kernel file,
    both in one process, and the page names each file's hash."""
    roots = []
    for name, extra in (("a", ""), ("b", "# the candidate\n")):
        moe = tmp_path / name / "megatron" / "core" / "inference" / "moe"
        moe.mkdir(parents=True)
        (moe / "permute.py").write_text(PERMUTE + extra)
        roots.append(tmp_path / name)
    code, _, err = run_cli(["pr", _tiny(tmp_path), "--off", f"megatron_lm={roots[0]}", "--on", f"megatron_lm={roots[1]}",
                            "--off", "variant=upstream", "--on", "variant=upstream", "--out", str(tmp_path),
                            "--sections", "changed,correctness"], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path, "tiny-pr")
    code_of = doc["provenance"]["pr"]["code"]
    (ca,), (cb,) = code_of[OFF].values(), code_of[ON].values()
    assert (ca["source"], cb["source"]) == (f"checkout {roots[0].resolve()}", f"checkout {roots[1].resolve()}")
    (fa, ha), (fb, hb) = next(iter(ca["files"].items())), next(iter(cb["files"].items()))
    assert fa.startswith(str(roots[0].resolve())) and fb.startswith(str(roots[1].resolve())) and ha != hb
    n = doc["numbers"]["correctness"]
    assert n["equal"] == n["n"] > 0 and n["ref"][ON]["exact"] == n["n"]
    assert {r["variant"] for r in doc["records"]} == {"upstream@off", "upstream@on"}


def test_ab_takes_variant_arms():
    """`ab --off variant=A --on variant=B`: each case's variant is replaced, its launch parameters kept
    where the new variant takes them (the family default where the case had none), the label follows."""
    spec = load_spec("act-grid-rows")
    off, on = (parse_setting(t, spec.family, o) for t, o in (("variant=legacy", "--off"), ("variant=capped", "--on")))
    pairs, notes = ab_pairs(spec, expand(spec), [off], [on])
    assert [p.text for p in pairs] == ["rows=2048", "rows=4096", "rows=8192", "rows=16384"] and not notes
    assert {(p.off.label, p.off.params["grid_cap"], p.on.label, p.on.params["grid_cap"]) for p in pairs} == {
        ("legacy", None, "capped", 8192)}
    spec = load_spec("count-block")
    off, on = (parse_setting(t, spec.family, "--on") for t in ("variant=persistent", "variant=strided"))
    pairs, _ = ab_pairs(spec, expand(spec, quick=True), [off], [on])
    assert {(p.off.variant, p.off.params["block_size"], p.on.variant, p.on.params["block_size"]) for p in pairs} == {
        ("persistent", b, "strided", b) for b in (64, 128, 1024)}


def test_ab_dry_run_with_variant_arms(capsys):
    code, out, err = run_cli(["ab", "act-grid-rows", "--off", "variant=legacy", "--on", "variant=capped", "--dry-run",
                              "--markdown"], capsys)
    assert code == 0, err
    assert re.search(r"\| rows=2048 \| \w+ \| \w+ \|", out) and "OFF: variant=legacy; ON: variant=capped" in out


@pytest.mark.parametrize("switch", ["MCORE_COUNT_TOKENS_BLOCK", "env:MCORE_COUNT_TOKENS_BLOCK"])
def test_ab_dry_run_checks_a_kill_switchs_value(capsys, switch):
    """--dry-run printed a plan for a value the run would then refuse (pr refused it at once)."""
    code, _, err = run_cli(["ab", "count-block", "--off", f"{switch}=abc", "--on", "block_size=128", "--dry-run"],
                           capsys)
    assert code == 2 and "--off: $MCORE_COUNT_TOKENS_BLOCK='abc': expected a power of two from 16 to 65536" in err


MIXED = TINY.replace("name: tiny", "name: mixed").replace("variants: [persistent]", "variants: [persistent, shipped]")


def test_a_kill_switch_no_case_reads_exits_2(tmp_path, capsys):
    """OFF and ON apart only in $MCORE_COUNT_TOKENS_BLOCK, which `persistent` does not read: the two
    arms would time one launch, and the page say block_size=128 (spec) for both. Where some cases
    read it (`shipped`), those are the pairs."""
    spec = load_spec("count-block")
    off, on = ([parse_setting(f"env:MCORE_COUNT_TOKENS_BLOCK={b}", spec.family, o)] for b, o in
               ((1024, "--off"), (128, "--on")))
    with pytest.raises(UsageError, match=r"no case of count-block reads \$MCORE_COUNT_TOKENS_BLOCK; .*variant=shipped"):
        ab_pairs(spec, expand(spec, quick=True), off, on)
    for cmd in (["ab", "count-block", "--quick", "--dry-run"], ["pr", "count-block", "--quick", "--out", str(tmp_path),
                                                                "--sections", "correctness,changed"]):
        code, out, err = run_cli([*cmd, "--off", "MCORE_COUNT_TOKENS_BLOCK=1024", "--on",
                                  "MCORE_COUNT_TOKENS_BLOCK=128"], capsys)
        assert code == 2 and "no case of count-block reads $MCORE_COUNT_TOKENS_BLOCK" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and not out.strip()
    assert not list(tmp_path.rglob("*-pr*"))
    (tmp_path / "mixed.yaml").write_text(MIXED)
    spec = load_spec(str(tmp_path / "mixed.yaml"))
    pairs, notes = ab_pairs(spec, expand(spec), off, on)
    assert [(p.off.variant, p.text) for p in pairs] == [("shipped", "tokens=7"), ("shipped", "tokens=40")]
    assert notes == ["2 case(s) of 'persistent' launch alike on both sides (they do not read "
                     "$MCORE_COUNT_TOKENS_BLOCK): left out"]


def test_one_sided_settings_never_pair_a_case_with_itself():
    """--off block_size=1024 alone: the spec's block-1024 cases were timed against themselves, and the
    rows read tokens=0, tokens=7, tokens=256 three times over; each row names the ON side's value."""
    spec = load_spec("count-block")
    cases = expand(spec, quick=True)
    for off, on, first in (("block_size=1024", None, "tokens=0, block_size=1024→64"),
                           (None, "block_size=1024", "tokens=0, block_size=64→1024")):
        offs, ons = ([parse_setting(t, spec.family, o)] if t else [] for t, o in ((off, "--off"), (on, "--on")))
        pairs, notes = ab_pairs(spec, cases, offs, ons)
        assert len(pairs) == 6 and all(p.off.id != p.on.id for p in pairs)
        texts = [p.text for p in pairs]
        assert len(set(texts)) == len(texts) and texts[0] == first
        assert notes == ["3 case(s) of 'persistent' launch alike on both sides (block_size=1024): left out"]
    one = [parse_setting("block_size=1024", spec.family, "--off")]
    with pytest.raises(UsageError, match="same configuration"):
        ab_pairs(spec, [c for c in cases if c.params["block_size"] == 1024], one, [])


def test_the_standalone_commands_run_as_written(tmp_path, capsys, isolated, monkeypatch):
    """The protocol's commands carry the run's --plugin (without it `ab` knows no variant
    'histogram'), and the kill switch reads the file a --quick sweep writes."""
    plug = tmp_path / "count_histogram.py"
    shutil.copy(EXAMPLES / "count_histogram.py", plug)
    code, _, err = run_cli(["pr", _tiny(tmp_path), "--quick", "--plugin", str(plug), "--off", "variant=persistent",
                            "--on", "variant=histogram", "--out", str(tmp_path), "--sections",
                            "separation,killswitch,protocol"], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path, "tiny-pr-quick")
    cmds = doc["provenance"]["pr"]["commands"]
    assert cmds["killswitch"] == "moebench recommend OUT/cpu-interpreter/tiny-quick.json --emit env"
    assert cmds["separation"].endswith(f" --plugin {plug}") and f"`{cmds['separation']}`" in md
    monkeypatch.setattr(plugins, "_LOADED", {})  # a fresh process: the plugin's variant is not registered
    monkeypatch.setattr(catalogue()["count"], "variants", {k: v for k, v in catalogue()["count"].variants.items()
                                                           if k != "histogram"})
    code, out, err = run_cli([*cmds["separation"].split()[1:], "--dry-run"], capsys)
    assert code == 0 and "ON: variant=histogram" in out, err


@pytest.mark.parametrize("args,msg", [
    (["--on", "blocksize=128"], "--on: unknown parameter 'blocksize' of family 'count'; expected one of tokens"),
    (["--on", "variant=nope"], "--on: variant: expected one of persistent"),
    (["--on", "block_size=128", "--sections", "gain,nope"], "--sections: unknown 'nope'; expected a comma list"),
    (["--on", "block_size=128", "--decision", "tokens=999"], "--decision tokens=999: no case of count-block has it"),
    (["--on", "plugin=/nonexistent.py"], "--on plugin=: /nonexistent.py: no such file"),
    (["--on", "megatron_lm=/nonexistent"], "--on megatron_lm=/nonexistent: not a directory"),
])
def test_bad_arm_options_exit_2_naming_the_key(tmp_path, capsys, isolated, args, msg):
    code, _, err = run_cli(["pr", "count-block", "--quick", "--off", "block_size=1024", *args, "--out",
                            str(tmp_path)], capsys)
    assert code == 2 and msg in err and "Traceback" not in err, err
    if "blocksize" in args[1]:
        assert "plugin=FILE.py, megatron_lm=PATH" in err and "MCORE_COUNT_TOKENS_BLOCK" in err


@pytest.fixture
def gpu_stand_in(monkeypatch):
    """The GPU path on the CPU: a run that times, with a timer that reads the launch the case ran with
    (µs from its block size, one group median per placement) instead of CUDA graphs."""
    import moebench.core.device as device
    from moebench.core.placements import Timed, Timer

    real = device.detect
    monkeypatch.setattr(device, "want_interpreter", lambda requested: False)
    monkeypatch.setattr(device, "detect", lambda interpret: real(True))
    monkeypatch.setattr(device, "require_triton", lambda: None)

    calls = []

    def timed(self, case, rec, builts, **kw):
        block = rec.launch.get("block_size") or rec.launch.get("count_block_size") or 64
        calls.append(0.01 * (len(calls) % 3))  # some spread between measurements
        g = [2.0 + block / 200 + calls[-1] + 0.05 * (i % 4) for i in range(max(1, self.timing.groups))]
        rec.timing.update({"median_us": sum(g) / len(g), "rel_noise": 0.004, "group_medians_us": g})
        return Timed(builts, estimate_us=rec.timing["median_us"])

    monkeypatch.setattr(Timer, "time", timed)


def test_the_timed_sections_through_the_run_driver(tmp_path, capsys, gpu_stand_in):
    code, out, err = run_cli(["pr", _tiny(tmp_path), "--quick", "--off", "block_size=1024", "--on", "block_size=128",
                              "--arms", "2", "--iters", "2", "--weights", "7=1,40=3", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    doc, md = _doc(tmp_path, "tiny-pr-quick")
    runs = {(r["timing"]["pr_run"], r["timing"]["pr_side"]) for r in doc["records"]}
    assert {(run, side) for run in ("correctness", "gain", "separation", "scope", "layer") for side in (OFF, ON)} == runs
    gain = doc["numbers"]["gain"]
    assert [g["case"] for g in gain] == ["tokens=7", "tokens=40"] and {g["verdict"] for g in gain} == {"FASTER"}
    sep = doc["numbers"]["separation"]
    assert [s["case"] for s in sep] == ["tokens=40"]  # the largest weight
    assert sep[0]["separation"] == "better" and 0 < sep[0]["min_detectable_us"] < abs(sep[0]["delta"])
    assert "every ON iteration beats every OFF iteration" in _section(md, "Summary")
    assert "(two-sided α = 0.05, power 0.8" in _section(md, "Arm separation")
    scope = doc["numbers"]["scope"]
    assert [(s["side"], s["placements"]) for s in scope] == [(OFF, 16), (ON, 16)] and all(s["wider"] for s in scope)
    ks = _section(md, "Kill switch")
    assert "`MCORE_COUNT_TOKENS_BLOCK=1024` restores the OFF arm's behaviour" in ks and "keep the default" in ks
    assert "What the saving is worth" not in md and "| count: " in _section(md, "In a layer step")
    assert "moebench ab layer-count --quick --off count_block_size=1024 --on count_block_size=128" in md

    # the page builder on the same document with counters a GPU would have measured
    records = [Record.from_json(r) for r in doc["records"]]
    for r in records:
        if r.timing["pr_run"] == "scope":
            big = r.launch["block_size"] == 1024
            r.cross["counters"] = {"achieved_occupancy_pct": 6.2, "theoretical_occupancy_pct": 50.0, "limiter": "grid",
                                   "waves": 0.13, "instructions": 41000 if big else 42000, "registers_per_thread": 24,
                                   "dram_pct": 0.4, "l2_pct": 3.0}
            r.cross["verdict"] = {"bound": "latency"}
    pr = doc["provenance"]["pr"] | {"provenance": doc["provenance"]}
    md2 = build(pr, records, ["counters"])[1]
    assert "| instructions | 41000 | 42000 |" in md2 and "| bound | latency | latency |" in md2
    assert "latency, spread over 3 CTAs with work in ON against 1 in OFF" in md2


def test_the_counters_sentence_follows_the_first_rule_that_applies():
    base = {"instructions": 1000, "achieved_occupancy_pct": 20.0, "dram_pct": 10.0, "l2_pct": 10.0, "limiter": "grid"}
    work2, work16 = {"ctas_with_work": 2}, {"ctas_with_work": 16}
    assert "executes 0.50× the instructions" in counters_sentence(base, {**base, "instructions": 500}, work2, work2)
    occ = counters_sentence(base, {**base, "achieved_occupancy_pct": 40.0, "limiter": "registers"}, work2, work2)
    assert "achieved occupancy is 40% against 20% (limiter: registers against grid)" in occ
    assert "L2 throughput is 30% of peak in ON against 10%" in counters_sentence(base, {**base, "l2_pct": 30.0},
                                                                                   work2, work2)
    assert "spread over 16 CTAs with work in ON against 2 in OFF" in counters_sentence(base, base, work2, work16)
    assert "do not tell the arms apart" in counters_sentence(base, base, work2, work2)


@pytest.mark.parametrize("nth, sig, where", [
    (3, "SIGINT", "the gain run"),  # a run the driver winds down: gain OFF times 2 cases, ON's first is the third
    (6, "SIGTERM", "the separation arms"),  # ab's interleaved loop, after gain's 2 + 2
])
def test_an_interrupt_stops_the_whole_pr_and_writes_no_partial_page(tmp_path, capsys, gpu_stand_in, monkeypatch,
                                                                   nth, sig, where):
    """Ctrl-C (or SIGTERM) in one run of `pr` stops `pr`: no later run starts, and no page presents
    part of a verdict as the whole (exit 128 + the signal)."""
    import os
    import signal

    from moebench.core.placements import Timer

    stand_in, seen, signum = Timer.time, [], getattr(signal, sig)

    def interrupted_on_the_nth(self, case, rec, builts, **kw):
        seen.append(case.id)
        if len(seen) == nth:
            os.kill(os.getpid(), signum)
        return stand_in(self, case, rec, builts, **kw)

    monkeypatch.setattr(Timer, "time", interrupted_on_the_nth)
    code, _, err = run_cli(["pr", _tiny(tmp_path), "--quick", "--off", "block_size=1024", "--on", "block_size=128",
                            "--arms", "2", "--iters", "2", "--out", str(tmp_path)], capsys)
    assert code == 128 + signum, err
    assert f"INCOMPLETE: interrupted in {where}" in err and "no page written" in err and "Traceback" not in err
    assert len(seen) == nth  # nothing timed after the interrupt
    assert not list(tmp_path.glob("cpu-interpreter/tiny-pr*"))


@pytest.mark.parametrize("results", sorted((Path(__file__).resolve().parents[2] / "results").glob("*/pr/*-pr.json")),
                         ids=lambda p: p.stem)
def test_a_committed_pr_page_is_what_its_json_builds_today(results):
    """Each committed `pr` page is report.pr.build of the document and records in its JSON."""
    from moebench.core.records import load_results

    prov, records = load_results(results)
    _, md = build(prov["pr"] | {"provenance": prov}, records, list(SECTIONS))
    assert md == results.with_suffix(".md").read_text()
