"""How `make install` (and so `make sweep`, `make test`) sets up .venv on this machine.

Prints one line, `MODE [PIP_FLAGS]`, on stdout, and why on stderr:

- `system`: a GPU, and this Python's own torch (a CUDA or ROCm build) and triton import and meet
  pyproject's minimums: .venv is made over this Python and reuses them, so pip never
  downloads a second, multi-GB CUDA torch; with setuptools >= 70.1 here too (or >= 61 and wheel),
  `--no-build-isolation` lets the editable install build without a package index.
- `cuda`: a GPU but no usable torch/triton here (absent, too old, a CPU build, this Python too old):
  a bare .venv, into which pip installs torch from the index (a CUDA build).
- `cpu`: no GPU: a bare .venv with the CPU build of torch installed first (the Makefile's TORCH_CPU).

    python3 scripts/venv_mode.py --gpu "$(HAS_GPU)"

In `system` mode the Makefile then makes .venv with this script too (`--make-venv VENV`): with
--system-site-packages, which sees the packages of this Python's base interpreter, and, when this
Python is itself a virtual environment (a venv, uv, conda: the H200's python3 is one), a .pth file
in .venv that adds this environment's site-packages, where its torch lives. pip in .venv then finds
torch and every other installed requirement there and downloads nothing. With no pip of its own
in .venv, this environment's pip (found through the same .pth) installs into .venv.

Standard library only, and no syntax newer than Python 3.6, so any python3 can say why it is not
used.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_PYTHON = (3, 11)


def version_tuple(text):
    """'2.11.0+cu130' -> (2, 11, 0); '3.6.0rc1' -> (3, 6, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", re.split(r"[+a-zA-Z-]", text or "", maxsplit=1)[0])[:3])


def minimums(pyproject=os.path.join(ROOT, "pyproject.toml")):
    """{'torch': (2, 4), 'triton': (3, 6)} from pyproject's dependencies."""
    with open(pyproject) as f:
        text = f.read()
    out = {}
    for name in ("torch", "triton"):
        m = re.search(r'"%s\s*>=\s*([0-9.]+)' % name, text)
        out[name] = version_tuple(m.group(1)) if m else ()
    return out


def found_here():
    """What this Python has: {'python': (3, 11, 7), 'torch': '2.11.0+cu130' or None, 'torch_gpu': bool,
    'triton': '3.6.0' or None, 'setuptools': '69.0' or None, 'why': {name: error}}."""
    info = {"python": tuple(sys.version_info[:3]), "torch": None, "torch_gpu": False, "triton": None,
            "setuptools": None, "why": {}}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_gpu"] = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
    except Exception as e:  # absent, or a broken install (missing CUDA libraries)
        info["why"]["torch"] = "%s: %s" % (type(e).__name__, e)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:
        info["why"]["triton"] = "%s: %s" % (type(e).__name__, e)
    try:
        import setuptools

        info["setuptools"] = setuptools.__version__
        import wheel  # noqa: F401 - setuptools < 70.1 builds an editable install through it

        info["wheel"] = True
    except Exception:
        pass
    return info


def decide(has_gpu, info, mins):
    """(mode, pip flags, reason) for a machine with or without a GPU and this Python's `info`."""
    if not has_gpu:
        return "cpu", "", "no GPU (nvidia-smi -L failed): .venv gets the CPU build of torch"
    py = ".".join(map(str, info["python"]))
    problems = []
    if tuple(info["python"]) < MIN_PYTHON:
        problems.append("this Python is %s (moebench needs >= %s)" % (py, ".".join(map(str, MIN_PYTHON))))
    for name in ("torch", "triton"):
        have, need = info.get(name), mins.get(name, ())
        if have is None:
            problems.append("%s does not import (%s)" % (name, info["why"].get(name, "not installed")))
        elif version_tuple(have) < tuple(need):
            problems.append("%s %s is older than the minimum %s" % (name, have, ".".join(map(str, need))))
    if info.get("torch") is not None and not info.get("torch_gpu"):
        problems.append("torch %s is a CPU build" % info["torch"])
    if problems:
        return "cuda", "", ("a GPU, but this Python's torch and triton cannot be reused (%s): pip installs torch "
                            "into a bare .venv (a CUDA build, several GB)" % "; ".join(problems))
    st = version_tuple(info.get("setuptools"))
    flags = "--no-build-isolation" if st >= (70, 1) or (st >= (61,) and info.get("wheel")) else ""
    return "system", flags, ("a GPU, and this Python (%s) has torch %s and triton %s: .venv reuses them "
                             "(--system-site-packages); no second CUDA torch is downloaded" %
                             (py, info["torch"], info["triton"]))


def make_venv(venv):
    """.venv over this Python, reusing its packages: --system-site-packages, and a .pth file with
    this environment's own site-packages when this Python is a virtual environment (whose packages
    --system-site-packages alone would not see). Returns the .pth file written, or None."""
    import site
    import venv as venv_module

    inside = sys.prefix != sys.base_prefix
    paths = [p for p in site.getsitepackages() if os.path.isdir(p)] if inside else []
    has_pip = any(os.path.isdir(os.path.join(p, "pip")) for p in paths)
    venv_module.EnvBuilder(system_site_packages=True, with_pip=not has_pip, symlinks=os.name != "nt").create(venv)
    if not paths:
        return None
    site_dir = os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    pth = os.path.join(site_dir, "_moebench_reuse.pth")
    with open(pth, "w") as f:
        f.write("# made by scripts/venv_mode.py: the packages of the environment .venv was made from\n")
        f.write("".join(p + "\n" for p in paths))
    return pth


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="", help="non-empty: the machine has a GPU (the Makefile's HAS_GPU)")
    ap.add_argument("--make-venv", metavar="VENV", help="make VENV over this Python, reusing its packages")
    a = ap.parse_args(argv)
    if a.make_venv:
        pth = make_venv(a.make_venv)
        sys.stderr.write("make: %s reuses %s%s\n" % (a.make_venv, sys.prefix, " (through %s)" % pth if pth else ""))
        return 0
    has_gpu = bool(a.gpu.strip()) and a.gpu.strip() != "0"
    mode, flags, why = decide(has_gpu, found_here() if has_gpu else {}, minimums())
    sys.stderr.write("make: %s\n" % why)
    print(("%s %s" % (mode, flags)).strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
