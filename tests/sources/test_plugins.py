"""Your own kernel from a file: the shipped examples end to end under the interpreter, the three
ways in (--plugin, a spec's plugins:, an entry point), and the errors a user can make."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"


def moebench(*args, cwd=ROOT, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "MOEBENCH_PLUGINS"}
    env.update(TRITON_INTERPRET="1", COLUMNS="200", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "moebench", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True)


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
