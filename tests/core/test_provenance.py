"""moebench.core.provenance: the provenance a run adds before its first case and after its last, which
the CLI hands to moebench.core.provenance.provenance without building any of it itself."""

from types import SimpleNamespace

from moebench.core.baseline import add_baseline_deltas, add_deltas
from moebench.core.cases import expand
from moebench.core.provenance import case_map, run_extra, summary_fields
from moebench.core.records import Record
from moebench.core.spec import load_spec


def test_a_timed_run_states_its_noise_model_after_its_settings():
    spec = load_spec("count-block")
    cases = expand(spec, quick=True, verify=False, force=False)
    model = {"setting": "auto", "path": "results/h200/noise/count-block.json", "sha256": "f" * 64}
    extra = run_extra(spec, cases, cross=("dobench",), timed=True, shard=(1, 4), settings={"l2": "warm"},
                      noise_model=model)
    assert list(extra)[:6] == ["cross_checks", "timed", "n_cases", "shard", "settings", "noise_model"]
    assert extra["noise_model"] == model and extra["n_cases"] == len(cases) and extra["shard"] == [1, 4]
    assert "upstream" not in extra  # no case of count-block runs an upstream kernel


def test_an_untimed_run_states_no_noise_model():
    spec = load_spec("count-block")
    cases = expand(spec, quick=True, verify=True, force=False)
    for model in (None, {"setting": "none"}):
        extra = run_extra(spec, cases, cross=(), timed=False, shard=None, settings={}, noise_model=model)
        assert "noise_model" not in extra and extra["shard"] is None and extra["timed"] is False


def test_the_summary_fields_come_from_the_driver_summary():
    s = SimpleNamespace(wall_s=1.5, compile_s=0.25, jit_specializations=3, phases={"verify": 1.0}, complete=False,
                        passes=["dobench"])
    assert summary_fields(s) == {"sweep_wall_s": 1.5, "compile_s_total": 0.25, "jit_specializations": 3,
                                 "wall_phases_s": {"verify": 1.0}, "complete": False, "cross_checks": ["dobench"]}


def test_the_case_map_names_the_baseline_case_whatever_its_label():
    """layer-count labels its one variant `layer`, and its baseline is that variant at
    count_block_size 1024: the map (what `merge` reads shards against) names that case, and a merged
    run gets the deltas the run itself gives."""
    spec = load_spec("layer-count")
    cases = expand(spec)
    cmap = case_map(spec, quick=False, verify=False)
    by_id = {c.id: c for c in cases}
    for c in cases:
        b = by_id[cmap[c.id]]
        assert b.params["count_block_size"] == 1024
        assert all(b.params[k] == c.params[k] for k in spec.family.shape_params)

    def records():
        return [Record(spec.name, "layer", c.id, c.variant, c.label, "ok", params=dict(c.params),
                       timing={"median_us": 10.0 if c.params["count_block_size"] == 1024 else 8.0}) for c in cases]

    run, merged = records(), records()
    add_baseline_deltas(spec, run)
    add_deltas(merged, cmap, spec.model["moe_layers"], spec.family)
    assert [r.work for r in run] == [r.work for r in merged]
    assert {r.work["speedup"] for r in run} == {1.0, 1.25}
