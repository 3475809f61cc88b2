"""Run the moebench CLI in process, as the tests do."""

import os
import sys
import time

from moebench import cli, startup


def run_cli(args, capsys):
    """`moebench ARGS` in process. COLUMNS is pinned wide: rich wraps at the console width (80 in a
    pipe), and the one-line messages here should read as one line."""
    old, cols = sys.argv, os.environ.get("COLUMNS")
    sys.argv = ["moebench", *args]
    os.environ["COLUMNS"] = "2000"
    # a new command in this process: its --timings table starts again
    startup.T0, startup.PYTHON_START = time.perf_counter(), None
    startup._ROWS.clear()
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old
        if cols is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = cols
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def small_count_spec(name: str) -> str:
    """A 12-case count sweep (two variants x two blocks x three valid counts) that runs in seconds
    under the interpreter."""
    return f"""
name: {name}
family: count
model: qwen3-30b-a3b
variants: [persistent, nonpersistent]
baseline: {{variant: persistent, block_size: 1024}}
axes:
  block_size: [64, 256]
  tokens: [0, 5, 40]
fixed: {{buffer_tokens: 64}}
"""


def long_count_spec(name: str, seeds: int = 10) -> str:
    """A 4 x `seeds`-case count sweep (seeds x four blocks) that lasts many seconds under the
    interpreter: long enough to be interrupted, or signalled, mid-run."""
    return f"""
name: {name}
family: count
model: qwen3-30b-a3b
variants: [persistent]
baseline: {{variant: persistent, block_size: 1024}}
axes:
  seed: {list(range(seeds))}
  block_size: [32, 64, 128, 256]
fixed: {{buffer_tokens: 256, tokens: 200}}
"""


def interrupt_after(monkeypatch, n: int) -> None:
    """Ctrl-C as the run driver meets it: a KeyboardInterrupt when the (n+1)-th case starts, the same
    path a real SIGINT between cases takes (the run ends with the records finished so far)."""
    from moebench.core.pipeline import CasePipeline

    real = CasePipeline.run_case
    calls = {"n": 0}

    def run_case(self, case):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt
        return real(self, case)

    monkeypatch.setattr(CasePipeline, "run_case", run_case)


# Passes that run on the CPU, for the driver's tests. Module-level classes: the per-GPU workers get
# their passes pickled, and a spawned worker imports them from here (tests/ is on its sys.path).
from moebench.core.passes import Pass  # noqa: E402


class EchoPass(Pass):
    """Per case: which process ran the case, and how many closures it saw."""

    name = "echo"
    cuda_only = False

    def after_case(self, ctx) -> None:
        ctx.record.cross["echo_pid"] = os.getpid()
        ctx.record.cross["echo_builts"] = len(ctx.builts)


class TallyPass(Pass):
    """After all cases: how many records the run has, and whether the pipeline was at hand."""

    name = "tally"
    cuda_only = False
    announce = "tally pass"

    def after_all(self, ctx) -> None:
        for r in ctx.records:
            r.cross["tally"] = len(ctx.records)
            r.cross["tally_here"] = ctx.pipeline is not None


def load_plugin(monkeypatch, path, text: str):
    """Write a plugin file and load it into this process for one test: the variants and passes it
    registers go into copies of the registries that `monkeypatch` puts back afterwards, and
    $MOEBENCH_PLUGINS (which worker processes load on start) names it for this test only."""
    from pathlib import Path

    from moebench.core import passes
    from moebench.core.family import catalogue
    from moebench.sources import plugins

    monkeypatch.setenv(plugins.ENV, "")
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(passes, "PASSES", dict(passes.catalogue()))
    for fam in catalogue().values():
        monkeypatch.setattr(fam, "variants", dict(fam.variants))
    path = Path(path)
    path.write_text(text)
    plugins.load_file(path)
    return path
