"""Triton's cache key kept between processes (moebench.core.jitcache): the key handed back is
Triton's own, it is recomputed when a file it covers changes, a failed write leaves Triton's way
standing, and MOEBENCH_TRITON_KEY_CACHE=0 turns it off."""

import os

import pytest
import triton.runtime.cache as tcache

from moebench.core import jitcache


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """jitcache not yet installed, Triton's cache under tmp_path; Triton's function restored after."""
    monkeypatch.setattr(jitcache, "_installed", False)
    monkeypatch.setattr(tcache, "triton_key", tcache.triton_key)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(jitcache, "cache_dir", lambda: tmp_path / "triton")
    monkeypatch.delenv(jitcache.ENV, raising=False)
    return tmp_path


def test_the_key_is_tritons_own_and_is_read_back(fresh, monkeypatch):
    original = tcache.triton_key
    calls = []
    monkeypatch.setattr(tcache, "triton_key", lambda: calls.append(1) or original())
    assert jitcache.install()
    key = tcache.triton_key()
    assert key == original() and len(calls) == 1
    stored = list((fresh / "triton" / "moebench-triton-key").glob("*.key"))
    assert len(stored) == 1 and stored[0].read_text() == key
    # a new process: the wrapper again, over Triton's function; the key comes from the file
    inner = []
    monkeypatch.setattr(jitcache, "_installed", False)
    monkeypatch.setattr(tcache, "triton_key", lambda: inner.append(1) or original())
    jitcache.install()
    assert tcache.triton_key() == key and not inner


def test_a_changed_file_changes_the_signature(tmp_path):
    root = tmp_path / "triton"
    for sub in ("runtime", "_C", "compiler", "backends/nvidia", "language"):
        (root / sub).mkdir(parents=True)
    (root / "runtime" / "cache.py").write_text("x")
    (root / "compiler" / "code.py").write_text("y")
    (root / "backends" / "nvidia" / "driver.py").write_text("z")
    before = jitcache.signature(root)
    assert jitcache.signature(root) == before
    f = root / "backends" / "nvidia" / "driver.py"
    f.write_text("z2")
    assert jitcache.signature(root) != before
    st = f.stat()
    again = jitcache.signature(root)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert jitcache.signature(root) != again


def test_a_read_only_cache_computes_every_time(tmp_path):
    where = tmp_path / "ro"
    where.mkdir()
    where.chmod(0o500)
    try:
        calls = []
        key = jitcache.remembered(lambda: calls.append(1) or "k", where / "sub", "sig")
        key2 = jitcache.remembered(lambda: calls.append(1) or "k", where / "sub", "sig")
        assert key == key2 == "k"
        assert len(calls) == (1 if os.geteuid() == 0 else 2)  # root writes anyway
    finally:
        where.chmod(0o700)


def test_switched_off(fresh, monkeypatch):
    monkeypatch.setenv(jitcache.ENV, "0")
    original = tcache.triton_key
    assert not jitcache.install()
    assert tcache.triton_key is original
