"""moebench.core.provenance: the provenance a run adds before its first case and after its last, which
the CLI hands to moebench.core.provenance.provenance without building any of it itself."""

from types import SimpleNamespace

from moebench.core.cases import expand
from moebench.core.provenance import run_extra, summary_fields
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
