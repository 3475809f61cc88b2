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


def test_a_closed_pipe_is_the_pipes_signal_not_a_failed_case():
    """`moebench list | head -1` once exited 1, "a case failed" (rich's answer to a closed pipe)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "moebench", "list"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.read(20)
    p.stdout.close()  # the reader goes away with most of the listing unread
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 128 + 13 and "Traceback" not in err, err


def test_v_shows_the_traceback_of_an_internal_error_and_still_exits_3():
    p = _run(["-c", "import moebench.cli as c\nfrom moebench.cli.common import STATE\n"
                    "def boom(**kw):\n    STATE['verbose'] = True  # what -v sets\n    raise RuntimeError('a bug')\n"
                    "c.command = lambda: boom\nc.entry()\n"])
    assert p.returncode == 3 and "Traceback" in p.stderr and "internal error: RuntimeError: a bug" in p.stderr, p.stderr
