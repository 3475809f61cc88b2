"""A timed run measures the device ceilings in a child process (issue 23): measuring them in the
timed process itself (two 2 GiB copy buffers, allocated and freed) put a count case in another
level in 4 of 6 runs on an H200. What the CPU can check: the child is used, its file is read, a
failing child is said and the run still gets ceilings, and the child's own refusal without CUDA."""

import json
from dataclasses import replace
from pathlib import Path

from moebench.core import device as D


def _cuda_info():
    info = D.host_device()
    return replace(info, backend="cuda", name="NVIDIA H200", slug="h200", driver="580.159.04")


def _doc(info, **c):
    return json.dumps({"device": info.to_dict(), "ceilings": dict(version=D.CEILINGS_VERSION, **c)})


def test_a_timed_run_measures_the_ceilings_in_a_child_and_reads_its_file(tmp_path, monkeypatch):
    info = _cuda_info()
    calls = []

    def child(path, **_):
        calls.append(Path(path))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(_doc(info, copy_dram_gbps=4235.0))
        return None

    def here(_info):
        raise AssertionError("measured in the timed process")

    monkeypatch.setattr(D, "measure_in_child", child)
    monkeypatch.setattr(D, "measure_ceilings", here)
    c = D.load_or_measure_ceilings(info, tmp_path, child=True)
    assert c["copy_dram_gbps"] == 4235.0 and calls == [tmp_path / "h200" / "device.json"]
    # cached now: no child the second time
    assert D.load_or_measure_ceilings(info, tmp_path, child=True)["copy_dram_gbps"] == 4235.0 and len(calls) == 1


def test_a_failing_child_is_said_and_the_ceilings_are_measured_here(tmp_path, monkeypatch):
    info = _cuda_info()
    notes = []
    monkeypatch.setattr(D, "measure_in_child", lambda path, **_: "exit 1: RuntimeError: CUDA out of memory")
    monkeypatch.setattr(D, "measure_ceilings", lambda _info: {"version": D.CEILINGS_VERSION, "copy_dram_gbps": 1.0})
    c = D.load_or_measure_ceilings(info, tmp_path, child=True, note=notes.append)
    assert c["copy_dram_gbps"] == 1.0 and len(notes) == 1
    assert "CUDA out of memory" in notes[0] and "in this process instead" in notes[0]
    cached = json.loads((tmp_path / "h200" / "device.json").read_text())["ceilings"]
    assert cached["copy_dram_gbps"] == 1.0 and cached["measured_in"] == "the timed process (its child failed)"


def test_the_child_refuses_without_cuda_in_one_line(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine measures for real (tests/gpu/test_gpu_ceilings.py)")
    why = D.measure_in_child(tmp_path / "h200" / "device.json")
    assert why is not None and why.startswith("exit 2: ") and "CUDA" in why
    assert not (tmp_path / "h200" / "device.json").exists()


def test_the_child_writes_the_file_and_says_where_it_measured(tmp_path, monkeypatch):
    from moebench.core import ceilings_child

    info = _cuda_info()
    monkeypatch.setattr(D, "detect", lambda interpret: info)
    monkeypatch.setattr(D, "measure_ceilings", lambda _info: {"version": D.CEILINGS_VERSION, "copy_dram_gbps": 2.0})
    path = tmp_path / "h200" / "device.json"
    assert ceilings_child.main([str(path)]) == 0
    c = D.load_or_measure_ceilings(info, tmp_path, child=True)  # cached now: read, not measured
    assert c["copy_dram_gbps"] == 2.0 and c["measured_in"] == "a child of the timed run"
    assert ceilings_child.main([]) == 2
