"""Bad input ends in one clear line: file, key path, what was expected; exit 2; no traceback.

Every malformed spec below goes through the real CLI entry (`moebench validate FILE`, in
process: `moebench.cli.main` with `sys.argv` patched). A property test then throws random
documents and raw bytes at `load_spec` + `expand` and asserts nothing but a `MoebenchError`
ever comes out.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebench import cli
from moebench.core.cases import expand, varying_params
from moebench.errors import MoebenchError, SpecError
from moebench.core.family import catalogue
from moebench.core.spec import MATRIX_KEYS, TIMING_KEYS, TOP_KEYS, load_spec

COUNT = catalogue()["count"]
COUNT_VARIANTS = ", ".join(COUNT.variants)
TAKES_BLOCK_SIZE = ", ".join(v.name for v in COUNT.variants.values() if "block_size" in v.params)

# A small valid count spec; each case below breaks one thing in it.
BASE = {
    "name": "t",
    "family": "count",
    "model": "qwen3-30b-a3b",
    "variants": ["persistent"],
    "baseline": {"variant": "persistent", "block_size": 1024},
    "axes": {"block_size": [64, 128], "tokens": [1, 256]},
    "fixed": {"buffer_tokens": 512},
}
DROP = object()  # as a value in `edits`: delete the key


def edited(**edits) -> str:
    """BASE with top-level keys replaced (or dropped), as YAML text."""
    doc = copy.deepcopy(BASE)
    for k, v in edits.items():
        if v is DROP:
            doc.pop(k, None)
        else:
            doc[k] = v
    return yaml.safe_dump(doc, sort_keys=False)


def base_plus(extra: str) -> str:
    """BASE without axes/fixed, then `extra` YAML appended verbatim (for duplicate keys, anchors...)."""
    return edited(axes=DROP, fixed=DROP) + extra


def cli_run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `moebench ARGS` in process; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["moebench", *args])
    # rich wraps at the console width; pin it wide so a long line stays one line here (the
    # narrow case has its own test below)
    monkeypatch.setenv("COLUMNS", "2000")
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, path: str, key: str, expect: tuple[str, ...]):
    assert "Traceback" not in out + err
    assert code == 2, f"exit code {code}; stderr: {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    line = lines[0]
    head = f"error: {path}: {key}: " if key else f"error: {path}: "
    assert line.startswith(head), f"expected {head!r} at the start of {line!r}"
    for piece in expect:
        assert piece in line, f"expected {piece!r} in {line!r}"


# (id, YAML text, key path, fragments the message must contain)
BAD: list[tuple[str, str, str, tuple[str, ...]]] = [
    # --- the file itself
    ("yaml-syntax", "name: [t\nfamily: count\n", "", ("invalid YAML at line",)),
    ("yaml-tab-indent", "name: t\naxes:\n\ttokens: [1]\n", "", ("invalid YAML at line 3",)),
    ("yaml-two-documents", edited() + "---\nname: u\n", "", ("invalid YAML", "single document")),
    ("yaml-bad-timestamp", base_plus("description: 2024-13-01\n"), "", ("at line", "month must be in 1..12")),
    ("yaml-bad-int-tag", base_plus("seed: !!int twelve\n"), "", ("invalid YAML", "'twelve'")),
    ("yaml-unknown-tag", base_plus("seed: !python/int 3\n"), "", ("invalid YAML",)),
    ("empty-file", "", "", ("empty file", "name, family and variants")),
    ("only-comments", "# nothing here\n", "", ("empty file",)),
    ("top-level-list", "- name\n- family\n", "", ("expected a mapping", "got a list")),
    ("top-level-scalar", "42\n", "", ("expected a mapping", "got 42")),
    ("duplicate-key", base_plus("axes: {tokens: [1], tokens: [2]}\nfixed: {buffer_tokens: 8}\n"),
     "axes.tokens", ("key given twice", "keep one")),
    ("duplicate-top-key", base_plus("fixed: {tokens: 1}\nfixed: {buffer_tokens: 8}\n"),
     "fixed", ("twice", "lines 9 and 10")),
    ("alias-cycle", base_plus("fixed: {tokens: 1, buffer_tokens: 8}\nwhere: &w [*w]\n"),
     "where[0]", ("cycle",)),
    # --- missing required keys
    ("missing-name", edited(name=DROP), "name", ("missing", "sweep name")),
    ("missing-family", edited(family=DROP), "family", ("missing", "count")),
    ("missing-variants", edited(variants=DROP), "variants", ("missing",)),
    ("missing-baseline", edited(baseline=DROP), "baseline", ("missing", "bit-exactly")),
    # --- unknown keys, each level
    ("unknown-top-key", edited(nmae="t"), "nmae", ("unknown key", "name, family", "did you mean 'name'")),
    ("unknown-timing-key", edited(timing={"warmups": 3}), "timing.warmups",
     ("unknown key", "launches_per_graph", "did you mean 'warmup'")),
    ("unknown-pivot-key", edited(pivot={"row": "tokens"}), "pivot.row", ("unknown key", "rows, cols, metric")),
    ("unknown-variant-entry-key", edited(variants=[{"variant": "persistent", "lable": "p"}]),
     "variants[0].lable", ("unknown key", "variant, label, params, axes")),
    ("unknown-quick-key", edited(quick={"axis": {"tokens": [1]}}), "quick.axis",
     ("unknown key", "axes, zip, fixed, where, variants")),
    ("quick-inside-quick", edited(quick={"quick": {}}), "quick.quick", ("unknown key",)),
    ("unknown-verify-key", edited(verify={"axes": {"seed": [0, 1]}, "wher": "tokens > 1"}),
     "verify.wher", ("unknown key", "quick", "did you mean 'where'")),
    ("unknown-verify-quick-key", edited(verify={"axes": {"seed": [0, 1]}, "quick": {"seeds": [0]}}),
     "verify.quick.seeds", ("unknown key",)),
    ("quick-inside-verify-quick", edited(verify={"quick": {"quick": {}}}), "verify.quick.quick",
     ("unknown key",)),
    ("unknown-baseline-key", edited(baseline={"variant": "persistent", "blocksize": 64}),
     "baseline.blocksize", ("unknown parameter", "block_size")),
    ("unknown-parameter", edited(axes={"token": [1]}), "axes.token",
     ("unknown parameter of family 'count'", "did you mean 'tokens'")),
    # --- wrong types
    ("string-for-int", edited(axes={"tokens": ["8"]}), "axes.tokens[0]", ("expected an integer", "'8'")),
    ("bool-for-int", edited(fixed={"buffer_tokens": True}), "fixed.buffer_tokens",
     ("expected an integer", "got true")),
    ("float-for-int", edited(fixed={"buffer_tokens": 512, "block_size": 128.0}), "fixed.block_size",
     ("expected an integer", "128.0")),
    ("list-for-mapping", edited(timing=[1, 2]), "timing", ("expected a mapping", "got a list")),
    ("mapping-for-list", edited(axes={"tokens": {"a": 1}}), "axes.tokens",
     ("expected a list of values", "a mapping")),
    ("list-for-one-value", edited(fixed={"buffer_tokens": [512, 1024]}), "fixed.buffer_tokens",
     ("expected one value", "under axes")),
    ("string-for-number", edited(timing={"max_seconds": "1s"}), "timing.max_seconds",
     ("expected a number", "'1s'")),
    ("int-for-string", edited(name=5), "name", ("expected a non-empty string", "got 5")),
    ("bad-sweep-name", edited(name="../x"), "name", ("letters, digits", "'../x'")),
    ("zip-as-mapping", edited(zip={"tokens": [1]}), "zip", ("list of", "write zip: [")),
    ("where-not-string", edited(where={"tokens": 1}), "where", ("expected an expression",)),
    ("variants-not-list", edited(variants="persistent, shipped"), "variants",
     ("expected a list of variants", COUNT_VARIANTS)),
    # --- empty things
    ("empty-axis-list", edited(axes={"tokens": [], "block_size": [64]}), "axes.tokens",
     ("non-empty list", "empty list")),
    ("axes-nothing", base_plus("fixed: {tokens: 1, buffer_tokens: 8}\naxes:\n"), "axes",
     ("got nothing", "delete the key")),
    ("quick-nothing", edited() + "quick:\n", "quick", ("got nothing",)),
    ("variants-empty", edited(variants=[]), "variants", ("at least one variant", COUNT_VARIANTS)),
    ("variant-params-nothing", edited(variants=[{"variant": "persistent", "params": None}]),
     "variants[0].params", ("got nothing",)),
    # --- values out of range
    ("block-size-not-pow2", edited(axes={"block_size": [64, 128, 96], "tokens": [1]}), "axes.block_size[2]",
     ("must be a power of two", "96")),
    ("negative-tokens", edited(axes={"tokens": [-1]}), "axes.tokens[0]", ("must be >= 0", "-1")),
    ("huge-integer", edited(fixed={"buffer_tokens": 10**30}), "fixed.buffer_tokens", ("64-bit",)),
    ("enormous-integer", edited(fixed={"buffer_tokens": 10**400}), "fixed.buffer_tokens", ("401-digit",)),
    ("huge-int-for-float", edited(fixed={"buffer_tokens": 512, "zipf_s": 10**30}), "fixed.zipf_s",
     ("sensible size",)),
    ("nan", edited(fixed={"buffer_tokens": 512, "zipf_s": float("nan")}), "fixed.zipf_s", ("finite",)),
    ("negative-seed", edited(seed=-1), "seed", ("non-negative integer", "-1")),
    ("repeated-axis-value", edited(axes={"tokens": [1, 1]}), "axes.tokens", ("repeated values",)),
    ("bad-l2-mode", edited(timing={"l2": "hot"}), "timing.l2", ("warm, cold", "'hot'")),
    ("timing-out-of-range", edited(timing={"warmup": -1}), "timing.warmup", ("between 0 and",)),
    ("max-replays-below-min", edited(timing={"min_replays": 100, "max_replays": 50}), "timing.max_replays",
     (">= min_replays (100)", "50")),
    # --- unknown names: the message lists the valid ones
    ("unknown-family", edited(family="cnt"), "family", ("unknown family 'cnt'", "known: ", "count")),
    ("unknown-variant", edited(variants=["persistent", "persistant"]), "variants[1].variant",
     ("unknown variant 'persistant'", COUNT_VARIANTS)),
    ("unknown-model", edited(model="qwen3"), "model", ("unknown model config 'qwen3'", "qwen3-30b-a3b")),
    ("model-path", edited(model="../configs/qwen3-30b-a3b"), "model", ("model config name", "known:")),
    ("unknown-routing", edited(fixed={"buffer_tokens": 512, "routing": "pareto"}), "fixed.routing",
     ("expected one of uniform, zipf", "'pareto'")),
    ("unknown-pivot-param", edited(pivot={"rows": "tokns"}), "pivot.rows", ("'tokns'", "did you mean 'tokens'")),
    ("baseline-unknown-variant", edited(baseline={"variant": "fast"}), "baseline.variant",
     ("unknown variant 'fast'", "persistent")),
    # --- baseline
    ("baseline-no-variant", edited(baseline={"block_size": 64}), "baseline.variant", ("missing",)),
    ("baseline-shape-param", edited(baseline={"variant": "persistent", "tokens": 5}), "baseline.tokens",
     ("only launch parameters", "block_size, num_warps, grid")),
    ("baseline-param-variant-ignores", edited(baseline={"variant": "shipped", "block_size": 64}),
     "baseline.block_size", ("only launch parameters of 'shipped'",)),
    # --- contradictions and expansion
    ("tokens-over-buffer", edited(fixed={"buffer_tokens": 128}), "axes",
     ("must not exceed the buffer capacity", "tokens=256", "add a where: filter", "tokens <= buffer_tokens")),
    ("where-removes-all", edited(where="tokens > 100000"), "where", ("0 cases", "tokens > 100000")),
    ("where-syntax", edited(where="tokens <= = 3"), "where", ("not a valid expression",)),
    ("where-unknown-name", edited(where="tokns > 3"), "where", ("unknown name 'tokns'", "known:")),
    ("where-function-call", edited(where="__import__('os').getpid() > 0"), "where",
     ("only min(...) and max(...)",)),
    ("where-attribute", edited(where="tokens.real > 0"), "where", ("unsupported syntax Attribute",)),
    ("where-string-vs-number", edited(where="routing > 3"), "where", ("cannot order 'routing' (string)",)),
    ("where-string-arithmetic", edited(where="routing * 1000000000000 == ''"), "where", ("needs numbers",)),
    ("where-division-by-zero", edited(where="tokens // (block_size - 64) >= 0"), "where",
     ("cannot be evaluated", "block_size=64", "by zero")),
    ("where-unary-minus-string", edited(where="-routing < 0"), "where", ("unary '-' needs a number",)),
    ("where-min-mixed", edited(where="min(routing, 1) == 1"), "where", ("mixes strings and numbers",)),
    ("where-none", edited(where="tokens != None"), "where", ("unsupported constant None",)),
    ("where-bare-function", edited(where="max"), "where", ("is a function",)),
    ("where-list-item", edited(where=["tokens > 0", "bogus >"]), "where[1]", ("not a valid expression",)),
    ("where-min-one-arg", edited(where="min(tokens) > 0"), "where", ("at least two arguments",)),
    ("where-too-long", edited(where=" + ".join(["tokens"] * 300) + " > 0"), "where", ("too long",)),
    ("over-max-cases", edited(max_cases=3), "axes", ("up to 4 cases", "max_cases=3", "--force")),
    ("no-value", edited(model=DROP), "fixed", ("'topk' has no value", "model config")),
    ("verify-where-removes-all", edited(verify={"axes": {"seed": [0, 1], "tokens": [1]}, "where": "seed > 5"}),
     "verify.where", ("0 cases",)),
    ("verify-bad-value", edited(verify={"axes": {"block_size": [100]}}), "verify.axes.block_size[0]",
     ("power of two",)),
    # --- zip groups
    ("zip-unequal", edited(axes={"block_size": [64]}, zip=[{"tokens": [1, 2, 3], "buffer_tokens": [8, 16]}],
                           fixed=DROP), "zip[0]", ("equal lengths", "tokens has 3", "buffer_tokens has 2")),
    ("zip-repeated-entry", edited(axes={"block_size": [64]}, fixed=DROP,
                                  zip=[{"tokens": [1, 1], "buffer_tokens": [8, 8]}]), "zip[0]",
     ("entry 1 repeats", "once")),
    ("zip-empty-group", edited(zip=[{}]), "zip[0]", ("at least one parameter",)),
    ("quick-splits-zip", edited(axes={"block_size": [64]}, fixed=DROP,
                                zip=[{"tokens": [1, 2], "buffer_tokens": [8, 16]}],
                                quick={"fixed": {"tokens": 1}}), "quick.fixed.tokens",
     ("zipped with buffer_tokens", "set buffer_tokens here too")),
    ("variant-axis-in-zip", edited(axes=DROP, fixed=DROP, zip=[{"tokens": [1, 2], "buffer_tokens": [8, 16]}],
                                   variants=[{"variant": "persistent", "axes": {"tokens": [1, 4]}}]),
     "variants[0].axes.tokens", ("zip group",)),
    # --- a parameter set twice
    ("param-in-axes-and-fixed", edited(fixed={"buffer_tokens": 512, "tokens": 5}), "fixed.tokens",
     ("also set in axes",)),
    ("param-in-axes-and-zip", edited(zip=[{"tokens": [1, 2], "buffer_tokens": [8, 16]}], fixed=DROP),
     "zip[0].tokens", ("also set in axes",)),
    ("param-in-two-zips", edited(axes={"block_size": [64]}, fixed=DROP,
                                 zip=[{"tokens": [1], "buffer_tokens": [8]}, {"tokens": [2]}]),
     "zip[1].tokens", ("also set in zip[0]",)),
    ("quick-param-twice", edited(quick={"axes": {"tokens": [1]}, "fixed": {"tokens": 2}}), "quick.fixed.tokens",
     ("also set in quick.axes",)),
    ("variant-param-twice", edited(variants=[{"variant": "persistent", "params": {"block_size": 64},
                                              "axes": {"block_size": [64, 128]}}]),
     "variants[0].axes.block_size", ("also set in variants[0].params",)),
    # --- launch parameters and variants
    ("variant-ignores-param", edited(variants=[{"variant": "shipped", "params": {"block_size": 64}}]),
     "variants[0].params.block_size", ("'shipped' does not take 'block_size'", "num_warps, grid")),
    ("variant-ignores-axis", edited(variants=["persistent", {"variant": "nonpersistent", "axes": {"grid": [1]}}]),
     "variants[1].axes.grid", ("does not take 'grid'",)),
    ("no-variant-takes-param", edited(variants=["shipped"]), "axes.block_size",
     ("no variant here takes 'block_size'", TAKES_BLOCK_SIZE)),
    ("label-twice", edited(variants=["persistent", {"variant": "persistent"}]), "variants[1].label",
     ("used twice",)),
    # --- control characters stay escaped on the one line
    ("newline-in-key", base_plus('axes: {"tok\\nens": [1]}\n'), "axes.tok\\nens", ("unknown parameter",)),
]


@pytest.mark.parametrize("text,key,expect", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_spec_is_one_clear_line(tmp_path, monkeypatch, capsys, text, key, expect):
    f = tmp_path / "bad.yaml"
    f.write_text(text, encoding="utf-8")
    code, out, err = cli_run(monkeypatch, capsys, "validate", str(f))
    assert_one_line_error(code, out, err, str(f), key, expect)


def test_validate_checks_every_spec_it_is_given(tmp_path, monkeypatch, capsys):
    """One bad spec no longer hides the ones after it: each gets its line, and the exit is 2."""
    bad1, bad2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bad1.write_text(BAD[0][1], encoding="utf-8")
    bad2.write_text(BAD[1][1], encoding="utf-8")
    code, out, err = cli_run(monkeypatch, capsys, "validate", str(bad1), str(bad2), "count-block")
    assert code == 2 and "Traceback" not in err
    assert [line.startswith(f"error: {f}") for line, f in zip(err.strip().splitlines(), (bad1, bad2))] == [True, True]
    assert "count-block.yaml: ok" in out


def test_table_is_large_enough():
    assert len(BAD) >= 25
    assert len({b[0] for b in BAD}) == len(BAD)


# ------------------------------------------------------------------------------- files


def test_missing_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "nope.yaml"
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(f), "", ("no such file",))


def test_directory(tmp_path, monkeypatch, capsys):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(d)), str(d), "", ("is a directory",))


def test_not_utf8(tmp_path, monkeypatch, capsys):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(edited().encode() + "description: caf\u00e9\n".encode("latin-1"))
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(f), "",
                          ("not UTF-8", "offset"))


def test_binary_garbage(tmp_path, monkeypatch, capsys):
    f = tmp_path / "garbage.yaml"
    f.write_bytes(bytes(range(256)))
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(f), "", ("not UTF-8",))


def test_not_a_regular_file(monkeypatch, capsys):
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", "/dev/null"), "/dev/null", "",
                          ("not a regular file",))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "locked.yaml"
    f.write_text(edited())
    f.chmod(0)
    try:
        assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(f), "",
                              ("cannot read", "ermission"))
    finally:
        f.chmod(0o644)


def test_too_large(tmp_path, monkeypatch, capsys):
    f = tmp_path / "huge.yaml"
    f.write_text(edited() + "#" * (5 * 2**20) + "\n")
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(f), "", ("too large",))


def test_bad_model_config(tmp_path, monkeypatch, capsys):
    """A spec next to its own configs/ directory: errors in the model file name the model file."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "sweeps").mkdir()
    cfg = tmp_path / "configs" / "tiny.yaml"
    cfg.write_text("num_experts: 8\ntopk: 2\nlocal_experts: 8\nexperts: 4\n")
    f = tmp_path / "sweeps" / "s.yaml"
    f.write_text(edited(model="tiny"))
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(cfg), "experts",
                          ("unknown model key", "num_experts, topk"))
    cfg.write_text("num_experts: 8\ntopk: two\n")
    assert_one_line_error(*cli_run(monkeypatch, capsys, "validate", str(f)), str(cfg), "topk",
                          ("positive integer", "'two'"))


def test_unknown_sweep_name_lists_builtins(monkeypatch, capsys):
    code, out, err = cli_run(monkeypatch, capsys, "sweep", "NOSUCHNAME")
    assert_one_line_error(code, out, err, "sweeps/NOSUCHNAME.yaml", "",
                          ("no such sweep", "built-in sweeps:", "count-block"))


def test_unknown_sweep_name_suggests_the_close_one(monkeypatch, capsys):
    code, out, err = cli_run(monkeypatch, capsys, "validate", "count-blocks")
    assert_one_line_error(code, out, err, "sweeps/count-blocks.yaml", "", ("did you mean 'count-block'",))


def test_force_lets_a_big_product_through(tmp_path, monkeypatch, capsys):
    f = tmp_path / "big.yaml"
    f.write_text(edited(max_cases=3))
    code, out, err = cli_run(monkeypatch, capsys, "sweep", str(f), "--dry-run")
    assert_one_line_error(code, out, err, str(f), "axes", ("max_cases=3", "--force"))
    code, out, err = cli_run(monkeypatch, capsys, "sweep", str(f), "--dry-run", "--force")
    assert code == 0, err
    assert "4 cases" in out
    assert "Traceback" not in out + err


def test_quick_max_cases_names_the_quick_level(tmp_path, monkeypatch, capsys):
    f = tmp_path / "q.yaml"
    f.write_text(edited(max_cases=4, quick={"axes": {"block_size": [16, 32, 64], "tokens": [1, 2]}}))
    code, out, err = cli_run(monkeypatch, capsys, "sweep", str(f), "--dry-run", "--quick")
    assert_one_line_error(code, out, err, str(f), "quick.axes", ("up to 6 cases",))


def test_verbose_shows_the_traceback(tmp_path, monkeypatch, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(edited(family="cnt"))
    code, out, err = cli_run(monkeypatch, capsys, "-v", "validate", str(f))
    assert code == 2
    assert "Traceback" in err and "unknown family 'cnt'" in err


def test_real_entry_point_subprocess(tmp_path):
    """One run through `python -m moebench`, as a user would: nothing in process to hide behind."""
    f = tmp_path / "bad.yaml"
    f.write_text(edited(axes={"block_size": [64, 128, 96], "tokens": [1]}))
    env = {**os.environ, "COLUMNS": "2000"}
    p = subprocess.run([sys.executable, "-m", "moebench", "validate", str(f)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert_one_line_error(p.returncode, p.stdout, p.stderr, str(f), "axes.block_size[2]",
                          ("must be a power of two, got 96",))


def test_long_error_stays_one_line_at_narrow_width(tmp_path, monkeypatch, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(edited(fixed={"buffer_tokens": 128}))
    monkeypatch.setattr(sys, "argv", ["moebench", "validate", str(f)])
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit):
        cli.main()
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_spec_error_escapes_control_characters():
    e = SpecError("a\nb.yaml", "axes.x\ry", "bad\x1b[31m value")
    assert "\n" not in str(e) and "\r" not in str(e) and "\x1b" not in str(e)
    assert str(e) == "a\\nb.yaml: axes.x\\ry: bad\\x1b[31m value"


def test_every_mistake_of_a_spec_is_reported_at_once(tmp_path, monkeypatch, capsys):
    """Three mistakes in three places (a timing key, an axis value, the seed) and an unknown key:
    one `validate` names all four, one line each, exit 2; none follows from another."""
    text = edited(seed=-1, axes={"block_size": [64, 96], "tokens": [1, 256]}, timing={"warmup": "x"},
                  colour="red")
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    code, out, err = cli_run(monkeypatch, capsys, "validate", str(f))
    lines = err.splitlines()
    assert code == 2 and "Traceback" not in err and len(lines) == 4, lines
    assert all(line.startswith(f"error: {f}: ") for line in lines), lines
    for key in ("colour: unknown key", "seed: expected a non-negative", "axes.block_size[1]:", "timing.warmup:"):
        assert any(key in line for line in lines), (key, lines)


def test_no_verify_matrix(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(edited())
    with pytest.raises(SpecError, match="no verify matrix"):
        expand(load_spec(str(f)), verify=True)


# ------------------------------------------------------------------------------- property

FAMILY = COUNT
PARAMS = sorted(FAMILY.params)
NAMES = sorted(set(TOP_KEYS) | set(MATRIX_KEYS) | set(TIMING_KEYS) | set(FAMILY.params) | set(FAMILY.variants)
               | {"quick", "variant", "label", "params", "rows", "cols", "metric", "count", "qwen3-30b-a3b"})
WORDS = ["tokens <= buffer_tokens", "tokens > 3", "routing == 'zipf'", "min(tokens, 4) >= 0", "uniform",
         "zipf", "warm", "cold", "1/0", "block_size // grid", "", " ", "\n", "null"]

scalars = (st.none() | st.booleans()
           | st.sampled_from([0, 1, 2, 3, 7, 64, 96, 128, 512, 1024, 16384, -1, 2**63, 10**30])
           | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from(NAMES + WORDS) | st.text(max_size=8))
keys = st.sampled_from(NAMES) | st.text(max_size=6) | st.integers(-2, 2)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=20)
# near-valid documents reach deep into the loader; fully random ones hit the top-level checks
near_valid = st.builds(lambda base, extra, drop: {k: v for k, v in {**base, **extra}.items() if k not in drop},
                       st.just(BASE), st.dictionaries(st.sampled_from(sorted(TOP_KEYS)), values, max_size=4),
                       st.sets(st.sampled_from(sorted(TOP_KEYS)), max_size=2))
# well-formed shapes with plausible values: these get through loading and into expansion
PLAUSIBLE = {"tokens": [0, 1, 7, 256], "buffer_tokens": [256, 512, 16384], "topk": [1, 8], "num_experts": [8, 128],
             "local_experts": [4, 32], "local_expert_start": [0, 4], "routing": ["uniform", "zipf"],
             "zipf_s": [0.5, 1.2], "seed": [0, 1], "block_size": [64, 128, 1024], "num_warps": [4, 8],
             "grid": [0, 16]}
odd = st.sampled_from([-1, 0, 96, 128.0, True, None, "uniform", 2**64, 1e400, [1]])


def value_of(name: str):
    return st.sampled_from(PLAUSIBLE.get(name, [0])) | st.sampled_from(PLAUSIBLE.get(name, [1])) | odd


def params_like(many: bool):
    def one(name):
        v = value_of(name)
        return st.tuples(st.just(name), st.lists(v, min_size=1, max_size=3) | v if many else v)
    return st.lists(st.sampled_from(sorted(FAMILY.params)).flatmap(one), max_size=3).map(dict)


axes_like, fixed_like = params_like(True), params_like(False)
where_like = st.sampled_from(WORDS) | st.lists(st.sampled_from(WORDS), max_size=2)
variant_like = st.sampled_from(sorted(FAMILY.variants)) | st.fixed_dictionaries(
    {"variant": st.sampled_from(sorted(FAMILY.variants))},
    optional={"label": st.sampled_from(["a", "b"]), "params": fixed_like, "axes": axes_like})
matrix_keys = {"axes": axes_like, "fixed": fixed_like, "where": where_like,
               "zip": st.lists(axes_like, max_size=2), "variants": st.lists(variant_like, min_size=1, max_size=3)}
matrix_like = st.fixed_dictionaries({}, optional=matrix_keys)
structured = st.builds(
    lambda m, extra: {**{k: BASE[k] for k in ("name", "family", "model", "baseline", "variants")},
                      "fixed": {"buffer_tokens": 512, "tokens": 7}, **m, **extra},
    matrix_like,
    st.fixed_dictionaries({}, optional={
        "quick": matrix_like,
        "verify": st.builds(lambda m, q: {**m, **({"quick": q} if q is not None else {})}, matrix_like,
                            st.none() | matrix_like),
        "baseline": fixed_like.map(lambda d: {"variant": "persistent", **d}),
        "timing": st.dictionaries(st.sampled_from(sorted(TIMING_KEYS)), st.sampled_from([1, 50, 0.5, "cold"]) | odd,
                                  max_size=2),
        "pivot": st.dictionaries(st.sampled_from(["rows", "cols", "metric"]), st.sampled_from(PARAMS + ["x"])),
        "max_cases": st.integers(1, 200), "seed": st.integers(0, 3)}))
documents = structured | near_valid | st.dictionaries(keys, values, max_size=6) | values


def _load_and_expand(f: Path) -> None:
    try:
        spec = load_spec(str(f))
        for quick in (False, True):
            varying_params(expand(spec, quick=quick))
            if spec.verify is not None:
                expand(spec, quick=quick, verify=True)
    except MoebenchError:
        pass


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents)
def test_random_documents_fail_only_with_spec_errors(scratch, doc):
    f = scratch / "doc.yaml"
    try:
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
    except yaml.YAMLError:  # something PyYAML itself cannot write: not our input to judge
        return
    _load_and_expand(f)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_random_bytes_fail_only_with_spec_errors(scratch, data):
    f = scratch / "raw.yaml"
    f.write_bytes(data)
    _load_and_expand(f)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("{}[]:-,&*!|>'\"#%@` \n\t?0123456789abtokens_.")),
                    max_size=200))
def test_random_yaml_punctuation_fails_only_with_spec_errors(scratch, text):
    f = scratch / "punct.yaml"
    f.write_text(edited() + text)
    _load_and_expand(f)
