"""Tests run on the CPU: kernels under the Triton interpreter. The variable must be set before
any kernel module is imported, since @triton.jit reads it at decoration time."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ["TRITON_INTERPRET"] == "1":
    from moebench import tritonpatch

    tritonpatch.interpreter_patches()  # triton <= 3.6 under NumPy 2 (the H200 image): see moebench.tritonpatch


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    except Exception:  # noqa: BLE001
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
