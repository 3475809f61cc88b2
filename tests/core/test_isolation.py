"""A bad plugin fails only its own cases (issue 24 item 4): what a variant does to the inputs it
shares with the others is undone and blamed on it; a crash, a hang, a sys.exit is that case's
failure and the run goes on. The plugins are written here; the runs are real CLI runs under the
interpreter, each in its own process (a crash must not take the test process with it)."""

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

import warm

ROOT = Path(__file__).resolve().parents[2]

BAD_PLUGIN = '''
import os, signal, sys

import torch

from moebench.families import Built, get_family

COUNT = get_family("count")


def _counting(inp, params, after):
    """Counts right (torch.bincount of the valid pairs), then does `after`."""
    S, L = params["local_expert_start"], params["local_experts"]

    def launch():
        ids = inp.routing_map[: int(inp.valid.item())].reshape(-1).long() - S
        inp.counts.add_(torch.bincount(ids[(ids >= 0) & (ids < L)], minlength=L).to(torch.int32))
        after()

    def reset():
        inp.counts.zero_()

    return Built(launch, inp.counts, reset, {"grid": 1, "block_size": 64, "num_warps": 1})


@COUNT.variant("oob", doc="a store into the guard cell past the counters")
def build_oob(inp, params, device):
    return _counting(inp, params, lambda: inp.counts_buf.__setitem__(-1, 1))


@COUNT.variant("clobber", doc="overwrites its input routing map")
def build_clobber(inp, params, device):
    return _counting(inp, params, lambda: inp.routing_map.fill_(params["local_expert_start"]))


@COUNT.variant("exits", doc="calls sys.exit(5) in its launch")
def build_exits(inp, params, device):
    return _counting(inp, params, lambda: sys.exit(5))


@COUNT.variant("osexit", doc="calls os._exit(0) in its launch")
def build_osexit(inp, params, device):
    return _counting(inp, params, lambda: os._exit(0))


@COUNT.variant("typo", doc="reads a parameter the family does not have")
def build_typo(inp, params, device):
    start = params["local_start"]
    return _counting(inp, params, lambda: None)


@COUNT.variant("segv", doc="a segfault at launch")
def build_segv(inp, params, device):
    return _counting(inp, params, lambda: os.kill(os.getpid(), signal.SIGSEGV))


@COUNT.variant("aborts", doc="abort() at launch")
def build_aborts(inp, params, device):
    return _counting(inp, params, os.abort)


def _raise():
    raise ValueError("a plugin bug")


@COUNT.variant("raises", doc="raises at launch")
def build_raises(inp, params, device):
    return _counting(inp, params, _raise)


def _sticky():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


@COUNT.variant("sticky", doc="meets a CUDA error that poisons its process's context")
def build_sticky(inp, params, device):
    return _counting(inp, params, _sticky)
'''

HANG_FAMILY = '''
import sys, time
from dataclasses import dataclass

import torch

from moebench.families import Built, Check, FamilySpec, Param, register_family

FAMILY = register_family(FamilySpec(
    name="stuckfam", doc="copies a vector; its input builder hangs, or exits, for one shape each",
    kernels=__name__,
    params={p.name: p for p in (
        Param("n", int, min=1, max=4096, help="elements"),
        Param("hang_at", int, default=-1, help="the n whose inputs never finish building"),
        Param("exit_at", int, default=-1, help="the n whose input builder calls sys.exit(7)"),
        Param("seed", int, default=0, min=0, help="input seed"),
        Param("num_warps", int, default=4, role="launch", pow2=True, min=1, max=32, help="unused"),
    )},
    default_pivot={"rows": "num_warps", "cols": "n", "metric": "median_us"},
))


@dataclass
class Inputs:
    x: torch.Tensor
    out: torch.Tensor


def build_inputs(params, device, set_index=0):
    if params["n"] == params["hang_at"]:
        while True:
            time.sleep(0.05)
    if params["n"] == params["exit_at"]:
        sys.exit(7)
    g = torch.Generator().manual_seed(params["seed"] * 1_000_003 + set_index)
    return Inputs(torch.randint(0, 100, (params["n"],), generator=g, dtype=torch.int32).to(device),
                  torch.full((params["n"],), -1, dtype=torch.int32, device=device))


def input_bytes(params):
    return params["n"] * 8


def reference(inp, params):
    return inp.x.cpu().clone()


def check(inp, out, expected, params):
    return Check(True, "exact") if torch.equal(out.cpu(), expected) else Check(False, "differs")


def nonvacuity(inp, out, params):
    return {"n": params["n"]}


def work(params, geometry, device):
    return {"bytes": params["n"] * 8, "ctas": 1, "ctas_with_work": 1, "threads_per_cta": 32}


@FAMILY.variant("copy", params=("num_warps",), doc="out = x")
def build_copy(inp, params, device):
    def launch():
        inp.out.copy_(inp.x)

    def reset():
        inp.out.fill_(-1)

    return Built(launch, inp.out, reset, {"grid": 1})
'''


def count_spec(tmp_path: Path, name: str, variants: list[str], tokens=(0, 30)) -> Path:
    (tmp_path / "bad.py").write_text(BAD_PLUGIN)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: {name}
        family: count
        model: qwen3-30b-a3b
        plugins: [bad.py]
        variants: [{", ".join(variants)}]
        baseline: {{variant: persistent, block_size: 1024}}
        axes: {{tokens: [{", ".join(map(str, tokens))}]}}
        fixed: {{buffer_tokens: 32, block_size: 64}}
        """))
    return spec


def moebench(*args, timeout=240, interpret=True):
    env = {k: v for k, v in os.environ.items() if k not in ("MOEBENCH_PLUGINS", "PYTHONPATH", "TRITON_INTERPRET")}
    env.update(COLUMNS="200", PYTHONPATH=str(ROOT))
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return warm.run(args, cwd=ROOT, env=env, timeout=timeout)


def by_variant(out: Path, stem: str) -> dict[str, list[dict]]:
    doc = json.loads(next(out.rglob(f"{stem}.json")).read_text())
    got: dict[str, list[dict]] = {}
    for r in doc["records"]:
        got.setdefault(r["variant"], []).append(r)
    return got


def assert_exact(recs: list[dict]) -> None:
    for r in recs:
        assert r["status"] == "ok" and r["checks"]["ref_check"] == "exact", r
        assert r["checks"]["baseline_equal"] is True, r


# ------------------------------------------------------------------ shared inputs


def test_a_store_past_the_output_is_blamed_on_the_variant_that_made_it(tmp_path):
    """Before: the guard cell the plugin hit stayed hit, and the built-in variants after it on the
    same inputs failed 'wrote outside the local-expert counters' too."""
    r = moebench("sweep", count_spec(tmp_path, "oob", ["oob", "persistent", "nonpersistent"]), "--out", tmp_path)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "oob")
    assert [x["status"] for x in got["oob"]] == ["mismatch", "mismatch"]
    assert all("wrote outside the local-expert counters" in x["error"] for x in got["oob"])
    assert_exact(got["persistent"] + got["nonpersistent"])


def test_a_variant_that_changes_its_input_fails_alone(tmp_path):
    """Before: the plugin passed (it counted before overwriting the routing map) and the variants
    after it counted the overwritten map: '28/32 counts differ from torch.bincount'."""
    r = moebench("sweep", count_spec(tmp_path, "clob", ["clobber", "persistent", "nonpersistent"]), "--out", tmp_path)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "clob")
    for x in got["clobber"]:
        assert x["status"] == "mismatch" and x["checks"]["inputs_intact"] is False
        assert "changed its input routing_map" in x["error"]
        assert x["checks"]["ref_check"] == "exact" and x["checks"]["baseline_equal"] is True  # its output was right
    assert_exact(got["persistent"] + got["nonpersistent"])


def test_pristine_copy_tells_inputs_guard_cells_and_workspace_apart():
    import torch

    from moebench.core.pipeline import _Pristine

    class Inp:
        def __init__(self):
            self.x = torch.arange(8, dtype=torch.int32)
            self.buf = torch.full((6,), -7, dtype=torch.int32)
            self.out = self.buf[2:4]
            self.scratch = torch.zeros(3)

    inp = Inp()
    p = _Pristine(inp, 1 << 20)
    inp.out.fill_(5)
    inp.scratch.fill_(1)
    assert p.damage(inp.out, ("scratch",)) == ""  # its output, and the family's declared workspace
    assert "changed its input scratch" in p.damage(inp.out)
    inp.buf[4] = 0
    inp.x[0] = 9
    what = p.damage(inp.out, ("scratch",))
    assert "guard cells of buf" in what and "changed its input x" in what
    p.restore()
    assert inp.x[0] == 0 and bool((inp.buf == -7).all()) and p.damage(inp.out) == ""
    small = _Pristine(inp, 12 + 24)  # the budget: smallest storages first (scratch 12 bytes, buf 24, x 32)
    assert [names for names, _, _ in small.items] == [["scratch"], ["buf", "out"]]


# ------------------------------------------------------------------ sys.exit, hangs


def test_sys_exit_in_a_launch_fails_that_case_only(tmp_path):
    """Before: the run ended with exit code 5, no message and no record."""
    r = moebench("sweep", count_spec(tmp_path, "ex", ["exits", "persistent"]), "--out", tmp_path)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "ex")
    assert all(x["status"] == "error" and "sys.exit(5)" in x["error"] for x in got["exits"])
    assert_exact(got["persistent"])


def test_os_exit_in_a_launch_fails_that_case_only(tmp_path):
    """Before: the run ended with exit code 0, no files and no message."""
    r = moebench("sweep", count_spec(tmp_path, "osx", ["osexit", "persistent"]), "--out", tmp_path)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "osx")
    for x in got["osexit"]:
        assert x["status"] == "error" and "called os._exit(0)" in x["error"], x["error"]
        assert f"(at {tmp_path / 'bad.py'}:" in x["error"]  # the plugin's line that called it
    assert_exact(got["persistent"])


def test_a_plugin_error_names_its_file_and_line_and_v_keeps_the_traceback(tmp_path):
    """Before: 'KeyError: 'local_start'' named no file or line, even with -v."""
    spec = count_spec(tmp_path, "typo", ["typo", "persistent"], tokens=(30,))
    line = next(i for i, t in enumerate(BAD_PLUGIN.splitlines(), 1) if 'params["local_start"]' in t)
    for verbose in ([], ["-v"]):
        r = moebench(*verbose, "sweep", spec, "--out", tmp_path / str(len(verbose)))
        assert r.returncode == 1, r.stderr
        (x,) = by_variant(tmp_path / str(len(verbose)), "typo")["typo"]
        first, *rest = x["error"].splitlines()
        assert first == f"KeyError: 'local_start' (at {tmp_path / 'bad.py'}:{line})", first
        assert f"(at {tmp_path / 'bad.py'}:{line})" in r.stdout + r.stderr  # the failures table says where
        assert bool(rest) == bool(verbose) and (not verbose or "Traceback" in rest[0])


@pytest.mark.parametrize("body, says", [
    ("import os\nos._exit(0)\n", "bad_import.py:2: the plugin called os._exit(0) while loading"),
    ("raise KeyboardInterrupt\n", "bad_import.py:1: the plugin raised KeyboardInterrupt while loading"),
])
def test_an_exit_or_an_interrupt_raised_by_a_plugin_import_is_a_usage_error(tmp_path, body, says):
    """Before: os._exit(0) at import gave exit 0 with no message and no files; a KeyboardInterrupt
    raised there (no Ctrl-C arrived) a silent exit 130."""
    (tmp_path / "bad_import.py").write_text(body)
    r = moebench("sweep", count_spec(tmp_path, "imp", ["persistent"]), "--plugin", tmp_path / "bad_import.py",
                 "--out", tmp_path / "out")
    line = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in line and "Traceback" not in line, r.stderr
    assert says in line and str(tmp_path / "bad_import.py") in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("isolate", [False, True], ids=["here", "isolated"])
def test_a_hung_input_build_stops_at_the_limit_and_the_run_goes_on(tmp_path, isolate):
    """Before (here): the hung build ran on a background thread; the next shape queued behind it and
    was recorded CaseTimeLimit too, and the run then hung for good waiting for that thread."""
    (tmp_path / "stuckfam.py").write_text(HANG_FAMILY)
    spec = tmp_path / "stuck.yaml"
    spec.write_text("name: stuck\nfamily: stuckfam\nplugins: [stuckfam.py]\nvariants: [copy]\n"
                    "baseline: {variant: copy}\naxes: {n: [8, 16, 32, 64]}\nfixed: {hang_at: 16, exit_at: 32}\n")
    t0 = time.monotonic()
    r = moebench("sweep", spec, "--out", tmp_path, "--case-limit", "1", *(["--isolate"] if isolate else []),
                 timeout=120)
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - t0 < 100
    doc = json.loads(next(tmp_path.rglob("stuck.json")).read_text())
    assert doc["provenance"]["complete"]
    got = {x["params"]["n"]: x for x in doc["records"]}
    assert got[16]["status"] == "error" and got[16]["error"].startswith("CaseTimeLimit: still running after 1 s")
    assert got[32]["status"] == "error" and "sys.exit(7)" in got[32]["error"]
    assert got[8]["status"] == got[64]["status"] == "ok"


def test_a_background_build_given_up_does_not_hold_the_pool():
    """The prefetch pool's thread stuck in a build is left behind: another takes the queued work, and
    shutting the pool down does not wait for it."""
    import threading

    from moebench.core.prefetch import _DaemonPool

    release = threading.Event()
    pool = _DaemonPool(1, "test-pool")
    stuck = pool.submit(release.wait)
    time.sleep(0.05)
    queued = pool.submit(lambda: 42)
    pool.abandon(stuck)
    assert queued.result(timeout=10) == 42
    t0 = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - t0 < 5 and not stuck.done()
    release.set()


# ------------------------------------------------------------------ crashes


def test_isolate_records_a_crash_and_runs_the_other_variants(tmp_path):
    """Before: the segfault ended the whole run (exit code 139, no message, no record)."""
    spec = count_spec(tmp_path, "crash", ["segv", "aborts", "raises", "persistent"], tokens=(30,))
    r = moebench("sweep", spec, "--out", tmp_path)
    assert r.returncode not in (0, 1, 2)  # without --isolate a segfault still takes the process
    r = moebench("sweep", spec, "--out", tmp_path, "--isolate", "--force")
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "crash")
    assert got["segv"][0]["status"] == "error" and "SIGSEGV" in got["segv"][0]["error"]
    assert got["aborts"][0]["status"] == "error" and "SIGABRT" in got["aborts"][0]["error"]
    assert got["raises"][0]["error"].startswith(f"ValueError: a plugin bug (at {tmp_path / 'bad.py'}:")
    assert_exact(got["persistent"])
    assert "crashed: its process died" in r.stderr


def test_after_a_cuda_error_that_poisons_the_context_the_rest_runs_in_a_fresh_process(tmp_path):
    """Before: the run went on in the poisoned process (on a GPU every later case then failed)."""
    r = moebench("sweep", count_spec(tmp_path, "sticky", ["sticky", "persistent"], tokens=(30,)), "--out", tmp_path)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "sticky")
    assert "illegal memory access" in got["sticky"][0]["error"] and "worker" not in got["sticky"][0]["timing"]
    assert_exact(got["persistent"])
    assert got["persistent"][0]["timing"]["worker"] == "CPU (isolated)"


DEAF_PLUGIN = BAD_PLUGIN + '''

@COUNT.variant("deaf", doc="hangs with SIGALRM blocked: the case's own alarm cannot stop it")
def build_deaf(inp, params, device):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(600)
'''


def test_the_watchdog_kills_a_child_deaf_to_the_case_limit(tmp_path, monkeypatch):
    """A hang the child's own alarm cannot stop (C code, a blocked signal): the parent kills the child
    past the limit, records the case, and a fresh child runs the rest."""
    from clirun import load_plugin
    from moebench.core.cases import expand
    from moebench.core.pipeline import Options
    from moebench.core.spec import load_spec
    from moebench.parallel import workers

    load_plugin(monkeypatch, tmp_path / "deaf.py", "import time\n" + DEAF_PLUGIN)
    spec_path = count_spec(tmp_path, "deaf", ["persistent", "deaf"], tokens=(0, 30))
    spec_path.write_text(spec_path.read_text().replace("plugins: [bad.py]\n", ""))
    spec = load_spec(str(spec_path))
    cases = [c for c in expand(spec) if c.variant == "deaf" or c.params["tokens"] == 30][:3]
    monkeypatch.setattr(workers, "WATCHDOG_GRACE_S", 0.25)
    opts = Options(timing=spec.timing, time_it=False, case_limit_s=0.5)
    recs = list(workers._run_workers(spec, cases, ["iso"], True, opts=opts, respawn=True))
    got = {r.case_id: r for r in recs}
    assert sorted(got) == sorted(c.id for c in cases)
    for c in cases:
        if c.variant == "deaf":
            assert got[c.id].status == "error" and got[c.id].error.startswith("CaseTimeLimit")
        else:
            assert got[c.id].status == "ok"
    assert sum(c.variant == "deaf" for c in cases) == 2 and len(cases) == 3


FAR_STORE_PLUGIN = BAD_PLUGIN + '''

import triton
import triton.language as tl


@triton.jit
def _far_store(ptr):
    tl.store(ptr + (1 << 40), 1)  # 4 TiB past the counters: an illegal address on a GPU


@COUNT.variant("far", doc="a store far out of bounds")
def build_far(inp, params, device):
    return _counting(inp, params, lambda: _far_store[(1,)](inp.counts))
'''


@pytest.mark.gpu
# Without --isolate the fallback cannot help on torch 2.11: on an H200 (4aff8da, results/h200/
# gpu-tests.txt's call) the illegal address aborted the whole process in MemPool's destructor
# ("terminate called after throwing an instance of 'c10::AcceleratorError'") while the failed
# case's placements were freed, before the driver saw the record. strict: passing here is news.
@pytest.mark.parametrize("isolate", [
    pytest.param(False, marks=pytest.mark.xfail(strict=True, reason="torch aborts freeing the poisoned placement "
                                                "pools: without --isolate an illegal address ends the run")),
    True], ids=["here", "isolated"])
def test_a_store_far_out_of_bounds_on_a_gpu_fails_its_case_only(tmp_path, isolate):
    """Before: a plugin store far out of bounds ended the run (rc 139), or, as a CUDA error, failed
    every later case in the poisoned context."""
    spec = count_spec(tmp_path, "far", ["far", "persistent"])
    (tmp_path / "bad.py").write_text(FAR_STORE_PLUGIN)
    r = moebench("sweep", spec, "--out", tmp_path, *(["--isolate"] if isolate else []), interpret=False, timeout=600)
    assert r.returncode == 1, r.stderr
    got = by_variant(tmp_path, "far")
    assert {x["status"] for x in got["far"]} == {"error"}
    assert all("illegal" in x["error"] or "SIGSEGV" in x["error"] for x in got["far"]), got["far"]
    for x in got["persistent"]:
        assert x["status"] == "ok" and x["checks"]["baseline_equal"] is True and x["timing"]["median_us"] > 0


def test_isolate_on_a_host_only_family_is_one_line(tmp_path, capsys):
    from clirun import run_cli

    code, _, err = run_cli(["sweep", "combine-lds", "--quick", "--isolate", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--isolate: family 'combine' is host-only" in err and "Traceback" not in err


def test_a_pass_a_plugin_registers_runs_under_isolate(tmp_path):
    """--isolate: the child loads the plugin before it unpickles the passes, so the plugin's pass
    runs there on every case and the provenance lists it (before: 'no worker started', exit 2)."""
    (tmp_path / "stamp.py").write_text(textwrap.dedent("""\
        import os

        from moebench.core.passes import Pass, register


        @register
        class Stamp(Pass):
            name = "stamp"
            cuda_only = False

            def after_case(self, ctx):
                ctx.record.cross["stamp_pid"] = os.getpid()
        """))
    spec = count_spec(tmp_path, "stamped", ["persistent"])
    r = moebench("sweep", spec, "--isolate", "--plugin", tmp_path / "stamp.py", "--cross-check", "stamp",
                 "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(next(tmp_path.rglob("stamped.json")).read_text())
    assert doc["provenance"]["cross_checks"] == ["stamp"]
    recs = doc["records"]
    assert recs and all(x["status"] == "ok" and x["timing"]["worker"] == "CPU (isolated)" for x in recs)
    assert all(isinstance(x["cross"]["stamp_pid"], int) for x in recs)
