"""Specs that are right load and expand the way the design says (the errors are in test_spec_errors)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from moebench.core.cases import Case, case_id, expand, shape_key, varying_params
from moebench.core.family import catalogue
from moebench.core.spec import (PACKAGE_ROOT, Matrix, Spec, Timing, VariantEntry, builtin_models, builtin_sweeps,
                           load_spec, resolve_spec_path)

COUNT = catalogue()["count"]
DROP = object()  # as a value: leave HEAD's key out
QWEN = yaml.safe_load((PACKAGE_ROOT / "configs" / "qwen3-30b-a3b.yaml").read_text())

HEAD = {
    "name": "t",
    "family": "count",
    "model": "qwen3-30b-a3b",
    "variants": ["persistent"],
    "baseline": {"variant": "persistent", "block_size": 1024},
}


@pytest.fixture
def write(tmp_path):
    """write(doc or text) -> a loaded Spec; a dict is merged over HEAD."""

    def _write(doc, name: str = "s.yaml") -> Spec:
        if not isinstance(doc, str):
            doc = {k: v for k, v in {**HEAD, **doc}.items() if v is not DROP}
        text = doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False)
        f = tmp_path / name
        f.write_text(text)
        return load_spec(str(f))

    return _write


def points(cases: list[Case], *names: str) -> list[tuple]:
    return [tuple(c.params[n] for n in names) for c in cases]


# ------------------------------------------------------------------------------ count-block


def test_count_block_loads():
    spec = load_spec("count-block")
    assert spec.path == resolve_spec_path("count-block")
    assert spec.name == "count-block" and spec.family is COUNT
    assert spec.model_name == "qwen3-30b-a3b" and spec.model["topk"] == QWEN["topk"]
    assert spec.baseline == {"variant": "persistent", "block_size": 1024}
    assert spec.pivot == {"rows": "block_size", "cols": "tokens", "metric": "median_us"}
    assert isinstance(spec.timing, Timing) and spec.timing == Timing()
    assert [v.variant for v in spec.sweep.variants] == ["persistent"]
    assert len(spec.sha256) == 64


def test_count_block_sweep_and_quick():
    spec = load_spec("count-block")
    cases = expand(spec)
    assert len(cases) == 5 * 4
    assert set(points(cases, "block_size", "tokens")) == set(
        itertools.product([64, 128, 256, 512, 1024], [256, 1024, 4096, 16384]))
    assert {c.params["buffer_tokens"] for c in cases} == {16384}
    quick = expand(spec, quick=True)
    assert len(quick) == 3 * 3
    assert {c.params["buffer_tokens"] for c in quick} == {512}
    assert {c.params["tokens"] for c in quick} == {0, 7, 256}


def test_count_block_verify_matrix_is_the_prs_2280():
    spec = load_spec("count-block")
    cases = expand(spec, verify=True)
    assert len(cases) == 2280
    assert len({c.id for c in cases}) == 2280
    assert all(c.params["tokens"] <= c.params["buffer_tokens"] for c in cases)
    # 10 seeds x (7 + 7 + 5 valid counts under the three capacities) x 4 starts x 3 block sizes
    per_capacity = {b: len({c.params["tokens"] for c in cases if c.params["buffer_tokens"] == b})
                    for b in (16384, 4096, 512)}
    assert per_capacity == {16384: 7, 4096: 7, 512: 5}
    assert {c.params["block_size"] for c in cases} == {128, 256, 512}
    # the verify matrix keeps the sweep's fixed values and variants, not its axes
    assert {c.params["routing"] for c in cases} == {"uniform"}
    assert {c.params["num_warps"] for c in cases} == {4}
    assert {c.variant for c in cases} == {"persistent"}
    assert len(expand(spec, verify=True, quick=True)) == 2 * 5 * 2 * 2


def test_count_block_case_ids_are_stable():
    a, b = expand(load_spec("count-block")), expand(load_spec("count-block"))
    assert [c.id for c in a] == [c.id for c in b]
    # pinned: a change here changes every stored result's case id
    first = a[0]
    assert first.params["block_size"] == 64 and first.params["tokens"] == 256
    assert first.id == case_id("count", "persistent", first.params)


# ------------------------------------------------------------------------------ expansion


def test_axes_are_a_cartesian_product(write):
    spec = write({"axes": {"block_size": [64, 128, 256], "tokens": [1, 2]}, "fixed": {"buffer_tokens": 16}})
    cases = expand(spec)
    assert points(cases, "block_size", "tokens") == list(itertools.product([64, 128, 256], [1, 2]))


def test_one_value_is_a_one_value_axis(write):
    spec = write({"axes": {"tokens": 5}, "fixed": {"buffer_tokens": 16}})
    assert spec.sweep.axes == {"tokens": [5]}
    assert points(expand(spec), "tokens") == [(5,)]


def test_zip_groups_advance_together(write):
    spec = write({"axes": {"block_size": [64, 128]},
                  "zip": [{"tokens": [1, 16, 16], "buffer_tokens": [8, 16, 32]}]})
    cases = expand(spec)
    assert len(cases) == 2 * 3
    assert set(points(cases, "tokens", "buffer_tokens")) == {(1, 8), (16, 16), (16, 32)}


def test_two_zip_groups_multiply(write):
    spec = write({"zip": [{"tokens": [1, 2], "buffer_tokens": [8, 16]},
                          {"block_size": [64, 128], "num_warps": [2, 4]}]})
    assert set(points(expand(spec), "tokens", "buffer_tokens", "block_size", "num_warps")) == {
        (t, b, bs, w) for t, b in ((1, 8), (2, 16)) for bs, w in ((64, 2), (128, 4))}


def test_fixed_and_model_defaults(write):
    spec = write({"axes": {"tokens": [1]}, "fixed": {"buffer_tokens": 64, "topk": 4, "routing": "zipf",
                                                     "zipf_s": 2}})
    (c,) = expand(spec)
    assert c.params["topk"] == 4  # fixed beats the model
    assert c.params["num_experts"] == QWEN["num_experts"]  # from the model config
    assert c.params["local_experts"] == QWEN["local_experts"]
    assert c.params["routing"] == "zipf"
    assert c.params["zipf_s"] == 2.0 and isinstance(c.params["zipf_s"], float)
    assert c.params["local_expert_start"] == 0  # the family default
    assert c.params["block_size"] == 1024


def test_without_a_model_every_value_comes_from_the_spec(write):
    spec = write({"model": DROP, "fixed": {"tokens": 1, "buffer_tokens": 8, "topk": 2, "num_experts": 8,
                                           "local_experts": 8}})
    assert spec.model == {} and spec.model_name is None
    (c,) = expand(spec)
    assert (c.params["topk"], c.params["num_experts"]) == (2, 8)


def test_seed_comes_from_the_top_level_unless_swept(write):
    spec = write({"seed": 7, "fixed": {"tokens": 1, "buffer_tokens": 8}})
    assert points(expand(spec), "seed") == [(7,)]
    spec = write({"seed": 7, "axes": {"seed": [0, 1]}, "fixed": {"tokens": 1, "buffer_tokens": 8}})
    assert points(expand(spec), "seed") == [(0,), (1,)]


def test_where_filters_all_must_hold(write):
    spec = write({"axes": {"tokens": [0, 8, 64, 512], "buffer_tokens": [64, 512]},
                  "where": ["tokens <= buffer_tokens", "tokens > 0 or buffer_tokens == 64",
                            "min(tokens, 100) != 64"]})
    assert sorted(points(expand(spec), "tokens", "buffer_tokens")) == [
        (0, 64), (8, 64), (8, 512), (512, 512)]


def test_where_may_compare_strings(write):
    spec = write({"axes": {"routing": ["uniform", "zipf"], "zipf_s": [1.0, 2.0]},
                  "fixed": {"tokens": 1, "buffer_tokens": 8},
                  "where": "routing == 'zipf' or zipf_s == 1.0"})
    assert sorted(points(expand(spec), "routing", "zipf_s")) == [
        ("uniform", 1.0), ("zipf", 1.0), ("zipf", 2.0)]


def test_yaml_anchors_and_aliases(write):
    text = yaml.safe_dump(HEAD) + (
        "axes:\n  block_size: &bs [64, 128]\n  tokens: [1]\n"
        "fixed: &fx {buffer_tokens: 8}\n"
        "verify:\n  axes: {block_size: *bs, tokens: [0, 1]}\n  fixed: *fx\n")
    spec = write(text)
    assert spec.verify.axes["block_size"] == [64, 128]
    assert len(expand(spec, verify=True)) == 4


def test_empty_where_list_and_description_are_fine(write):
    spec = write({"fixed": {"tokens": 1, "buffer_tokens": 8}, "where": [], "description": None})
    assert spec.description == "" and spec.sweep.where == []
    assert len(expand(spec)) == 1


# ------------------------------------------------------------------------------ quick and verify


BASE_MATRIX = {
    "axes": {"block_size": [64, 128], "tokens": [1, 8]},
    "fixed": {"buffer_tokens": 512, "num_warps": 4},
    "where": "tokens <= buffer_tokens",
}


def test_quick_overrides_only_what_it_names(write):
    spec = write({**BASE_MATRIX, "quick": {"axes": {"tokens": [2]}}})
    quick = expand(spec, quick=True)
    assert set(points(quick, "block_size", "tokens")) == {(64, 2), (128, 2)}  # block_size stays
    assert {c.params["buffer_tokens"] for c in quick} == {512}  # fixed stays
    assert spec.quick.where == spec.sweep.where  # where stays


def test_quick_moves_a_name_between_axes_and_fixed(write):
    spec = write({**BASE_MATRIX, "quick": {"fixed": {"block_size": 256}, "axes": {"buffer_tokens": [8, 16]}}})
    assert spec.quick.axes == {"tokens": [1, 8], "buffer_tokens": [8, 16]}
    assert spec.quick.fixed == {"num_warps": 4, "block_size": 256}
    assert set(points(expand(spec, quick=True), "block_size", "tokens", "buffer_tokens")) == {
        (256, t, b) for t in (1, 8) for b in (8, 16)}


def test_quick_where_and_variants_replace_the_base(write):
    spec = write({**BASE_MATRIX, "quick": {"where": "tokens == 1", "variants": ["nonpersistent"]}})
    quick = expand(spec, quick=True)
    assert {c.variant for c in quick} == {"nonpersistent"}
    assert {c.params["tokens"] for c in quick} == {1}
    assert len(expand(spec)) == 4  # the sweep itself is untouched


def test_quick_keeps_zip_groups_it_does_not_touch(write):
    spec = write({"axes": {"block_size": [64, 128]},
                  "zip": [{"tokens": [1, 2], "buffer_tokens": [8, 16]}],
                  "quick": {"axes": {"block_size": [256]}}})
    assert spec.quick.zips == spec.sweep.zips
    assert set(points(expand(spec, quick=True), "block_size", "tokens", "buffer_tokens")) == {
        (256, 1, 8), (256, 2, 16)}


def test_quick_replaces_a_whole_zip_group(write):
    spec = write({"axes": {"block_size": [64]},
                  "zip": [{"tokens": [1, 2], "buffer_tokens": [8, 16]}],
                  "quick": {"fixed": {"tokens": 4, "buffer_tokens": 4}}})
    assert spec.quick.zips == []
    assert points(expand(spec, quick=True), "tokens", "buffer_tokens") == [(4, 4)]


def test_quick_adds_its_own_zip_beside_the_base_ones(write):
    spec = write({"fixed": {"buffer_tokens": 512},
                  "zip": [{"tokens": [1, 2], "seed": [0, 1]}],
                  "quick": {"zip": [{"block_size": [64, 128], "num_warps": [2, 4]}]}})
    assert len(spec.quick.zips) == 2
    assert len(expand(spec, quick=True)) == 4


def test_an_empty_quick_is_the_sweep(write):
    spec = write({**BASE_MATRIX, "quick": {}})
    assert [c.id for c in expand(spec, quick=True)] == [c.id for c in expand(spec)]
    spec = write(BASE_MATRIX)
    assert spec.quick is spec.sweep


def test_verify_inherits_fixed_and_variants_not_axes(write):
    spec = write({**BASE_MATRIX, "variants": ["persistent", "nonpersistent"],
                  "verify": {"axes": {"tokens": [0, 1], "seed": [0, 1, 2]}}})
    assert spec.verify.axes == {"tokens": [0, 1], "seed": [0, 1, 2]}
    assert spec.verify.where == []
    cases = expand(spec, verify=True)
    assert len(cases) == 2 * 3 * 2
    assert {c.params["block_size"] for c in cases} == {1024}  # the default, not the sweep's axis
    assert {c.params["buffer_tokens"] for c in cases} == {512}


def test_verify_quick_overrides_verify(write):
    spec = write({**BASE_MATRIX, "verify": {"axes": {"tokens": [0, 1, 2], "seed": [0, 1]},
                                            "where": "tokens < 2",
                                            "quick": {"axes": {"seed": [5]}}}})
    vq = expand(spec, verify=True, quick=True)
    assert set(points(vq, "tokens", "seed")) == {(0, 5), (1, 5)}
    assert spec.matrix(verify=True, quick=True) is spec.verify_quick
    assert spec.matrix(verify=True) is spec.verify
    # without a verify.quick, --quick on verify uses the verify matrix itself
    spec = write({**BASE_MATRIX, "verify": {"axes": {"seed": [0, 1]}}})
    assert spec.matrix(verify=True, quick=True) is spec.verify


# ------------------------------------------------------------------------------ variants


def test_variant_entries_with_label_params_axes(write):
    spec = write({"variants": [{"variant": "persistent", "label": "bs128", "params": {"block_size": 128}},
                               {"variant": "persistent", "label": "sweep", "axes": {"block_size": [256, 512]}},
                               "nonpersistent"],
                  "axes": {"tokens": [1, 2]}, "fixed": {"buffer_tokens": 8}})
    assert spec.sweep.variants[0] == VariantEntry("persistent", "bs128", {"block_size": 128}, {})
    assert spec.sweep.variants[2] == VariantEntry("nonpersistent", "nonpersistent", {}, {})
    cases = expand(spec)
    by = {}
    for c in cases:
        by.setdefault(c.label, set()).add((c.params["block_size"], c.params["tokens"]))
    assert by == {"bs128": {(128, 1), (128, 2)},
                  "sweep": {(256, 1), (512, 1), (256, 2), (512, 2)},
                  "nonpersistent": {(1024, 1), (1024, 2)}}
    assert {c.variant for c in cases if c.label.startswith(("bs", "sw"))} == {"persistent"}


def test_variant_params_beat_the_matrix(write):
    spec = write({"variants": [{"variant": "persistent", "params": {"block_size": 64}}, "nonpersistent"],
                  "axes": {"block_size": [128, 256]}, "fixed": {"tokens": 1, "buffer_tokens": 8}})
    cases = expand(spec)
    assert points([c for c in cases if c.label == "persistent"], "block_size") == [(64,)]  # deduped
    assert points([c for c in cases if c.label == "nonpersistent"], "block_size") == [(128,), (256,)]


def test_launch_params_a_variant_ignores_are_deduped(write):
    spec = write({"variants": ["persistent", "shipped"],
                  "axes": {"block_size": [64, 128, 256], "tokens": [1, 2]}, "fixed": {"buffer_tokens": 8}})
    cases = expand(spec)
    persistent = [c for c in cases if c.variant == "persistent"]
    shipped = [c for c in cases if c.variant == "shipped"]
    assert len(persistent) == 6 and len(shipped) == 2
    assert all(c.params["block_size"] is None for c in shipped)
    assert all(c.params["num_warps"] == 4 for c in shipped)  # a launch param it does take
    assert len({c.id for c in cases}) == len(cases)


def test_where_on_an_ignored_launch_param_reads_zero(write):
    spec = write({"variants": ["persistent", "shipped"], "axes": {"block_size": [64, 128]},
                  "fixed": {"tokens": 1, "buffer_tokens": 8}, "where": "block_size != 64"})
    cases = expand(spec)
    assert [(c.variant, c.params["block_size"]) for c in cases] == [("persistent", 128), ("shipped", None)]


def test_zip_may_repeat_a_value_in_a_column(write):
    spec = write({"zip": [{"buffer_tokens": [16384, 16384, 512], "tokens": [2048, 16384, 512]}]})
    assert len(expand(spec)) == 3


# ------------------------------------------------------------------------------ ids and helpers


def test_case_ids_ignore_unrelated_edits(write):
    a = write({"axes": {"tokens": [1, 2], "block_size": [64]}, "fixed": {"buffer_tokens": 8}})
    b = write({"description": "edited", "max_cases": 99, "timing": {"warmup": 9}, "pivot": {"rows": "tokens"},
               "fixed": {"buffer_tokens": 8}, "axes": {"block_size": [64, 128], "tokens": [3, 2, 1]}})
    ids_a = {c.id for c in expand(a)}
    ids_b = {c.id for c in expand(b)}
    assert ids_a < ids_b  # every old case keeps its id; the new ones are added


def test_case_ids_depend_on_label_and_every_value():
    params = {"tokens": 1, "block_size": 64, "grid": None}
    base = case_id("count", "persistent", params)
    assert case_id("count", "persistent", dict(reversed(params.items()))) == base
    assert case_id("count", "persistent", {"tokens": 1, "block_size": 64}) == base  # None is absent
    assert case_id("count", "other", params) != base
    assert case_id("count", "persistent", {**params, "tokens": 2}) != base
    assert case_id("act", "persistent", params) != base
    assert len(base) == 12 and int(base, 16) >= 0


def test_shape_key_and_varying_params(write):
    spec = write({"variants": ["persistent", "nonpersistent"],
                  "axes": {"block_size": [64, 128], "tokens": [1, 2]}, "fixed": {"buffer_tokens": 8}})
    cases = expand(spec)
    # grid does not vary: nonpersistent does not take it (None there), persistent has one value
    assert varying_params(cases) == ("tokens", "block_size")
    shapes = {shape_key(c, COUNT.shape_params) for c in cases}
    assert len(shapes) == 2  # block size and variant do not change the inputs
    assert varying_params([]) == ()
    assert cases[0].short(("tokens", "block_size")) == "persistent[tokens=1,block_size=64]"


def test_max_cases_and_force(write):
    spec = write({"max_cases": 3, "axes": {"tokens": [1, 2], "block_size": [64, 128]},
                  "fixed": {"buffer_tokens": 8}})
    assert len(expand(spec, force=True)) == 4


def test_timing_pivot_seed(write):
    spec = write({"fixed": {"tokens": 1, "buffer_tokens": 8}, "seed": 3,
                  "timing": {"min_replays": 10, "max_replays": 10, "max_seconds": 2, "l2": "cold"},
                  "pivot": {"rows": "label", "cols": "tokens", "metric": "p90_us"}})
    assert spec.timing.min_replays == 10 and spec.timing.l2 == "cold"
    assert spec.timing.max_seconds == 2.0 and isinstance(spec.timing.max_seconds, float)
    assert spec.pivot == {"rows": "label", "cols": "tokens", "metric": "p90_us"}
    assert spec.seed == 3


def test_matrix_dataclass_shape(write):
    spec = write({"fixed": {"tokens": 1, "buffer_tokens": 8}})
    assert isinstance(spec.sweep, Matrix)
    assert spec.sweep.zips == [] and spec.sweep.where == [] and spec.sweep.axes == {}
    assert spec.verify is None and spec.verify_quick is None


# ------------------------------------------------------------------------------ names


def test_names_resolve_to_builtin_sweeps():
    assert resolve_spec_path("count-block").name == "count-block.yaml"
    assert resolve_spec_path("some/where.yaml") == Path("some/where.yaml")
    assert "count-block" in {p.stem for p in builtin_sweeps()}
    assert "qwen3-30b-a3b" in {p.stem for p in builtin_models()}


def test_a_sweep_of_the_working_directory_wins_a_name_clash_in_list_as_when_run(tmp_path, monkeypatch):
    (tmp_path / "sweeps").mkdir()
    mine = tmp_path / "sweeps" / "count-block.yaml"
    mine.write_text((PACKAGE_ROOT / "sweeps" / "count-block.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert resolve_spec_path("count-block").resolve() == mine.resolve()
    assert [p.resolve() for p in builtin_sweeps() if p.stem == "count-block"] == [mine.resolve()]


@pytest.mark.parametrize("path", builtin_sweeps(), ids=lambda p: p.stem)
def test_every_builtin_sweep_loads_and_expands(path):
    spec = load_spec(str(path))
    assert expand(spec) and expand(spec, quick=True)
    if spec.verify is not None:
        assert expand(spec, verify=True, force=True)
