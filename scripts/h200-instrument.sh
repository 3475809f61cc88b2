#!/usr/bin/env bash
# Everything of issue 16 (items 1, 3, 4) and issue 15 item 8 that needs the GPU, in one device call
# of about 7 minutes. A benchmark run, not a test. Writes under OUT (default $OUT, else ./instrument-out):
#   instrument.tgz   everything below, for results/h200/
#   gpu-tests.txt    the GPU suite's log (commit, device, outcomes, what each test measured)
#   TIMER.md         a draft of results/h200/TIMER.md: nvbench/do_bench/profiler agreement per case, the
#                    spread of back-to-back runs per case and method, the run-to-run study, the wall profile
#   study.md, wall_profile.md, summary.txt
# Steps, each under its own time limit, so a stuck step costs only itself:
#   1 ceilings (moebench device --remeasure), copied under every later --out
#   2 the GPU suite (scripts/gpu-tests.sh)
#   3 run A: sweep count-block and act-grid with --cross-check dobench,nvbench,profiler
#     (nvbench only where `import cuda.bench` works; the reason is in env.txt otherwise)
#   4 the run-to-run cause study (scripts/study/timer_study.py cause, strata), with STUDY_CAUSE=1
#   5 back-to-back runs of the default method (scripts/study/timer_study.py methods: 5 runs, or what fits;
#     METHODS='{"name": "timing settings", ...}' for candidates)
#   6 the wall-time profile of sweep and verify (scripts/wall_profile.py), in what is left
#
# nvbench comes as a wheel (the device has no registry). Here, once, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --python-version 3.12 --only-binary=:all: --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 cuda-bench==0.3.0 -d .whl
# and the device call (carry .whl):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH && MOEBENCH_COMMIT=<sha> bash scripts/h200-instrument.sh
set -uo pipefail
OUT=${1:-${OUT:-instrument-out}}
W=/tmp/moebench-instrument
BUDGET=${BUDGET:-530}   # seconds this script may run (600 per device command, less the wheel install)
rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# moebench's own commit only (never that of a repository the tree was copied into): records.git_commit
export MOEBENCH_COMMIT=${MOEBENCH_COMMIT:-$(python3 -c 'from moebench.core.provenance import git_commit; print(git_commit() or "unknown")' 2>/dev/null || echo unknown)}
SUMMARY=$W/summary.txt
say() { echo "[$(printf '%4d' $SECONDS) s] $*" | tee -a "$SUMMARY"; }
bundle() {  # what has been made so far, under OUT (re-made after every step: a cut run keeps it)
  cp "$SUMMARY" "$OUT/" 2>/dev/null
  cp "$W/gpu-tests.txt" "$W/TIMER.md" "$W/study/study.md" "$W/wall/wall_profile.md" "$OUT/" 2>/dev/null
  tar czf "$OUT/instrument.tgz" -C "$W" --exclude='*.partial.jsonl' . 2>/dev/null
}
step() {  # step SECONDS LOGNAME COMMAND...: run with a time limit, log to W/LOGNAME.log
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  say "$name: exit $rc in $((SECONDS - t0)) s"
  bundle
  return $rc
}
left() { echo $((BUDGET - SECONDS)); }

say "commit $MOEBENCH_COMMIT; $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null)"
python3 - >"$W/env.txt" 2>&1 <<'PY'
import platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
try:
    import cuda.bench as b, cuda.bindings as cb
    b.State
    print("cuda-bench", b.__version__, "cuda-bindings", cb.__version__)
except Exception as e:
    print("nvbench unavailable:", type(e).__name__, e)
PY
cat "$W/env.txt" | tee -a "$SUMMARY"
CROSS=dobench,nvbench,profiler
grep -q "^cuda-bench" "$W/env.txt" || { CROSS=dobench,profiler; say "nvbench not importable: run A without it"; }

# 1 ceilings, measured once, copied under every later --out
step 60 device python3 -m moebench device --out "$W/dev" --remeasure
CEIL=$(ls "$W"/dev/*/device.json 2>/dev/null | head -1)
SLUG=$(basename "$(dirname "${CEIL:-$W/dev/h200/device.json}")")
seed_ceilings() { mkdir -p "$1/$SLUG"; [ -n "$CEIL" ] && cp "$CEIL" "$1/$SLUG/device.json"; }

# 2 the GPU suite
step 240 gpu-suite bash scripts/gpu-tests.sh "$W/gpu-tests.txt"
tail -3 "$W/gpu-suite.log" | tee -a "$SUMMARY"

# 3 run A: the default sweeps with every cross-check (nvbench runs once per process: one sweep each)
seed_ceilings "$W/A"
MOEBENCH_NVBENCH_DIR=$W/nvbench-count-block step 150 runA-count-block \
  python3 -m moebench sweep count-block --out "$W/A" --cross-check "$CROSS"
MOEBENCH_NVBENCH_DIR=$W/nvbench-act-grid step 180 runA-act-grid \
  python3 -m moebench sweep act-grid --out "$W/A" --cross-check "$CROSS"

# 4 the cause of the run-to-run outlier and the address law (STUDY_CAUSE=1; results/h200/instrument/ has them)
if [ "${STUDY_CAUSE:-0}" = 1 ]; then
  step 150 study-cause python3 scripts/study/timer_study.py cause "$W/study" --processes 4
  step 60 study-strata python3 scripts/study/timer_study.py strata "$W/study"
fi

# 5 back-to-back runs per timing method, as many as fit before the wall profile's reserve
WALL_RESERVE=80
DEADLINE=$(( $(left) - WALL_RESERVE - 20 ))
step $(( DEADLINE > 60 ? DEADLINE + 60 : 120 )) study-methods python3 scripts/study/timer_study.py methods "$W/study" \
  --runs 5 --ceilings "${CEIL:-/nonexistent}" --deadline "$DEADLINE" --methods "${METHODS:-{\"current\": \"\"}}"
python3 scripts/study/timer_study.py report "$W/study" >/dev/null 2>&1

# 6 where each command's time goes (Triton's cache is warm from the steps above; verify act-grid
# twice: its first run compiles the swiglu and squared_relu kernels at N = 768)
step $(( $(left) > 45 ? $(left) : 45 )) wall python3 scripts/wall_profile.py "$W/wall" "sweep count-block" \
  "sweep act-grid" "verify count-block" "verify act-grid" "verify act-grid" ${CEIL:+--ceilings "$CEIL"}
grep -E "^\| \`" "$W/wall/wall_profile.md" 2>/dev/null | head -8 | tee -a "$SUMMARY"

# the TIMER.md draft: run A with the current method's back-to-back runs, then every other method
python3 - "$W" "$SLUG" >"$W/timer-report.log" 2>&1 <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts")
from timer_report import build
w, slug = Path(sys.argv[1]), sys.argv[2]
m = json.loads((w / "study/methods.json").read_text()) if (w / "study/methods.json").exists() else {"methods": {}}
parts = []
cur = sorted((w / "study/methods/current").glob("run*"))
runs = [w / "A"] + cur
parts.append(build(runs, ["count-block", "act-grid"], slug,
                   f"Run 1 = `moebench sweep NAME --cross-check dobench,nvbench,profiler`; runs 2-{len(runs)} = the same "
                   "sweeps back to back in fresh processes (scripts/study/timer_study.py methods, method `current`).",
                   "# Timer trust report (draft from scripts/h200-instrument.sh)"))
for name, settings in m["methods"].items():
    if name == "current":
        continue
    rs = sorted((w / "study/methods" / name).glob("run*"))
    if len(rs) >= 2:
        parts.append(build(rs, ["count-block", "act-grid"], slug, f"`--timing {settings}`: {len(rs)} back-to-back runs.",
                           f"# Method `{name}`"))
for extra in (w / "study/study.md", w / "wall/wall_profile.md"):
    if extra.exists():
        parts.append(extra.read_text())
(w / "TIMER.md").write_text("\n\n".join(parts) + "\n")
PY
say "TIMER.md draft: exit $?"

grep -E "^\*\*|^- moebench vs|^- spread" "$W/TIMER.md" 2>/dev/null | head -20 | tee -a "$SUMMARY"
say "done"
bundle
ls -la "$OUT"
