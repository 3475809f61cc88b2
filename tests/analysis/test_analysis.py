"""Deciding from numbers: A/B statistics, compare, recommend, plot and their CLI, on constructed
data whose answers are known (and on the seed PRs' own published tables). No GPU, no kernels."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebench.analysis.ab import OFF, ON, Arm, ab_stats, noise_text, parse_setting, per_step, projection_text, separation_text
from moebench.analysis.compare import classify, compare_records
from moebench.analysis.recommend import explain, recommend_keys, regret_table
from moebench.analysis.reference import REFERENCE_DIR, load_reference, reference_names
from moebench.report.sweep import beside_reference
from moebench.core.cases import case_id
from moebench.errors import BackendError, UsageError
from moebench.core.records import Record

SEED000 = "seed-000-count-block-gb200"
SEED001 = "seed-001-act-grid-gb200"
# The seed-000 PR's BLOCK x tokens table (GB200, µs per launch)
TABLE = {64: [2.05, 2.35, 5.51, 16.07], 128: [2.11, 2.44, 4.66, 13.34],
         256: [2.93, 3.03, 4.56, 13.26], 1024: [8.08, 8.07, 8.23, 13.57]}
TOKENS = [256, 1024, 4096, 16384]


# ----------------------------------------------------------------------------- builders


def count_rec(block: int, tokens: int, us: float | None, *, noise: float | None = 0.004, status: str = "ok",
              label: str = "persistent") -> Record:
    params = {"tokens": tokens, "buffer_tokens": 16384, "topk": 8, "num_experts": 128, "local_experts": 32,
              "block_size": block}
    timing = {}
    if us is not None:
        timing = {"timer": "graph-replay", "median_us": us, "n_replays": 400}
        if noise is not None:  # a record of today's timer: rel_noise holds its run-to-run term
            timing.update(rel_noise=noise, rerun_rel=min(noise, 0.003))
    return Record("count-block", "count", case_id("count", label, params), "persistent", label, status,
                  params=params, timing=timing)


def act_rec(grid: int, rows: int, us: float | None, floor: float | None) -> Record:
    params = {"live_rows": rows, "grid_cap": grid, "buffer_rows": 16384}
    work = {"bytes": rows * 4608}
    if floor is not None and us is not None:
        work.update(floor_us=floor, x_floor=round(us / floor, 2))
    timing = ({"timer": "graph-replay", "median_us": us, "rel_noise": 0.003, "rerun_rel": 0.003} if us is not None
              else {})
    return Record("act-grid", "act", case_id("act", "bounded", params), "bounded", "bounded", "ok",
                  params=params, timing=timing, work=work)


def write(path: Path, records: list[Record], **prov) -> Path:
    """The layout moebench.core.records writes: {"provenance", "records"}."""
    doc = {"provenance": {"sweep": path.stem, "device": {"name": "NVIDIA H200"}, **prov},
           "records": [r.to_json() for r in records]}
    path.write_text(json.dumps(doc, indent=1))
    return path


def seed_table_records(scale=lambda block, tokens: 1.0) -> list[Record]:
    return [count_rec(b, t, round(v * scale(b, t), 4)) for b, vs in TABLE.items() for t, v in zip(TOKENS, vs)]


def cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    from moebench import cli as cli_mod

    monkeypatch.setattr(sys, "argv", ["moebench", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli_mod.main()
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def one_line(text: str) -> str:
    """rich wraps long lines at the console width; the message itself is one line."""
    return " ".join(text.split())


# ----------------------------------------------------------------------------- A/B statistics


def test_fully_separated_arms():
    arms = [Arm(OFF, [10.0, 10.2, 10.1]), Arm(ON, [8.0, 8.2, 7.9]),
            Arm(OFF, [10.1, 10.3, 10.0]), Arm(ON, [8.1, 7.9, 8.0])]
    st = ab_stats(arms)
    assert st.separation == "better"
    assert st.worst_on == 8.2 and st.best_off == 10.0
    assert st.margin == pytest.approx(1.8)
    assert st.off_mean == pytest.approx(10.1166667) and st.on_mean == pytest.approx(8.0166667)
    assert st.delta == pytest.approx(-2.1)
    assert st.effect == pytest.approx(2.1 / max(st.sd_off, st.sd_on))
    assert st.effect > 10
    assert [round(a.mean, 4) for a in st.arms] == [10.1, 8.0333, 10.1333, 8.0]
    text = separation_text(st)
    assert "max(ON) = 8.200 < min(OFF) = 10.000 µs" in text and "every ON iteration beats every OFF" in text
    assert "1.800 µs margin" in text
    assert "so the win is" in noise_text(st)


def test_overlapping_arms_are_not_separated():
    arms = [Arm(OFF, [10.0, 10.4, 9.6]), Arm(ON, [9.9, 10.3, 9.5]),
            Arm(OFF, [10.2, 9.8, 10.1]), Arm(ON, [9.7, 10.0, 9.8])]
    st = ab_stats(arms)
    assert st.separation == "overlap"
    assert st.margin == pytest.approx(-(10.3 - 9.6))
    assert st.effect < 1
    assert "the arms overlap" in separation_text(st)
    assert "every ON iteration beats" not in separation_text(st)


def test_on_slower_in_every_iteration():
    st = ab_stats([Arm(OFF, [5.0, 5.1]), Arm(ON, [6.0, 6.1]), Arm(OFF, [5.05, 5.0]), Arm(ON, [6.2, 6.0])])
    assert st.separation == "worse"
    assert st.margin == pytest.approx(6.0 - 5.1)
    assert st.delta > 0
    assert "every OFF iteration beats every ON iteration" in separation_text(st)


def test_no_spread_gives_infinite_effect():
    st = ab_stats([Arm(OFF, [3.0, 3.0]), Arm(ON, [2.0, 2.0])])
    assert math.isinf(st.effect) and st.separation == "better"
    assert "undefined" in noise_text(st)


def test_seed000_published_ab_reproduces():
    """Seed 000's end-to-end A/B (throughput, higher is better, so negated into a lower-is-better
    number): min(ON) = 23510.6 > max(OFF) = 23050.6, a 460 tok/s margin; pooled sd 18.0 (OFF) and
    23.2 (ON); the win ~23x the noise."""
    from moebench.core.spec import read_yaml

    ab = read_yaml(REFERENCE_DIR / f"{SEED000}.yaml")[0]["ab"]
    st = ab_stats([Arm(a["side"], [-float(v) for v in a["values"]]) for a in ab["arms"]])
    pub = ab["published"]
    assert st.separation == "better"
    assert st.worst_on == -pub["min_on"] and st.best_off == -pub["max_off"]
    assert st.margin == pytest.approx(pub["margin"])
    assert st.sd_off == pytest.approx(pub["sd_off"], abs=0.05)
    assert st.sd_on == pytest.approx(pub["sd_on"], abs=0.1)  # 23.15 from the rounded iterations
    assert round(st.effect) == pub["effect_x_noise"]
    assert [-a.mean for a in st.arms] == pytest.approx(pub["arm_means"], abs=0.05)
    assert st.rel == pytest.approx(0.0229, abs=0.0002)  # +2.29% throughput


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 50), min_size=2, max_size=6), st.lists(st.floats(0.5, 50), min_size=2, max_size=6))
def test_separation_is_exactly_worst_on_against_best_off(off, on):
    s = ab_stats([Arm(OFF, off), Arm(ON, on)])
    assert (s.separation == "better") == (max(on) < min(off))
    assert (s.separation == "worse") == (min(on) > max(off))
    assert (s.margin > 0) == (s.separation != "overlap")
    assert s.delta == pytest.approx(sum(on) / len(on) - sum(off) / len(off))


def test_per_step_projection():
    p = per_step(8.08, 2.11, 48)
    assert p.before == pytest.approx(387.84) and p.after == pytest.approx(101.28)
    assert p.delta == pytest.approx(-286.56)
    assert "387.8 → 101.3 µs/step (-286.6 µs) over 48 MoE layers" in projection_text(p)
    assert per_step(8.08, 2.11, None) is None
    assert "none" in projection_text(None)


# ----------------------------------------------------------------------------- compare


@pytest.mark.parametrize("base,new,nb,nn,verdict", [
    (10.0, 10.0, 0.004, 0.004, "SAME"),
    (10.0, 10.3, 0.004, 0.004, "SAME"),  # a resolved 3% change is under the 5% threshold
    (10.0, 12.0, 0.004, 0.004, "SLOWER"),
    (10.0, 8.0, 0.004, 0.004, "FASTER"),
    (10.0, 10.48, 0.004, 0.004, "UNCLEAR"),  # 4.8% ± 0.57%: may be past 5%
    (10.0, 12.0, 0.2, 0.2, "UNCLEAR"),  # 20% inside ±28% of noise
    (10.0, 10.0, 0.05, 0.05, "UNCLEAR"),  # noise wider than the threshold: cannot certify SAME
    (10.0, 12.0, None, 0.004, "UNCLEAR"),  # no noise estimate
])
def test_classify(base, new, nb, nn, verdict):
    assert classify(base, new, nb, nn, 0.05)[0] == verdict


@pytest.mark.parametrize("new,nb,nn,within,verdict", [
    # a bimodal case (measured run-to-run term ±7.5%, each run precise to ±0.9%): its two modes 8.6%
    # apart are inside the stated ±10.7%, which cannot resolve 5%
    (10.86, 0.0758, 0.0758, (0.009, 0.009), "NOISY"),
    (10.0, 0.0758, 0.0758, (0.009, 0.009), "NOISY"),
    (11.2, 0.0758, 0.0758, (0.009, 0.009), "SLOWER"),  # 12% > ±10.7%: resolved, past the threshold
    (8.8, 0.0758, 0.0758, (0.009, 0.009), "FASTER"),
    (10.86, 0.0758, 0.0758, (0.04, 0.04), "UNCLEAR"),  # runs too imprecise to judge 5% (±5.7% within)
    (10.86, 0.0758, 0.0758, None, "UNCLEAR"),  # no within-run parts: the whole half-width counts as within
    (10.2, 0.004, 0.004, (0.004, 0.004), "SAME"),  # a narrow case is never NOISY
])
def test_classify_noisy_is_a_difference_inside_a_wide_run_to_run_term(new, nb, nn, within, verdict):
    assert classify(10.0, new, nb, nn, 0.05, within=within)[0] == verdict


def test_compare_known_regression_and_only_in_one():
    base = seed_table_records()
    new = seed_table_records(lambda b, t: 1.12 if (b, t) == (128, 256) else 1.0)
    new = new[:-1] + [count_rec(2048, 256, 9.0)]
    rep = compare_records(base, new, threshold=0.05)
    slower = rep.regressions
    assert [(r.params["block_size"], r.params["tokens"]) for r in slower] == [(128, 256)]
    assert slower[0].diff == pytest.approx(0.12, abs=1e-3)
    assert rep.counts()["SAME"] == 14
    assert [r.params["block_size"] for r in rep.only_base] == [1024]
    assert [r.params["block_size"] for r in rep.only_new] == [2048]
    assert rep.vary == ["tokens", "block_size"]
    assert "1 SLOWER" in rep.summary() and "worst regression +12.0% (persistent tokens=256, block_size=128)" \
        in rep.summary()


def test_compare_failed_and_untimed_cases_are_not_compared():
    base = [count_rec(128, 256, 2.0), count_rec(128, 1024, 2.4), count_rec(128, 4096, 3.0)]
    new = [count_rec(128, 256, None, status="mismatch"), count_rec(128, 1024, None), count_rec(128, 4096, 3.0)]
    rep = compare_records(base, new)
    assert [r.verdict for r in rep.rows] == ["—", "—", "SAME"]
    assert "NEW mismatch" in rep.rows[0].note and "no timing in NEW" in rep.rows[1].note
    assert not rep.regressions
    assert rep.gate()[0] == 1  # a case that failed in NEW fails the gate
    rep = compare_records(base, [count_rec(128, 256, 2.0)] + new[1:])
    assert rep.gate()[0] == 2  # a case without a time in NEW: the gate cannot vouch for it


def test_compare_cli_fails_on_regression(tmp_path, monkeypatch, capsys):
    b = write(tmp_path / "base.json", seed_table_records())
    n = write(tmp_path / "new.json", seed_table_records(lambda blk, t: 1.25 if blk == 256 else 1.0))
    code, out, _ = cli(monkeypatch, capsys, "compare", b, n, "--fail-on-regression")
    assert code == 1
    assert "4 SLOWER" in one_line(out) and "12 SAME" in one_line(out)
    code, out, _ = cli(monkeypatch, capsys, "compare", b, n)
    assert code == 0  # reported, not gated
    code, out, _ = cli(monkeypatch, capsys, "compare", b, n, "--threshold", "30", "--fail-on-regression")
    assert code == 0 and "16 SAME" in one_line(out)


def test_compare_cli_identical_files_all_same(tmp_path, monkeypatch, capsys):
    b = write(tmp_path / "a.json", seed_table_records())
    code, out, _ = cli(monkeypatch, capsys, "compare", b, b, "--fail-on-regression")
    assert code == 0
    assert "16 matched cases: 16 SAME, 0 FASTER, 0 SLOWER, 0 NOISY, 0 UNCLEAR" in one_line(out)


# ----------------------------------------------------------------------------- recommend


def _seed_recommendation(records, weights=None):
    from moebench.core.family import catalogue

    over, config, group = recommend_keys(records, catalogue().get("count"))
    assert (over, config, group) == (["tokens"], ["block_size"], [])
    (rec,) = regret_table(records, over, config, group, weights_text=weights)
    return rec


def test_recommend_seed000_picks_128():
    """Seed 000: BLOCK_SIZE=128 is 'the right point on the curve, not the minimum'. Worst-case
    regrets over 256/1024/4096/16384 tokens: 64 -> 21.2% (16.07 vs 13.26 at 16384), 128 -> 3.8%
    (2.44 vs 2.35 at 1024), 256 -> 42.9% (2.93 vs 2.05 at 256), 1024 -> 294% (8.08 vs 2.05)."""
    rec = _seed_recommendation(load_reference(SEED000).records)
    worst = {c.config[0]: (round(c.worst, 4), c.worst_at[0]) for c in rec.configs}
    assert worst == {64: (0.2119, 16384), 128: (0.0383, 1024), 256: (0.4293, 256), 1024: (2.9415, 256)}
    assert rec.robust.config == (128,)
    assert rec.robust.wins == []  # fastest nowhere
    assert {s[0]: c[0] for s, (c, _) in rec.best.items()} == {256: 64, 1024: 64, 4096: 256, 16384: 256}
    text = "\n".join(explain(rec))
    assert "block_size=128 — never more than 3.8% off" in text and "not the minimum" in text
    assert "block_size=64 is the fastest at tokens=256, 1024, but 21.2% off the best at tokens=16384" in text


def test_recommend_weighted_and_through_a_results_file(tmp_path, monkeypatch, capsys):
    rec = _seed_recommendation(seed_table_records(), weights="256=0.7,16384=0.3")
    w = {c.config[0]: round(c.weighted, 4) for c in rec.configs}
    assert w == {64: 0.0636, 128: 0.0223, 256: 0.3005, 1024: 2.066}
    assert rec.weighted_choice.config == (128,) and rec.robust.config == (128,)
    path = write(tmp_path / "count-block.json", seed_table_records())
    code, out, _ = cli(monkeypatch, capsys, "recommend", path, "--weights", "256=0.7,16384=0.3", "--markdown")
    assert code == 0
    # 13.34 ± 0.4% at 16384 overlaps block 256's 13.26 ± 0.4%: a tie there, marked on both cells
    row = "| 128 | 2.11 +2.9% | 2.44 +3.8% | 4.66 +2.2% | 13.34 +0.6% tie | 3.8% | 1024 | 2.2% | robust, weighted |"
    assert row in out and "| 13.26 tie |" in out
    assert "Weighted (tokens=256: 0.7, tokens=16384: 0.3):" in out  # the mix as given, not scaled to its largest
    code, _, err = cli(monkeypatch, capsys, "recommend", path, "--weights", "512=1")
    assert code == 2 and "tokens=512 was not swept" in one_line(err)


def test_recommend_calls_a_winner_inside_the_noise_a_tie():
    """A shape whose fastest median lies within noise of another's has no winner: both are tied,
    neither 'is the fastest' there, and the table and the argument say so."""
    def recs(noise):
        return [count_rec(b, t, us, noise=noise) for b, t, us in
                ((64, 256, 2.00), (128, 256, 2.02), (64, 16384, 9.0), (128, 16384, 8.0))]

    clear = _seed_recommendation(recs(0.001))
    assert clear.tied == {} and [c.wins for c in clear.configs] == [[(256,)], [(16384,)]]
    text = "\n".join(explain(clear))
    assert "It is also the fastest at tokens=16384" in text and "Tie" not in text

    tied = _seed_recommendation(recs(0.01))  # 2.00 ± 1% and 2.02 ± 1% overlap; 8.0 vs 9.0 does not
    assert tied.tied == {(256,): [(64,), (128,)]}
    by = {c.config[0]: c for c in tied.configs}
    assert by[64].wins == [] and by[64].ties == [(256,)] and by[128].ties == [(256,)]
    text = "\n".join(explain(tied))
    assert tied.robust.config == (128,) and "It is also the fastest at tokens=16384 and tied for the fastest at tokens=256" in text
    assert "block_size=64 is tied for the fastest at tokens=256, but 12.5% off" in text
    assert "Tie at tokens=256:" in text and "do not say which of them is faster" in text


def test_recommend_failed_cell_is_never_robust():
    recs = seed_table_records()
    recs = [r if (r.params["block_size"], r.params["tokens"]) != (128, 4096) else
            count_rec(128, 4096, None, status="error") for r in recs]
    rec = _seed_recommendation(recs)
    by = {c.config[0]: c for c in rec.configs}
    assert math.isinf(by[128].worst) and by[128].times[(4096,)] is None
    assert rec.robust.config == (64,)


def test_recommend_reads_a_fixed_geometry_from_the_launch_group():
    """legacy does not read grid_cap (None in params) but records the 512 it launched with."""
    recs = [act_rec(g, rows, us, None) for g, rows, us in ((512, 256, 1.6), (8192, 256, 5.8), (512, 2048, 3.4),
                                                           (8192, 2048, 6.5))]
    for rows, us in ((256, 1.7), (2048, 3.4)):
        r = act_rec(512, rows, us, None)
        r.label, r.variant, r.params["grid_cap"], r.launch["grid_cap"] = "legacy", "legacy", None, 512
        recs.append(r)
    over, config, group = recommend_keys(recs, None, ["live_rows"], ["label", "grid_cap"])
    (rec,) = regret_table(recs, over, config, group)
    assert [c.config for c in rec.configs] == [("bounded", 512), ("bounded", 8192), ("legacy", 512)]
    assert rec.robust.config == ("bounded", 512)


def test_recommend_untimed_results_is_a_usage_error():
    with pytest.raises(UsageError, match="needs timed results"):
        _seed_recommendation([count_rec(b, t, None) for b in TABLE for t in TOKENS])


# ----------------------------------------------------------------------------- references, plot


def test_references_load():
    assert {SEED000, SEED001} <= set(reference_names())
    r0 = load_reference(SEED000)
    assert r0.family == "count" and len(r0.records) == 16
    cell = {(r.params["block_size"], r.params["tokens"]): r.timing["median_us"] for r in r0.records}
    assert cell[(1024, 256)] == 8.08 and cell[(128, 256)] == 2.11
    r1 = load_reference(SEED001)
    pts = {r.params["grid_cap"]: (r.timing["median_us"], r.work["x_floor"]) for r in r1.records}
    assert pts == {512: (17.158, 10.93), 8192: (7.644, 4.87)}
    with pytest.raises(UsageError, match="unknown reference"):
        load_reference("nope")


def test_beside_reference_ratio():
    measured = seed_table_records(lambda b, t: 0.5)
    tables = beside_reference(measured, load_reference(SEED000), "block_size", "tokens", "median_us",
                              list(measured[0].params))
    assert [k for k, _, _ in tables] == ["measured", "reference", "ratio"]
    (_, _, m), (_, _, ref), (_, _, ratio) = tables
    assert ref.loc[128, 256] == 2.11 and m.loc[128, 256] == pytest.approx(1.055)
    assert ratio.loc[1024, 16384] == pytest.approx(0.5)


def _png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_count_with_reference(tmp_path, monkeypatch, capsys):
    from moebench.analysis.plot import plot_results

    recs = seed_table_records(lambda b, t: 0.8)
    drawn = plot_results(recs, {"sweep": "count-block", "device": {"name": "NVIDIA H200"}},
                         tmp_path / "c.png", reference=load_reference(SEED000))
    _png(tmp_path / "c.png")
    assert (drawn.series, drawn.points, drawn.reference_points, drawn.panels) == (4, 16, 16, ["median_us"])
    path = write(tmp_path / "count-block.json", recs)
    code, out, _ = cli(monkeypatch, capsys, "plot", path, "-o", tmp_path / "d.png")
    assert code == 0 and "block-size curve" in out
    _png(tmp_path / "d.png")


def test_plot_rings_the_fastest_point_and_every_tie_with_it():
    from moebench.analysis.plot import _ring_fastest

    class Axes:  # what was drawn, by call
        def __init__(self):
            self.rings, self.bars, self.legend = [], [], []

        def plot(self, xs, ys=None, *a, label=None, **k):
            (self.legend if label else self.rings).append(list(zip(xs, ys or [])))

        def errorbar(self, xs, ys, yerr, **k):
            self.bars.append(yerr)

    line = {("256",): [(64, 2.00), (128, 2.02), (256, 2.50)]}
    ax = Axes()
    _ring_fastest(ax, line, {("256",): [(64, 0.02), (128, 0.02), (256, 0.02)]}, {"256": "C0"})
    assert ax.rings == [[(64, 2.00), (128, 2.02)]] and ax.bars == [[0.02, 0.02, 0.02]]  # 2.02 - 0.02 <= 2.02
    ax = Axes()
    _ring_fastest(ax, line, {("256",): [(64, 0.001), (128, 0.001), (256, 0.001)]}, {"256": "C0"})
    assert ax.rings == [[(64, 2.00)]]  # separated: the minimum alone
    ax = Axes()
    _ring_fastest(ax, line, {}, {"256": "C0"})  # no stated intervals: no bars, the minimum alone
    assert ax.rings == [[(64, 2.00)]] and ax.bars == []


def test_plot_act_with_and_without_floor(tmp_path):
    from moebench.analysis.plot import plot_results

    prov = {"sweep": "act-grid", "device": {"name": "NVIDIA H200"}}
    grid_us = {128: 9.5, 512: 17.0, 2048: 8.9, 8192: 7.7}
    with_floor = [act_rec(g, 2048, us, 1.55) for g, us in grid_us.items()]
    drawn = plot_results(with_floor, prov, tmp_path / "a.png", reference=load_reference(SEED001))
    _png(tmp_path / "a.png")
    assert drawn.panels == ["median_us", "x_floor"] and drawn.reference_points == 2 and not drawn.notes
    no_floor = [act_rec(g, 2048, us, None) for g, us in grid_us.items()]
    drawn = plot_results(no_floor, prov, tmp_path / "b.png")
    _png(tmp_path / "b.png")
    assert any("no × floor" in n for n in drawn.notes)
    # a case whose kernel source was not there is said apart from a failed one
    gone, broken = act_rec(1024, 2048, 9.0, 1.55), act_rec(4096, 2048, 9.0, 1.55)
    gone.status, broken.status = "unavailable", "error"
    drawn = plot_results(with_floor + [gone, broken], prov, tmp_path / "c.png")
    assert "1 failed case(s) not drawn" in drawn.notes and any(n.startswith("1 unavailable case(s)") for n in drawn.notes)
    untimed = [act_rec(g, 2048, None, None) for g in grid_us]
    with pytest.raises(UsageError, match="no timings"):
        plot_results(untimed, prov, tmp_path / "x.png")
    drawn = plot_results(untimed, prov, tmp_path / "r.png", reference=load_reference(SEED001))
    _png(tmp_path / "r.png")
    assert any("only the reference" in n for n in drawn.notes)
    with pytest.raises(UsageError, match="is a 'count' table"):
        plot_results(with_floor, prov, tmp_path / "y.png", reference=load_reference(SEED000))
    # timed results with nothing to draw say why, not "no timings"
    with pytest.raises(UsageError, match=r"--metric: no cyclez in these results; the numbers they hold: .*median_us"):
        plot_results(with_floor, prov, tmp_path / "m.png", metric="cyclez")
    named = [act_rec(g, 2048, us, 1.55) for g, us in grid_us.items()]
    for r in named:
        r.params["op"] = "silu_mul"  # a parameter that is no number
    with pytest.raises(UsageError, match=r"--x: op is not a positive number in any case with a median_us; name a "
                                         r"parameter that is \(grid_cap\)"):
        plot_results(named, prov, tmp_path / "o.png", x="op")


# ----------------------------------------------------------------------------- ab schedule


class FakeRunner:
    """Stands in for moebench.core.driver.Driver: the time of a case is a function of its block size
    and of FAKE_BLOCK in the environment it was made with (as the `shipped` variant reads
    $MCORE_COUNT_TOKENS_BLOCK)."""

    made: list["FakeRunner"] = []

    def __init__(self, environ):
        self.env = environ.get("FAKE_BLOCK")
        self.calls = []
        FakeRunner.made.append(self)

    def run_case(self, case):
        n = len(self.calls)
        self.calls.append(case.id)
        block = case.params.get("block_size") or int(self.env or 1024)
        us = (8.0 if block == 1024 else 2.1) + 0.01 * (n % 3)
        return Record("s", "count", case.id, case.variant, case.label, "ok", params=dict(case.params),
                      timing={"median_us": us})


def _spec():
    from moebench.core.spec import load_spec

    return load_spec("count-block")


def test_ab_pairs_collapse_the_overridden_axis():
    from moebench.core.cases import expand
    from moebench.analysis.ab import ab_pairs

    spec = _spec()
    off = [parse_setting("block_size=1024", spec.family, "--off")]
    on = [parse_setting("block_size=128", spec.family, "--on")]
    pairs, notes = ab_pairs(spec, expand(spec), off, on)
    assert [p.text for p in pairs] == ["tokens=256", "tokens=1024", "tokens=4096", "tokens=16384"]
    assert all(p.off.params["block_size"] == 1024 and p.on.params["block_size"] == 128 for p in pairs)
    assert all(p.off.id != p.on.id for p in pairs) and not notes
    with pytest.raises(UsageError, match="same configuration"):
        ab_pairs(spec, expand(spec), off, off)


def test_run_arms_interleaves_with_a_fresh_runner_per_arm(monkeypatch):
    from moebench.core.cases import expand
    from moebench.analysis.ab import ab_markdown, ab_pairs, run_arms

    spec = _spec()
    monkeypatch.delenv("FAKE_BLOCK", raising=False)
    off = [parse_setting("env:FAKE_BLOCK=1024", spec.family, "--off")]
    on = [parse_setting("env:FAKE_BLOCK=128", spec.family, "--on")]
    cases = [c for c in expand(spec, quick=True) if c.params["block_size"] == 1024]
    cases = [type(c)(c.family, c.variant, c.label, {**c.params, "block_size": None}, c.id + str(i))
             for i, c in enumerate(cases)]  # as the `shipped` variant: block size from the environment
    pairs, _ = ab_pairs(spec, cases, off, on)
    FakeRunner.made.clear()
    steps = []
    before = dict(os.environ)
    seen_env = []

    def step(a, side, i, p):
        steps.append((a, side))
        seen_env.append(os.environ.get("FAKE_BLOCK"))

    records = run_arms(pairs, off, on, arms=4, iters=3, make_runner=FakeRunner, on_step=step, environ=os.environ)
    assert [r.env for r in FakeRunner.made] == ["1024", "128", "1024", "128"]
    assert dict(os.environ) == before and set(seen_env) == {None}  # never written, not even during an arm
    assert [s for _, s in dict.fromkeys(steps)] == [OFF, ON, OFF, ON]
    assert len(records) == 4 * 3 * len(pairs)
    assert {r.timing["ab_side"] for r in records} == {OFF, ON}
    for p in pairs:
        assert [a.side for a in p.arms] == [OFF, ON, OFF, ON] and all(len(a.values) == 3 for a in p.arms)
        assert p.stats.separation == "better" and p.stats.delta == pytest.approx(-5.9, abs=0.02)
    md = ab_markdown(spec_name="count-block", device="NVIDIA H200", off=off, on=on, arms=4, iters=3, pairs=pairs,
                     layers=48, timer_text="Per-launch median.")
    assert "| case | OFF µs | ON µs | Δ µs | Δ % | arm separation | sd OFF / ON µs | effect | per step (48 layers) |" in md
    assert "every ON iteration beats every OFF iteration" in md and "µs/step" in md


def test_run_arms_a_failing_case_has_no_statistics():
    from moebench.core.cases import expand
    from moebench.analysis.ab import ab_markdown, ab_pairs, run_arms

    class Failing(FakeRunner):
        def run_case(self, case):
            rec = super().run_case(case)
            if case.params["tokens"] == 7 and case.params["block_size"] == 128:
                rec.status, rec.error, rec.timing = "mismatch", "3/32 counts differ from torch.bincount", {}
            return rec

    spec = _spec()
    off = [parse_setting("block_size=1024", spec.family, "--off")]
    on = [parse_setting("block_size=128", spec.family, "--on")]
    pairs, _ = ab_pairs(spec, expand(spec, quick=True), off, on)
    run_arms(pairs, off, on, arms=2, iters=2, make_runner=Failing)
    bad = [p for p in pairs if p.errors]
    assert [p.text for p in bad] == ["tokens=7"] and bad[0].stats is None
    assert bad[0].errors[0] == "arm 2 ON iteration 1: mismatch: 3/32 counts differ from torch.bincount"
    md = ab_markdown(spec_name="count-block", device="H200", off=off, on=on, arms=2, iters=2, pairs=pairs,
                     layers=None, timer_text="")
    assert "| tokens=7 | ✗ | ✗ |" in md and "per step |" in md


def test_parse_setting():
    fam = _spec().family
    assert parse_setting("block_size=128", fam, "--on").value == 128
    s = parse_setting("env:MCORE_COUNT_TOKENS_BLOCK=1024", fam, "--off")
    assert s.env and s.key == "MCORE_COUNT_TOKENS_BLOCK" and s.value == "1024"
    for bad, msg in (("block_size=96", "power of two"), ("blocksize=128", "unknown parameter"),
                     ("block_size", "expected KEY=VAL"), ("env:1X=2", "not an environment variable")):
        with pytest.raises(UsageError, match=msg):
            parse_setting(bad, fam, "--on")


# ----------------------------------------------------------------------------- CLI error paths


def test_ab_switches_arms_by_environment_without_touching_os_environ(tmp_path, monkeypatch, capsys):
    """`ab` with env: settings end to end: the real kernels under the interpreter, each arm's run driver
    given its own environment, a stand-in for the GPU timer that reads the launch the case ran with.
    The arms differ as the kill switch says, and os.environ is the same before, during and after."""
    import moebench.core.device as device
    from moebench.core.placements import Timed, Timer

    real = device.detect
    monkeypatch.setattr(device, "want_interpreter", lambda requested: False)
    monkeypatch.setattr(device, "detect", lambda interpret: real(True))
    monkeypatch.setattr(device, "require_triton", lambda: None)
    monkeypatch.delenv("MCORE_COUNT_TOKENS_BLOCK", raising=False)
    before = dict(os.environ)
    during = []

    def timed(self, case, rec, builts, **kw):
        during.append(os.environ.get("MCORE_COUNT_TOKENS_BLOCK"))
        rec.timing["median_us"] = 8.0 if rec.launch["block_size"] == 1024 else 2.0
        return Timed(builts, estimate_us=rec.timing["median_us"])

    monkeypatch.setattr(Timer, "time", timed)
    spec = tmp_path / "shipped.yaml"
    spec.write_text("""
name: shipped
family: count
model: qwen3-30b-a3b
variants: [shipped]
baseline: {variant: persistent, block_size: 1024}
axes: {tokens: [7, 40]}
fixed: {buffer_tokens: 64, grid: 4}
""")
    code, out, err = cli(monkeypatch, capsys, "ab", spec, "--off", "env:MCORE_COUNT_TOKENS_BLOCK=1024", "--on",
                         "env:MCORE_COUNT_TOKENS_BLOCK=128", "--arms", "2", "--iters", "2", "--out", tmp_path)
    assert code == 0, err
    assert dict(os.environ) == before and set(during) == {None}
    doc = json.loads((tmp_path / real(True).slug / "shipped-ab.json").read_text())
    by_side = {}
    for r in doc["records"]:
        by_side.setdefault(r["timing"]["ab_side"], set()).add(
            (r["launch"]["block_size"], r["launch_from"]["block_size"], r["status"]))
    assert by_side == {OFF: {(1024, "$MCORE_COUNT_TOKENS_BLOCK", "ok")},
                       ON: {(128, "$MCORE_COUNT_TOKENS_BLOCK", "ok")}}
    assert all(c["delta_us"] == -6.0 for c in doc["provenance"]["ab"]["cases"])


def test_ab_without_cuda_says_it_needs_timings(monkeypatch, capsys):
    import moebench.core.device as device

    monkeypatch.setattr(device, "want_interpreter", lambda requested: True)
    code, out, err = cli(monkeypatch, capsys, "ab", "count-block", "--off", "block_size=1024", "--on",
                         "block_size=128", "--quick")
    assert code == 2 and BackendError.exit_code == 2
    assert one_line(err).startswith("error: ab: no CUDA device is visible")
    assert "Traceback" not in err
    code, out, err = cli(monkeypatch, capsys, "ab", "count-block", "--off", "block_size=1024", "--on",
                         "block_size=128", "--dry-run")
    assert code == 0 and "tokens=16384" in out and "48 MoE layers" in one_line(out)
    code, _, err = cli(monkeypatch, capsys, "ab", "count-block", "--on", "block_size=128", "--arms", "3")
    assert code == 2 and "--arms: expected an even number" in one_line(err)


@pytest.mark.parametrize("command", [["compare", "{f}", "{f}"], ["recommend", "{f}"], ["plot", "{f}", "-o", "{png}"]])
def test_cli_error_paths(tmp_path, monkeypatch, capsys, command):
    cases = {
        "missing.json": (None, "no such results file"),
        "list.json": ("[1, 2, 3]", "not a moebench results file"),
        "empty.json": (json.dumps({"provenance": {}, "records": []}), "no records"),
        "text.json": ("sweep: count\n", "not a moebench results file"),
        "bad-record.json": (json.dumps({"records": [{"nope": 1}]}), "not a moebench results file"),
    }
    for name, (content, msg) in cases.items():
        f = tmp_path / name
        if content is not None:
            f.write_text(content)
        args = [a.format(f=f, png=tmp_path / "x.png") for a in command]
        code, _, err = cli(monkeypatch, capsys, *args)
        assert code == 2, (name, err)
        assert one_line(err).startswith(f"error: {f}: {msg}") or msg in one_line(err), (name, err)
        assert "Traceback" not in err
    code, _, err = cli(monkeypatch, capsys, "plot", "ref:nope", "-o", tmp_path / "x.png")
    assert code == 2 and "unknown reference 'nope'; known: " in one_line(err)


def test_min_detectable_is_the_two_sample_power_formula():
    """n = 10 a side at sd 1: a two-sided t-test at alpha 0.05 detects 1.32 sd with power 0.8 (the
    textbook figure); more measurements or less spread detect less, and a side of one detects nothing."""
    from moebench.analysis.ab import min_detectable

    assert min_detectable(1.0, 1.0, 10, 10) == pytest.approx(1.3159, abs=2e-3)
    assert min_detectable(1.0, 1.0, 40, 40) < min_detectable(1.0, 1.0, 10, 10)
    assert min_detectable(0.5, 0.5, 10, 10) == pytest.approx(min_detectable(1.0, 1.0, 10, 10) / 2)
    assert min_detectable(1.0, 1.0, 1, 10) == math.inf
    assert min_detectable(1.0, 1.0, 10, 10, power=0.9) > min_detectable(1.0, 1.0, 10, 10)


@pytest.mark.parametrize("page", sorted(Path(__file__).parents[2].glob("results/*/recommend-*.md")), ids=lambda p: p.name)
def test_a_committed_recommend_page_is_what_its_command_prints(page, monkeypatch, capsys):
    """Each recommend page names its command on its third line; the table and the argument under
    its header are that command's output today, from the results file it names."""
    import re
    import shlex

    lines = page.read_text().splitlines()
    (cmd,) = re.findall(r"`moebench (recommend [^`]+)`", lines[2])
    monkeypatch.chdir(page.parents[2])
    code, out, _ = cli(monkeypatch, capsys, *shlex.split(cmd))
    body = lines[lines.index("", 3) + 1:]
    assert code == 0 and out.splitlines()[2:] == body
