#!/usr/bin/env bash
# The GPU suite (tests/gpu) with its log: commit and device first, every test's outcome and what it
# measured (tests/gpu/conftest.py writes it). Commit the log as results/<device>/gpu-tests.txt.
#   scripts/gpu-tests.sh LOG [PYTEST ARGS...]
# Needs a CUDA device; TRITON_INTERPRET=0, or tests/conftest.py runs kernels under the interpreter
# and skips every gpu test. Set MOEBENCH_COMMIT where the tree has no .git
# of its own (the log names moebench's commit only: moebench.core.provenance.git_commit).
set -uo pipefail
LOG=${1:?usage: scripts/gpu-tests.sh LOG [PYTEST ARGS...]}
shift
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
MOEBENCH_GPU_LOG="$LOG" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rfEs "$@"
