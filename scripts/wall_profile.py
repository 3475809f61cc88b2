"""Where a moebench command's wall time goes, whole command with Python start (issue 15 item 8).

Each command runs in a child process of this script, so the total is what a user waits for. The
child times its imports one by one, wraps the command's stages (device detection, ceilings, spec
and cases, writing, rendering, printing) with timers, and reads the cases' own phases (inputs,
reference, compile + checked launch, baseline, check, timing, cross-checks) from the results
file the command wrote (provenance.wall_phases_s). Nothing in moebench changes: the wrappers
only time what they wrap.

    python3 scripts/wall_profile.py OUT "sweep count-block" "sweep act-grid" "verify count-block" \\
        [--ceilings DEVICE.json] [--repeat 2] [--extra "--interpret"]

writes OUT/wall_profile.json and OUT/wall_profile.md (a table per command, for TIMER.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Stages timed around the moebench functions the CLI calls, by where the CLI looks them up.
STAGES = [
    ("device detection (CUDA init, NVML)", "moebench.core.device", "detect"),
    ("ceilings (cached device.json or measured)", "moebench.core.device", "load_or_measure_ceilings"),
    ("spec + cases", "moebench.core.spec", "load_spec"),
    ("spec + cases", "moebench.core.cases", "expand"),
    ("provenance (git)", "moebench.core.provenance", "provenance"),
    ("render the results page", "moebench.report.sweep", "sweep_markdown"),
    ("write the results files", "moebench.core.store", "ResultsWriter.finalize"),
    ("print tables", "moebench.cli.run", "print_pivots"),
]
IMPORTS = ("torch", "triton", "pandas", "moebench.cli")


def child(out_json: Path, argv: list[str]) -> None:
    """Run `moebench ARGV` here, timing imports and stages; write what was measured to `out_json`."""
    t0 = time.perf_counter()
    started_epoch = time.time()
    import importlib

    stages: dict[str, float] = {}
    imports = {}
    for name in IMPORTS:
        if name == "triton":
            # the backend the command will choose, decided before triton loads, as the CLI does it
            # (@triton.jit reads TRITON_INTERPRET when triton is first imported)
            from moebench.core.device import want_interpreter

            if want_interpreter("--interpret" in argv):
                os.environ["TRITON_INTERPRET"] = "1"
        t = time.perf_counter()
        importlib.import_module(name)
        imports[f"import {name}"] = time.perf_counter() - t

    def timed(label, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                stages[label] = stages.get(label, 0.0) + time.perf_counter() - t

        return wrapper

    for label, module, attr in STAGES:
        try:  # a stage moebench no longer has is simply not timed apart
            mod = importlib.import_module(module)
            owner, _, name = attr.rpartition(".")
            target = getattr(mod, owner) if owner else mod
            setattr(target, name, timed(label, getattr(target, name)))
        except (ImportError, AttributeError):
            pass
    from moebench import cli

    prof = None
    if os.environ.get("WALL_PROFILE_CPROFILE"):
        import cProfile

        prof = cProfile.Profile()
    t_cmd = time.perf_counter()
    sys.argv = ["moebench", *argv]
    real_main = cli.main

    def measured() -> None:
        """The command's main; what was measured is written when it returns, before the console
        entry (`cli.entry`, as `moebench` runs it) exits the process its own way."""
        code = 0
        try:
            if prof is not None:
                prof.enable()
            real_main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            raise
        finally:
            if prof is not None:
                prof.disable()
            end = time.perf_counter()
            if prof is not None:  # the command's functions (imports excluded), by cumulative and by own time
                import io
                import pstats

                buf = io.StringIO()
                st = pstats.Stats(prof, stream=buf)
                st.sort_stats("cumulative").print_stats(60)
                st.sort_stats("tottime").print_stats(40)
                out_json.with_suffix(".cprofile.txt").write_text(buf.getvalue())
            out_json.write_text(json.dumps({"argv": argv, "exit": code, "child_s": end - t0,
                                            "command_s": end - t_cmd, "started_epoch": started_epoch,
                                            "imports": imports, "stages": stages}))

    cli.main = measured
    entry = getattr(cli, "entry", None)  # older moebench: main alone, and Python's own exit
    (entry or measured)()


def results_file(out: Path, argv: list[str]) -> Path | None:
    """The JSON the command wrote (newest under its --out)."""
    found = sorted(out.rglob("*.json"), key=lambda p: p.stat().st_mtime)
    found = [p for p in found if p.name != "device.json"]
    return found[-1] if found else None


def triton_cache() -> dict:
    d = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    files = list(d.rglob("*")) if d.exists() else []
    return {"dir": str(d), "entries": sum(1 for f in files if f.is_file())}


def profile(argv: list[str], out: Path, ceilings: Path | None, extra: list[str]) -> dict:
    argv = list(argv)
    slug = "-".join(a for a in argv if not a.startswith("-"))[:60]
    run_out = out / "runs" / f"{slug}-{time.strftime('%H%M%S')}"
    if ceilings is not None and ceilings.exists():
        (run_out / ceilings.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(ceilings, run_out / ceilings.parent.name / "device.json")
    argv += ["--out", str(run_out), *extra]
    cache_before = triton_cache()
    meas = out / f"child-{slug}-{time.strftime('%H%M%S')}.json"
    t = time.perf_counter()
    spawned_epoch = time.time()
    proc = subprocess.run([sys.executable, __file__, "--child", str(meas), "--", *argv], cwd=ROOT,
                          capture_output=True, text=True)
    total = time.perf_counter() - t
    rec = {"command": "moebench " + " ".join(shlex.quote(a) for a in argv), "total_s": total,
           "returncode": proc.returncode, "triton_cache_before": cache_before, "triton_cache_after": triton_cache(),
           "stdout_tail": proc.stdout[-2000:], "stderr_tail": proc.stderr[-2000:]}
    if meas.exists():
        rec.update(json.loads(meas.read_text()))
        if rec.get("started_epoch"):  # the interpreter's start, and its exit after the command returned
            rec["start_s"] = max(0.0, rec["started_epoch"] - spawned_epoch)
            rec["exit_s"] = max(0.0, total - rec["start_s"] - rec.get("child_s", 0.0))
    res = results_file(run_out, argv)
    if res is not None:
        prov = json.loads(res.read_text()).get("provenance", {})
        rec["results"] = str(res)
        for k in ("sweep_wall_s", "compile_s_total", "jit_specializations", "wall_phases_s", "n_records"):
            rec[k] = prov.get(k)
    return rec


def table(rec: dict) -> list[str]:
    """One command's breakdown: rows that add up to the whole command, then the overlapped ones."""
    rows: list[tuple[str, float]] = []
    total = rec["total_s"]
    if "start_s" in rec:
        rows.append(("Python start (interpreter, site), before the first line", rec["start_s"]))
        rows.append(("Python exit (atexit hooks, CUDA teardown), after the command returned", rec["exit_s"]))
    else:
        rows.append(("Python start and exit, outside the command", total - rec.get("child_s", total)))
    rows += list(rec.get("imports", {}).items())
    stages = dict(rec.get("stages", {}))
    sweep = rec.get("sweep_wall_s") or 0.0
    phases = rec.get("wall_phases_s") or {}
    main = {k: v for k, v in phases.items() if "background" not in k}
    rows += [(k, v) for k, v in stages.items()]
    rows += [(f"cases: {k}", v) for k, v in main.items()]
    rows.append(("cases: the rest (session bookkeeping, events, streaming records)", max(0.0, sweep - sum(main.values()))))
    accounted = sum(v for _, v in rows)
    rows.append(("other (CLI, argument parsing, console)", total - accounted))
    out = [f"### `{rec['command']}`", "",
           f"Whole command {total:.2f} s (exit {rec.get('exit', rec['returncode'])}); cases {sweep:.2f} s "
           f"({rec.get('n_records')} records); JIT {rec.get('jit_specializations')} specializations, "
           f"{rec.get('compile_s_total')} s compiling; Triton cache entries before/after "
           f"{rec['triton_cache_before']['entries']}/{rec['triton_cache_after']['entries']}.", "",
           "| phase | s | % |", "|---|---|---|"]
    for name, v in rows:
        out.append(f"| {name} | {v:.3f} | {100 * v / total:.1f}% |")
    for k, v in phases.items():
        if "background" in k:
            out.append(f"| ({k}: overlapped with the cases, not added) | {v:.3f} | |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every profiled command exited 0, 1 when one failed (its row still written), 2
    for a command line that cannot be split (an unbalanced quote)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(Path(argv[1]), argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("commands", nargs="+", help='moebench commands, e.g. "sweep count-block"')
    ap.add_argument("--ceilings", type=Path, help="a device.json to reuse (copied under each command's --out)")
    ap.add_argument("--repeat", type=int, default=1, help="run each command this many times")
    ap.add_argument("--extra", default="", help="arguments added to every command")
    ap.add_argument("--cprofile", action="store_true",
                    help="also run each command under cProfile (OUT/child-*.cprofile.txt); its own overhead "
                         "inflates the whole-command times, so profile and time in separate runs")
    a = ap.parse_args(argv)
    try:
        extra = shlex.split(a.extra)
        commands = [shlex.split(c) for c in a.commands]
    except ValueError as e:
        print(f"error: cannot split a command line ({e}): {a.commands + [a.extra]}", file=sys.stderr)
        return 2
    if a.cprofile:
        os.environ["WALL_PROFILE_CPROFILE"] = "1"
    a.out.mkdir(parents=True, exist_ok=True)
    recs = []
    for argv_ in commands:
        for i in range(a.repeat):
            rec = profile(argv_, a.out, a.ceilings, extra)
            rec["repeat"] = i + 1
            recs.append(rec)
            print(f"{rec['total_s']:7.2f} s  {rec['command']} (exit {rec.get('exit', rec['returncode'])})", flush=True)
            write(a.out, recs)  # after every command: a run stopped early keeps what finished
    failed = [r for r in recs if r.get("exit", r["returncode"]) != 0 or r["returncode"] != 0]
    for r in failed:
        print(f"error: {r['command']} exited {r.get('exit', r['returncode'])}: "
              f"{(r['stderr_tail'].strip().splitlines() or [''])[-1]}", file=sys.stderr)
    return 1 if failed else 0


def write(out: Path, recs: list[dict]) -> None:
    (out / "wall_profile.json").write_text(json.dumps(recs, indent=1))
    lines = ["## Where each command's time goes", "",
             "`scripts/wall_profile.py`: each command in a fresh process, whole command with Python start. Rows "
             "add up to the whole command; the cases' phases come from the run driver (provenance.wall_phases_s).", ""]
    summary = ["| command | run | whole command s | cases s | compiling s |", "|---|---|---|---|---|"]
    for rec in recs:
        summary.append(f"| `{' '.join(rec['argv'][:2]) if 'argv' in rec else rec['command']}` | {rec['repeat']} | "
                       f"{rec['total_s']:.2f} | {rec.get('sweep_wall_s')} | {rec.get('compile_s_total')} |")
    lines += summary + [""]
    for rec in recs:
        lines += table(rec)
    (out / "wall_profile.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
