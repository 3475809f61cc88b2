"""Signals at any moment of `moebench` (issue 24 item 5): SIGTERM exits 143 and Ctrl-C 130, from
the first line of moebench's own code to the end of the run; never swallowed (the run does not go
on to finish), never a traceback, never an exit 3 from a module an interrupt left half imported."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clirun import long_count_spec

ROOT = Path(__file__).resolve().parents[2]

# 40 cases: under the interpreter the run lasts well past the last delay, so an exit 0 is a signal lost
LONG = long_count_spec("long")

# Where the signal lands, in seconds after moebench's first line ran: the start-up imports (typer,
# rich, pandas), the command's own imports (torch, triton, numpy), the spec, the first cases, the run.
DELAYS = (0.0, 0.01, 0.03, 0.08, 0.15, 0.3, 0.6, 1.0)


def _signal_at(argv, delay: float, sig: int, cwd: Path):
    """Start `argv` (a Python command line), wait until moebench's first line has run, then `delay`
    seconds, send `sig`; (exit code, stderr). The moment is found with -X importtime: the first
    import that completes after moebench.startup's comes after its handlers are in place, so the
    interpreter's own start (site, runpy: before any moebench code, where Python's defaults rule)
    is never what is tested."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    env.pop("MOEBENCH_FAST_EXIT", None)
    p = subprocess.Popen([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    lines, ready = [], threading.Event()

    def drain():
        seen = False
        for line in p.stderr:
            lines.append(line)
            if line.startswith("import time:"):
                if seen:
                    ready.set()
                seen = seen or line.rstrip().endswith("moebench.startup")
        ready.set()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    assert ready.wait(60), "moebench never started"
    time.sleep(delay)
    p.send_signal(sig)
    code = p.wait(timeout=120)
    t.join(10)
    return code, "".join(x for x in lines if not x.startswith("import time:"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_at_any_moment_exits_128_plus_signal(tmp_path, sig):
    spec = tmp_path / "long.yaml"
    spec.write_text(LONG)
    argv = [sys.executable, "-m", "moebench", "sweep", str(spec), "--out", str(tmp_path / "r")]
    for d in DELAYS:
        code, err = _signal_at(argv, d, sig, ROOT)
        assert code == 128 + sig, (d, code, err[-2000:])
        assert "Traceback" not in err and "internal error" not in err, (d, err[-2000:])
        assert "interrupted" in err or "INCOMPLETE" in err, (d, err[-2000:])


def test_the_console_script_exits_143_during_its_imports(tmp_path):
    """The `moebench` script pip writes (`from moebench.cli import entry`): a SIGTERM in the middle of
    importing the command line is exit 143 too."""
    script = tmp_path / "moebench"
    script.write_text("import re\nimport sys\nfrom moebench.cli import entry\nif __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(entry())\n")
    for d in (0.0, 0.02):
        code, err = _signal_at([sys.executable, str(script), "list"], d, signal.SIGTERM, tmp_path)
        assert code == 143 and err.strip() == "interrupted", (d, code, err[-2000:])


def test_only_the_command_takes_over_the_signals():
    from moebench import cli, startup  # noqa: F401 - importing the command line changes no handler here

    assert not startup.is_the_command()
    assert signal.getsignal(signal.SIGTERM) is not startup._exit_on_signal


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_run_loop_is_said_and_keeps_its_code(tmp_path, capsys, monkeypatch, sig):
    """A signal that lands in a command before its run loop (here: while the backend is chosen) is
    raised there; typer turns any KeyboardInterrupt into a silent exit 130, which made SIGTERM 130."""
    from clirun import run_cli, small_count_spec
    from moebench.cli import common, run

    def landed(_interpret):
        common.first_interrupt(sig, None)

    monkeypatch.setattr(run, "select_backend", landed)
    spec = tmp_path / "s.yaml"
    spec.write_text(small_count_spec("s"))
    old = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        code, _, err = run_cli(["sweep", str(spec), "--out", str(tmp_path / "r")], capsys)
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGTERM, old[1])
    assert code == 128 + sig and err.strip() == "interrupted", (code, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupt_that_escapes_main_still_exits_128_plus_signal(monkeypatch, sig):
    # one escaped main's handlers once, on a loaded CI machine: Python printed a traceback and exited 1
    # for Signalled, a KeyboardInterrupt subclass. entry() now leaves as any interrupt does.
    import moebench.cli as cli
    from moebench import startup
    from moebench.cli.common import Signalled

    def escaped():
        raise Signalled(sig) if sig == signal.SIGTERM else KeyboardInterrupt

    def exit_now(signum, message="interrupted"):
        raise SystemExit(128 + signum)

    monkeypatch.setattr(cli, "main", escaped)
    monkeypatch.setattr(startup, "exit_now", exit_now)
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert e.value.code == 128 + sig
