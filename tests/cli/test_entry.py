"""The console entry (`moebench`, `python3 -m moebench`): main, then os._exit once the output is
flushed. The exit code and every line of output are those of the ordinary exit."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args, fast=True, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env["MOEBENCH_FAST_EXIT"] = "1" if fast else "0"
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, **kw)


def test_output_and_code_match_the_ordinary_exit():
    for args in (["-m", "moebench", "list"], ["-m", "moebench", "show", "/nonexistent/results.json"]):
        fast, slow = _run(args), _run(args, fast=False)
        assert fast.returncode == slow.returncode
        assert fast.stdout == slow.stdout and fast.stderr == slow.stderr
    assert fast.returncode == 2 and "no such results file" in fast.stderr


def test_exit_codes_pass_through():
    for raised, code in (("SystemExit(5)", 5), ("SystemExit(None)", 0), ("SystemExit('bad')", 1)):
        p = _run(["-c", "import moebench.cli as c\n"
                        "def boom():\n    print('said', flush=False)\n    raise " + raised + "\n"
                        "c.main = boom\nc.entry()\n"])
        assert p.returncode == code, p.stderr
        assert p.stdout == "said\n"  # buffered output is flushed before leaving
        if code == 1:
            assert p.stderr.strip() == "bad"
