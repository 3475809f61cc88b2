"""How `make install` (under `make sweep` / `make test`) sets up .venv (issue 24 item 7): on a GPU
machine whose python3 has a CUDA torch and triton at the minimums it reuses them and says so; it
never downloads a second CUDA torch; without a GPU it installs the CPU torch first, as before."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("venv_mode", ROOT / "scripts" / "venv_mode.py")
venv_mode = importlib.util.module_from_spec(spec)
spec.loader.exec_module(venv_mode)
MINS = {"torch": (2, 4), "triton": (3, 6)}


def info(python=(3, 12, 3), torch="2.11.0+cu130", gpu=True, triton="3.6.0", setuptools="75.1.0"):
    return {"python": python, "torch": torch, "torch_gpu": gpu, "triton": triton, "setuptools": setuptools,
            "why": {"torch": "ModuleNotFoundError: No module named 'torch'"} if torch is None else {}}


def test_the_minimums_are_pyprojects():
    assert venv_mode.minimums() == MINS
    assert venv_mode.version_tuple("2.11.0+cu130") == (2, 11, 0) and venv_mode.version_tuple("3.6.0rc1") == (3, 6, 0)


def test_a_gpu_machine_with_torch_and_triton_reuses_them():
    mode, flags, why = venv_mode.decide(True, info(), MINS)
    assert (mode, flags) == ("system", "--no-build-isolation")
    assert "torch 2.11.0+cu130 and triton 3.6.0" in why and "no second CUDA torch" in why
    assert venv_mode.decide(True, info(setuptools=None), MINS)[:2] == ("system", "")  # builds in isolation
    assert venv_mode.decide(True, info(setuptools="65.5.0"), MINS)[:2] == ("system", "")  # needs wheel too
    assert venv_mode.decide(True, {**info(setuptools="65.5.0"), "wheel": True}, MINS)[1] == "--no-build-isolation"


@pytest.mark.parametrize("kw,reason", [
    ({"torch": None}, "torch does not import (ModuleNotFoundError"),
    ({"torch": "2.3.1+cu121"}, "torch 2.3.1+cu121 is older than the minimum 2.4"),
    ({"triton": "3.5.1"}, "triton 3.5.1 is older than the minimum 3.6"),
    ({"torch": "2.13.0+cpu", "gpu": False}, "torch 2.13.0+cpu is a CPU build"),
    ({"python": (3, 10, 12)}, "this Python is 3.10.12 (moebench needs >= 3.11)"),
])
def test_a_gpu_machine_without_a_usable_torch_says_why(kw, reason):
    mode, flags, why = venv_mode.decide(True, info(**kw), MINS)
    assert mode == "cuda" and flags == "" and reason in why


def test_no_gpu_is_the_cpu_path():
    assert venv_mode.decide(False, {}, MINS)[0] == "cpu"


FAKE_PY = """#!/bin/sh
echo "$0 $*" >> "$LOG"
if [ "$1" = scripts/venv_mode.py ] && [ "$2" = --gpu ]; then echo "make: (fake) $FAKE_MODE" >&2; echo "$FAKE_MODE"; exit 0; fi
if { [ "$1" = -m ] && [ "$2" = venv ]; } || [ "$2" = --make-venv ]; then
  for d; do :; done
  mkdir -p "$d/bin" && cp "$0" "$d/bin/python"
fi
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
@pytest.mark.parametrize("gpu,mode,venv_cmd,pip", [
    ("1", "system --no-build-isolation", "scripts/venv_mode.py --make-venv", ["-m pip install -q --no-build-isolation -e ."]),
    ("1", "cuda", "-m venv", ["-m pip install -q -e ."]),
    ("", "cpu", "-m venv", ["-m pip install -q torch==2.13.0 -e ."]),
])
def test_make_install_follows_the_mode(tmp_path, gpu, mode, venv_cmd, pip):
    py = tmp_path / "python3"
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    log, venv = tmp_path / "log", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "INSTALL_COMPILE")}
    env.update(LOG=str(log), FAKE_MODE=mode)  # not the flags of a `make test` this suite runs under
    r = subprocess.run(["make", "--no-print-directory", "install", f"PY={py}", f"VENV={venv}", f"HAS_GPU={gpu}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert calls[0] == f"scripts/venv_mode.py --gpu {gpu}"
    assert calls[1] == f"{venv_cmd} {venv}"
    assert calls[2:] == pip  # the CPU torch only without a GPU; never torch on a GPU machine that has one
    assert (venv / "bin" / ".installed").exists()
    assert f"make: (fake) {mode}" in r.stderr
    # the test tools come later (make unit / make test), with the same pip flags; `make sweep` needs none
    r = subprocess.run(["make", "--no-print-directory", f"{venv}/bin/.test-installed", f"PY={py}", f"VENV={venv}",
                        f"HAS_GPU={gpu}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    assert log.read_text().splitlines()[-1].split(" ", 1)[1] == pip[-1].replace(" torch==2.13.0", "") + "[test]"
    # `make test` on a new machine: one pip call, the test tools included, nothing byte-compiled ahead
    log.unlink()
    r = subprocess.run(["make", "--no-print-directory", f"{tmp_path / 'v2'}/bin/.test-installed", f"PY={py}",
                        f"VENV={tmp_path / 'v2'}", f"HAS_GPU={gpu}", "INSTALL_COMPILE=--no-compile"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    calls = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert calls[2:] == [pip[-1].replace("install -q", "install -q --no-compile") + "[test]"]
    assert (tmp_path / "v2" / "bin" / ".installed").exists()


def test_a_venv_made_over_a_venv_sees_its_packages_and_pip_downloads_nothing(tmp_path):
    """The H200's python3 is itself a venv (torch in its site-packages): .venv made with
    --system-site-packages alone would see the base interpreter's packages only, and pip would look
    for torch in the index. This test's Python is a venv too (its base has no torch): a .venv made
    over it (`venv_mode.py --make-venv`) imports torch, and pip resolves moebench's requirements
    with no index at all."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("this Python is not a virtual environment")
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "venv_mode.py"), "--make-venv", str(venv)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import sys, torch, typer, yaml; print(sys.prefix)"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(venv), r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "venv_mode.py"), "--make-venv", str(venv)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr  # over a .venv made before (a failed install): made again in place
    r = subprocess.run([str(py), "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "-q",
                        "-e", str(ROOT)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # every requirement found where it is installed: nothing to download


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_install_stops_when_the_mode_is_unknown(tmp_path):
    py = tmp_path / "python3"
    py.write_text("#!/bin/sh\necho \"$0 $*\" >> \"$LOG\"\nexit 3\n")
    py.chmod(0o755)
    r = subprocess.run(["make", "install", f"PY={py}", f"VENV={tmp_path / 'venv'}", "HAS_GPU="], cwd=ROOT,
                       env={**os.environ, "LOG": str(tmp_path / "log")}, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "scripts/venv_mode.py failed" in r.stderr
    assert len((tmp_path / "log").read_text().splitlines()) == 1  # no venv made, nothing installed
