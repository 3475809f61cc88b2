"""Nothing replaced without --force, and nothing kept that no longer holds: plot's default output,
a page of other content, another spec of the same name, a plugin edited between runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
DEV = "cpu-interpreter"


def moebench(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("MOEBENCH_PLUGINS",)}
    env.update(TRITON_INTERPRET="1", COLUMNS="200", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "moebench", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


def test_editing_a_plugin_reruns_its_cases_and_only_those(tmp_path):
    plug = tmp_path / "count_histogram.py"
    shutil.copy(EXAMPLES / "count_histogram.py", plug)
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nfamily: count\nmodel: qwen3-30b-a3b\nplugins: [count_histogram.py]\n"
                    "variants: [persistent, histogram]\nbaseline: {variant: persistent, block_size: 64}\n"
                    "axes: {tokens: [0, 30]}\nfixed: {buffer_tokens: 32, block_size: 64}\n")
    out = tmp_path / "r"
    r = moebench("sweep", spec, "--out", out)
    assert r.returncode == 0, r.stderr
    r = moebench("sweep", spec, "--out", out, "--resume")
    assert r.returncode == 0 and "kept 4 of 4" in r.stderr, r.stderr
    plug.write_text(plug.read_text() + "\n# edited: the kernel may differ now\n")
    r = moebench("sweep", spec, "--out", out, "--resume")
    assert r.returncode == 0, r.stderr
    assert "kept 2 of 4" in r.stderr and "code.variants.histogram" in r.stderr, r.stderr
