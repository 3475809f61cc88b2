"""`python -m moebench ARGS` as a real child process, started warm.

A CLI test that needs a process of its own (an exit status from os._exit, a segfault, files left as a
killed process leaves them) pays for a fresh interpreter and its torch import: about 2 s of a CPU
core each, most of the suite's time. Here the child is forked from a server process that imported
torch and triton once (multiprocessing's forkserver); it then takes the test's environment, working
folder and arguments, imports moebench afresh (the server holds none of it, so TRITON_INTERPRET and
every MOEBENCH_ variable are read as a fresh process reads them) and runs `moebench/__main__.py` as
`python -m` does. What comes back is what `subprocess.run(..., capture_output=True, text=True)`
gives. A second server, which never imports torch or triton, runs the commands that must work where
they cannot be imported (`blocked=True`: its child finds both blocked). Tests that are about the
start-up itself (the imports, the relaunch under .venv, signals under -X importtime) keep a fresh
interpreter.

Nothing of moebench is imported here at module level: the child imports this module to find `_child`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from multiprocessing import context as _mpc, forkserver as _fs, popen_forkserver as _pf

# What each server imports once: `moebench` commands, and the commands that must run where torch and
# triton cannot be imported (a child of that server finds them blocked, as tests/cli/test_readers.py
# blocks them in a fresh interpreter).
WARM = ("torch", "triton", "numpy", "yaml", "typer", "rich", "pandas")
TORCH_FREE = ("numpy", "yaml", "typer", "rich", "pandas")
_SERVERS: dict = {}


def _server(preload):
    """The forkserver of this process that imported `preload` (the forkserver module keeps one
    server per process; this keeps one per list)."""
    if preload not in _SERVERS:
        _SERVERS[preload] = _fs.ForkServer()
        _SERVERS[preload].set_forkserver_preload(list(preload))
    return _SERVERS[preload]


class _Launch(_pf.Popen):
    """multiprocessing's forkserver launch, asking the server of the process's own preload list."""

    def _launch(self, process_obj):
        shared = _fs.connect_to_new_process
        _fs.connect_to_new_process = _server(process_obj.PRELOAD).connect_to_new_process
        try:
            super()._launch(process_obj)
        finally:
            _fs.connect_to_new_process = shared


class _Warm(_mpc.ForkServerProcess):
    PRELOAD = WARM

    @staticmethod
    def _Popen(process_obj):
        return _Launch(process_obj)


class _TorchFree(_Warm):
    PRELOAD = TORCH_FREE


def _child(args, env, cwd, stdin_path, out_path, err_path, blocked=False):
    """In the forked child: become `python -m moebench ARGS` in `cwd` with exactly `env` (`blocked`:
    with torch and triton unimportable)."""
    import atexit
    import runpy

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, flags in ((0, stdin_path, os.O_RDONLY), (1, out_path, os.O_WRONLY), (2, err_path, os.O_WRONLY)):
        f = os.open(path, flags)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.path.insert(0, cwd)  # what `python -m` puts first
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    code = 0
    try:
        if blocked:
            sys.modules["torch"] = None
            sys.modules["triton"] = None
            sys.argv = ["moebench", *args]
            from moebench.cli import main

            main()
        else:
            import importlib.util

            sys.argv = [os.path.join(os.path.dirname(importlib.util.find_spec("moebench").origin), "__main__.py"),
                        *args]
            runpy.run_module("moebench", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter prints and the status it exits with
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


class Popen:
    """`subprocess.Popen([sys.executable, "-m", "moebench", *args], cwd=cwd, env=env, stdout=PIPE,
    stderr=PIPE, text=text)` from the warm server: the output is kept in files until the child ends,
    so `communicate` returns it then (a test reads the results files, not the pipe, while it runs)."""

    def __init__(self, args, *, cwd, env=None, text=True, input=None, blocked=False):
        self.args = [sys.executable, "-m", "moebench", *map(str, args)]
        self.text, self.returncode, self._tmp = text, None, tempfile.TemporaryDirectory(prefix="moebench-warm-")
        self._paths = [os.path.join(self._tmp.name, n) for n in ("in", "out", "err")]
        with open(self._paths[0], "w", encoding="utf-8") as f:
            f.write(input or "")
        for p in self._paths[1:]:
            open(p, "w").close()
        env = dict(os.environ if env is None else env)
        self._proc = (_TorchFree if blocked else _Warm)(target=_child, args=(self.args[3:], env, str(cwd), *self._paths, blocked))
        self._proc.start()
        self.pid = self._proc.pid

    def poll(self):
        if self.returncode is None and not self._proc.is_alive():
            self._proc.join()
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._proc.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        if self.poll() is None:
            self._proc.kill()

    def communicate(self, timeout=None):
        self.wait(timeout)
        got = []
        for p in self._paths[1:]:
            with open(p, "rb") as f:
                data = f.read()
            got.append(data.decode("utf-8", errors="replace") if self.text else data)
        self._tmp.cleanup()
        return tuple(got)


def run(args, *, cwd, env=None, timeout=None, input=None, blocked=False) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, "-m", "moebench", *args], cwd=cwd, env=env, input=input,
    capture_output=True, text=True, timeout=timeout)`, from a warm server (`blocked`: the one whose
    children cannot import torch or triton)."""
    proc = Popen(args, cwd=cwd, env=env, input=input, blocked=blocked)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
