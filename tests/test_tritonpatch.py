"""moebench.tritonpatch: every patch of Triton with its off switch; Triton's cache key kept
between processes (the key handed back is Triton's own, it is recomputed when a file it covers
changes, a failed write leaves Triton's way standing); compile accounting asked of Triton."""

import os
from types import SimpleNamespace

import pytest
import triton.runtime.cache as tcache

from moebench import tritonpatch as tp


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The key cache not yet installed, Triton's cache under tmp_path; Triton's function restored after."""
    monkeypatch.setattr(tp, "_key_installed", False)
    monkeypatch.setattr(tcache, "triton_key", tcache.triton_key)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(tp, "cache_dir", lambda: tmp_path / "triton")
    monkeypatch.delenv(tp.BY_NAME["key_cache"].env, raising=False)
    return tmp_path


def test_the_key_is_tritons_own_and_is_read_back(fresh, monkeypatch):
    original = tcache.triton_key
    calls = []
    monkeypatch.setattr(tcache, "triton_key", lambda: calls.append(1) or original())
    assert tp.install_key_cache()
    key = tcache.triton_key()
    assert key == original() and len(calls) == 1
    stored = list((fresh / "triton" / "moebench-triton-key").glob("*.key"))
    assert len(stored) == 1 and stored[0].read_text() == key
    # a new process: the wrapper again, over Triton's function; the key comes from the file
    inner = []
    monkeypatch.setattr(tp, "_key_installed", False)
    monkeypatch.setattr(tcache, "triton_key", lambda: inner.append(1) or original())
    tp.install_key_cache()
    assert tcache.triton_key() == key and not inner


def test_a_changed_file_changes_the_signature(tmp_path):
    root = tmp_path / "triton"
    for sub in ("runtime", "_C", "compiler", "backends/nvidia", "language"):
        (root / sub).mkdir(parents=True)
    (root / "runtime" / "cache.py").write_text("x")
    (root / "compiler" / "code.py").write_text("y")
    (root / "backends" / "nvidia" / "driver.py").write_text("z")
    before = tp.signature(root)
    assert tp.signature(root) == before
    f = root / "backends" / "nvidia" / "driver.py"
    f.write_text("z2")
    assert tp.signature(root) != before
    st = f.stat()
    again = tp.signature(root)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert tp.signature(root) != again


def test_a_read_only_cache_computes_every_time(tmp_path):
    where = tmp_path / "ro"
    where.mkdir()
    where.chmod(0o500)
    try:
        calls = []
        key = tp.remembered(lambda: calls.append(1) or "k", where / "sub", "sig")
        key2 = tp.remembered(lambda: calls.append(1) or "k", where / "sub", "sig")
        assert key == key2 == "k"
        assert len(calls) == (1 if os.geteuid() == 0 else 2)  # root writes anyway
    finally:
        where.chmod(0o700)


def test_switched_off(fresh, monkeypatch):
    monkeypatch.setenv(tp.BY_NAME["key_cache"].env, "0")
    original = tcache.triton_key
    assert not tp.install_key_cache()
    assert tcache.triton_key is original


# --------------------------------------------------------------------------- every patch, its switch


def test_every_patch_has_its_switch():
    for p in tp.PATCHES:
        assert p.env.startswith("MOEBENCH_")
        assert tp.enabled(p.name, {}) and not tp.enabled(p.name, {p.env: p.off})
        assert not tp.enabled(p.name, {tp.ALL_OFF: "0"})


def _old_patch_lang_tensor(tensor, scope):  # its source reads like triton 3.6's: int(self.handle.data))
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


@pytest.mark.parametrize("name", ["lang_once", "scalar_squeeze", "no_overflow_checks"])
def test_interpreter_patches_obey_their_switch(monkeypatch, name):
    import dataclasses

    from triton.runtime import interpreter as it

    lang = it._patch_lang
    monkeypatch.setattr(it, "_patch_lang", getattr(lang, "_moebench_original", lang))
    monkeypatch.setattr(it, "_patch_lang_tensor", _old_patch_lang_tensor)
    opts = it.interpreter_builder.options
    monkeypatch.setattr(it.interpreter_builder, "options",
                        dataclasses.replace(opts, sanitize_overflow=True, debug=False))
    state = {"lang_once": lambda: getattr(it._patch_lang, "_moebench_once", False),
             "scalar_squeeze": lambda: getattr(it._patch_lang_tensor, "_moebench_squeeze", False),
             "no_overflow_checks": lambda: not it.interpreter_builder.options.sanitize_overflow}[name]
    p = tp.BY_NAME[name]
    monkeypatch.setenv(p.env, p.off)
    assert not tp.interpreter_patches()[name] and not state()
    monkeypatch.delenv(p.env)
    monkeypatch.setenv(tp.ALL_OFF, "0")
    assert not tp.interpreter_patches()[name] and not state()
    monkeypatch.delenv(tp.ALL_OFF)
    assert tp.interpreter_patches()[name] and state()
    assert not tp.interpreter_patches()[name]  # once


def test_fast_exit_and_its_switch(monkeypatch, capsys):
    left = []

    def fake_exit(code):
        left.append(code)
        raise SystemExit("os._exit")

    monkeypatch.setattr(tp.os, "_exit", fake_exit)
    for code, want in ((None, 0), (3, 3), (130, 130), ("a message", 1)):
        with pytest.raises(SystemExit):
            tp.leave(code)
        assert left[-1] == want
    assert "a message" in capsys.readouterr().err
    monkeypatch.setenv("MOEBENCH_FAST_EXIT", "0")
    with pytest.raises(SystemExit) as e:
        tp.leave(5)
    assert e.value.code == 5 and len(left) == 4  # the ordinary exit: os._exit not called


# --------------------------------------------------------------------------- compile accounting


def _kernel(x_ptr, n):
    pass


class _Compiling:
    """A kernel launched the way Triton's JITFunction.run does on a GPU: look its specialization key
    up in the kernel's per-device cache, and on a miss go through Triton's own _do_compile (whose
    compile step is stubbed: nothing can compile on this machine). `spec` stands for what Triton
    derives from the arguments (dtypes, divisibility by 16, constexpr values)."""

    def __init__(self):
        from triton.runtime.jit import JITFunction

        self.jf = JITFunction(_kernel)
        target = SimpleNamespace(backend="cuda", arch=90, warp_size=32)
        self.jf.device_caches[0] = ({}, None, target, None, None)
        self.jf.ASTSource = lambda *a, **k: None
        self.jf.compile = lambda src, target=None, options=None, **k: "binary"
        self.options = SimpleNamespace(num_warps=4, num_ctas=1, num_stages=3, enable_fp_fusion=True,
                                       launch_cooperative_grid=False, extern_libs=None)

    def launch(self, spec):
        key = (spec, ("*i32", "i32"))
        if key not in self.jf.device_caches[0][0]:
            self.jf._do_compile(key, {"x_ptr": "*i32", "n": "i32"}, 0, {}, self.options, {}, False)


def test_triton_reports_each_compile_and_an_earlier_hook_still_runs(monkeypatch):
    from triton import knobs

    theirs = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: theirs.append(kw["key"]))
    k = _Compiling()
    with tp.specializations() as new:
        k.launch("n%16")
        k.launch("n%16")  # a hit in Triton's cache: nothing compiled
        k.launch("n==1")
    assert len(new) == 2 and len(theirs) == 2
    with tp.specializations() as again:
        k.launch("n==1")
    assert again == []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)  # replaced by someone else: chained again
    with tp.specializations() as after:
        k.launch("n*8")
    assert len(after) == 1


def test_a_plugin_launch_gets_its_compile_time_and_count(monkeypatch):
    """Four specializations in four first launches of a plugin's builts: each launch that compiled
    gets its compile_s, the one that hit Triton's cache gets none, and the pipeline counts 4."""
    from moebench.core import pipeline as P
    from moebench.core.device import detect
    from moebench.core.spec import load_spec
    from moebench.core.family import Built

    spec = load_spec("count-block")
    run = P.CasePipeline(spec, detect(True), P.Options(timing=spec.timing))
    k = _Compiling()

    def built(*specs):
        return Built(lambda: [k.launch(s) for s in specs], None, lambda: None, {})

    got = [run._first_launch(built(s)) for s in ("b128", "b512", "b128")]
    got.append(run._first_launch(built("b1024", "b2048")))  # one launch, two kernels compiled
    assert [x is not None for x in got] == [True, True, False, True]
    assert run.jit_specializations == 4 and run.compile_s_total == pytest.approx(got[0] + got[1] + got[3])


def test_under_the_interpreter_a_specialization_is_a_function_prepared_once():
    import torch
    import triton
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")

    def body(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    kernel = triton.jit(body)
    x = torch.zeros(16, dtype=torch.int32)
    with tp.specializations() as first:
        kernel[(1,)](x, BLOCK=16)
    with tp.specializations() as second:
        kernel[(1,)](x, BLOCK=8)  # another constexpr: a new compile on a GPU, nothing new here
    assert [k[0] for k in first] == ["interpreted"] and second == []
    assert x[:8].tolist() == [2] * 8 and x[8:].tolist() == [1] * 8
