"""Your own kernel from a file: the shipped examples end to end under the interpreter, the three
ways in (--plugin, a spec's plugins:, an entry point), and the errors a user can make."""

import json
import os
from pathlib import Path

import pytest
import warm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"


def moebench(*args, cwd=ROOT, env_extra=None, timeout=None):
    env = {k: v for k, v in os.environ.items() if k != "MOEBENCH_PLUGINS"}
    env.update(TRITON_INTERPRET="1", COLUMNS="200", **(env_extra or {}))
    return warm.run(args, cwd=cwd, env=env, timeout=timeout)


def records(out: Path, stem: str) -> tuple[dict, list]:
    doc = json.loads(next(out.rglob(f"{stem}.json")).read_text())
    return doc["provenance"], doc["records"]


@pytest.mark.parametrize("spec,stem,n", [("count-histogram.yaml", "count-histogram-quick", 9),
                                         ("offsets.yaml", "offsets-quick", 4)])
def test_examples_run_end_to_end(tmp_path, spec, stem, n):
    r = moebench("sweep", EXAMPLES / spec, "--quick", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{n}/{n} exact" in r.stdout and "ref_check" in r.stdout  # the verdict and the table
    prov, recs = records(tmp_path, stem)
    assert len(recs) == n and all(x["status"] == "ok" and x["checks"]["baseline_equal"] for x in recs)
    assert prov["plugins"] and prov["plugins"][0]["path"].endswith(".py") and len(prov["plugins"][0]["sha256"]) == 64
    if spec == "count-histogram.yaml":
        hist = [x for x in recs if x["variant"] == "histogram"]
        assert hist and any(x["checks"]["counts_sum"] > 0 for x in hist)
    else:
        assert any(x["checks"]["rows_total"] > 0 for x in recs)


def test_plugin_option_and_verify(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nvariants: [histogram]\n"
                    "baseline: {variant: persistent, block_size: 1024}\naxes: {tokens: [0, 30]}\n"
                    "fixed: {buffer_tokens: 32, block_size: 64}\n")
    r = moebench("sweep", spec, "--out", tmp_path)
    assert r.returncode == 2 and "unknown variant 'histogram'" in r.stderr and "Traceback" not in r.stderr
    r = moebench("sweep", spec, "--out", tmp_path, "--plugin", EXAMPLES / "count_histogram.py")
    assert r.returncode == 0, r.stderr
    _, recs = records(tmp_path, "s")
    assert [x["status"] for x in recs] == ["ok", "ok"]
    r = moebench("validate", spec, "--plugin", EXAMPLES / "count_histogram.py")
    assert r.returncode == 0 and "ok" in r.stdout


@pytest.mark.parametrize("body,msg", [
    (None, "no such file"),
    ("def broken(:\n", "bad.py:1: SyntaxError"),
    ("import moebench_no_such_module\n", "bad.py:1: ModuleNotFoundError"),
    ("from moebench.families import get_family\nget_family('count').variant('strided', doc='x')(print)\n",
     "registered twice"),
    ("from moebench.families import FamilySpec, register_family\n"
     "register_family(FamilySpec(name='nope', doc='', params={}, kernels=__name__))\n", None),
    ("import sys\nsys.exit(5)\n", "bad.py:2: the plugin called sys.exit(5) while loading"),
    ("raise SystemExit\n", "bad.py:1: the plugin called sys.exit(None) while loading"),
    ("from moebench.families import get_family\n\n@get_family('count').variant('mine', doc='x', params=('grid',))\n"
     "def build_mine(inp, params):\n    pass\n",
     "bad.py:3: TypeError: variant 'mine' of 'count': its builder build_mine(inp, params) cannot be called as "
     "fn(inputs, params, device)"),
    ("from moebench.families import get_family\nget_family('count').variant('mine', doc='x', work=3)(print)\n",
     "bad.py:2: TypeError: variant 'mine' of 'count': work= must be a function"),
])
def test_plugin_errors_are_one_line(tmp_path, body, msg):
    bad = tmp_path / "bad.py"
    if body is not None:
        bad.write_text(body)
    if msg is None:  # a family whose module lacks the kernel API fails when it runs, naming what is missing
        spec = tmp_path / "s.yaml"
        spec.write_text("name: s\nfamily: nope\nplugins: [bad.py]\nvariants: []\n")
        r = moebench("validate", spec)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        return
    r = moebench("list", "--plugin", bad)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_validate_catches_what_would_fail_every_case_and_does_not_hang(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nvariants: [persistent]\n"
                    "baseline: {variant: persistent, block_size: 1024}\naxes: {tokens: [0, 30]}\n"
                    "fixed: {buffer_tokens: 32, block_size: 64}\n")
    wrong = tmp_path / "wrong.py"  # a builder without `device`: every case would fail at run time
    wrong.write_text((EXAMPLES / "count_histogram.py").read_text().replace(
        "def build_histogram(inp, params, device) -> Built:", "def build_histogram(inp, params) -> Built:"))
    r = moebench("validate", spec, "--plugin", wrong, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    line = 1 + wrong.read_text()[:wrong.read_text().index("@COUNT.variant")].count("\n")
    assert f"wrong.py:{line}: TypeError: variant 'histogram' of 'count': its builder build_histogram(inp, params)" \
        in r.stderr
    loop = tmp_path / "loop.py"
    loop.write_text("n = 0\nwhile True:\n    n += 1\n")
    r = moebench("validate", spec, "--plugin", loop, env_extra={"MOEBENCH_PLUGIN_LIMIT": "1"}, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "loop.py:" in r.stderr and "still running after 1 s while loading" in r.stderr
    r = moebench("validate", spec, "--plugin", loop, env_extra={"MOEBENCH_PLUGIN_LIMIT": "soon"}, timeout=120)
    assert r.returncode == 2 and "$MOEBENCH_PLUGIN_LIMIT='soon': expected a number of seconds" in r.stderr


def test_a_broken_installed_plugin_breaks_only_itself(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.exit(5)\n")
    env = {"MOEBENCH_PLUGINS": str(bad)}
    r = moebench("list", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "persistent" in r.stdout and "BROKEN" in r.stdout and "bad.py:2: the plugin called sys.exit(5)" in r.stdout
    r = moebench("validate", "sweeps/count-block.yaml", env_extra=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("fails_at", [9, 5])  # after registering a family and a variant, or before the variant
def test_an_installed_plugin_that_fails_while_loading_registers_nothing_and_is_named(tmp_path, fails_at):
    """Before: what the file registered before it raised stayed (a spec ran the half-loaded variant),
    and a spec naming a variant it never reached was told to pass --plugin, not why it is missing."""
    lines = ["from moebench.families import FamilySpec, Param, get_family, register_family",
             "register_family(FamilySpec(name='half_fam', doc='', kernels=__name__,",
             "    params={'n': Param('n', int), 'w': Param('w', int, default=1, role='launch')}))",
             "COUNT = get_family('count')",
             "@COUNT.variant('half_loaded', params=('block_size',), doc='half')",
             "def build(inp, params, device):",
             "    return None",
             ""]
    lines.insert(fails_at - 1, "raise ImportError('needs foo')")
    bad = tmp_path / "half.py"
    bad.write_text("\n".join(lines))
    env = {"MOEBENCH_PLUGINS": str(bad)}
    says = f"an installed plugin failed to load, and may be what registers it: $MOEBENCH_PLUGINS: {bad}:{fails_at}: " \
        "ImportError: needs foo"
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nvariants: [persistent, half_loaded]\n"
                    "baseline: {variant: persistent, block_size: 1024}\naxes: {tokens: [7]}\n"
                    "fixed: {buffer_tokens: 64}\n")
    for args in (("validate", spec), ("sweep", spec, "--out", tmp_path / "o")):
        r = moebench(*args, env_extra=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "variants[1].variant: unknown variant 'half_loaded'" in r.stderr and says in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    fam = tmp_path / "f.yaml"
    fam.write_text("name: f\nfamily: half_fam\nvariants: [v]\n")
    r = moebench("validate", fam, env_extra=env)
    assert r.returncode == 2 and "family: unknown family 'half_fam'" in r.stderr and says in r.stderr
    r = moebench("list", env_extra=env)
    assert r.returncode == 0 and "BROKEN" in r.stdout and "half_loaded" not in r.stdout and "half_fam" not in r.stdout


def test_a_plugin_variant_brings_its_own_work_model_or_the_page_says_it_borrows_the_familys(tmp_path):
    """The issue's case: programs that each read every pair. With its own model the record says so;
    without one the page says its floors are the family's."""
    plug = tmp_path / "hist.py"
    plug.write_text((EXAMPLES / "count_histogram.py").read_text() + """

def read_all_work(params, geometry, device):
    pairs = params["tokens"] * params["topk"]
    return {"bytes": geometry["grid"] * pairs * 4 + 4 + params["local_experts"] * 8, "ctas": geometry["grid"],
            "ctas_with_work": geometry["grid"] if pairs else 0}


COUNT.variant("histogram-own", params=("block_size", "num_warps", "grid"), doc="histogram, own model",
              work=read_all_work)(build_histogram)
""")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nplugins: [hist.py]\n"
                    "variants: [histogram, histogram-own]\nbaseline: {variant: persistent, block_size: 1024}\n"
                    "axes: {tokens: [64]}\nfixed: {buffer_tokens: 64, block_size: 64, grid: 32, num_warps: 4}\n")
    r = moebench("sweep", spec, "--out", tmp_path / "o", "--format", "json,md")
    assert r.returncode == 0, r.stderr
    _, recs = records(tmp_path / "o", "s")
    work = {x["variant"]: x["work"] for x in recs}
    pairs = 64 * recs[0]["params"]["topk"]
    assert work["histogram-own"]["bytes"] == 32 * pairs * 4 + 4 + recs[0]["params"]["local_experts"] * 8
    assert work["histogram-own"]["ctas_with_work"] == 32
    assert work["histogram"]["bytes"] == pairs * 4 + 4 + recs[0]["params"]["local_experts"] * 8  # the family's
    page = next((tmp_path / "o").rglob("s.md")).read_text()
    assert "- Work model: `histogram` (plugin) declares none, so the bytes, CTAs with work and floors" in page and "`histogram-own`" not in page


def test_a_family_module_without_the_kernel_api_is_named(tmp_path):
    plug = tmp_path / "fam.py"
    plug.write_text("from moebench.families import FamilySpec, Param, register_family\n"
                    "F = register_family(FamilySpec(name='thin', doc='', kernels=__name__,\n"
                    "    params={'n': Param('n', int), 'w': Param('w', int, default=1, role='launch')}))\n"
                    "@F.variant('v', doc='', params=('w',))\ndef build(i, p, d): pass\n")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: thin\nplugins: [fam.py]\nvariants: [v]\nbaseline: {variant: v}\n"
                    "axes: {n: [1]}\n")
    r = moebench("sweep", spec, "--out", tmp_path / "o")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not define build_inputs, input_bytes, reference, check, nonvacuity, work" in r.stderr


def test_entry_point_plugins_are_loaded(tmp_path):
    site = tmp_path / "site"
    dist = site / "toyplug-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[moebench.plugins]\nhist = toyplug_hist\n")
    (site / "toyplug_hist.py").write_text((EXAMPLES / "count_histogram.py").read_text())
    r = moebench("list", env_extra={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    assert r.returncode == 0, r.stderr
    assert "histogram" in r.stdout and "entry point hist" in r.stdout


def test_a_plugin_that_imports_a_built_in_kernels_module_while_it_loads(tmp_path):
    """In a fresh process the plugin's `builder(...)` imports count's kernels.py while the plugin
    loads: those variants stay built in (before: 'registered twice (builtin and plugin ...)')."""
    plugin = tmp_path / "wraps.py"
    plugin.write_text("from moebench.families import get_family\n\nCOUNT = get_family('count')\n"
                      "persistent = COUNT.builder('persistent')\n\n\n"
                      "@COUNT.variant('wrapped', params=('block_size', 'num_warps', 'grid'), doc='persistent again')\n"
                      "def build_wrapped(inp, params, device):\n    return persistent(inp, params, device)\n")
    r = moebench("list", "--plugin", plugin)
    assert r.returncode == 0, r.stderr
    assert "wrapped" in r.stdout and "registered twice" not in r.stdout + r.stderr
