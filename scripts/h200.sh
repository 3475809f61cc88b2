#!/usr/bin/env bash
# Every kernel result under results/h200/ (and the layer results), in one device call of under ten
# minutes. A benchmark, not a test. Most important first: each step's files are bundled into
# OUT/h200.tgz as soon as it ends, so a call cut short still returns what finished.
#   scripts/h200.sh OUT        then unpack OUT/h200.tgz and copy its h200/ into results/h200/
# The upstream kernels: megatron-core's wheel in .whl/ (installed by the caller, see
# docs/reproduce.md) and a Megatron-LM checkout's megatron/ in
# .upstream/Megatron-LM ($MOEBENCH_MEGATRON_LM, its commit in $MOEBENCH_MEGATRON_LM_COMMIT).
# The timer study, the GPU suite, nvbench and the wall profile are scripts/h200-instrument.sh.
set -uo pipefail
OUT=${1:?usage: scripts/h200.sh OUT}
R=/tmp/moebench-h200
rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LOG=$R/h200/run.log
mkdir -p "$R/h200"
mb() {
  echo "+ moebench $* [$SECONDS s]" | tee -a "$LOG"
  python3 -m moebench "$@" >>"$LOG" 2>&1
  echo "  exit $? [$SECONDS s]" | tee -a "$LOG"
  tar czf "$OUT/h200.tgz" -C "$R" --exclude='*.partial.jsonl' --exclude='*.lock' h200
}
mb device --out "$R" --remeasure
# seed 000 and 001, the faithful kernels beside Megatron's, and the conformance page
mb sweep count-block --out "$R" --cross-check dobench
mb sweep act-grid --out "$R" --cross-check dobench
mb sweep count-grid --out "$R"
mb sweep act-upstream --out "$R"
mb conformance "$R/h200/count-grid.json" "$R/h200/act-upstream.json" "$R/h200/act-grid.json" \
  -o "$R/h200/upstream-conformance"
mb sweep act-grid-rows --out "$R"
mb ab count-block --off block_size=1024 --on block_size=128 --arms 4 --iters 5 --out "$R"
mb ab act-grid-rows --off grid_cap=512 --on grid_cap=8192 --arms 4 --iters 5 --out "$R"
mb verify count-block --out "$R"
mb verify act-grid --out "$R"
mb sweep count-variants --out "$R"
mb sweep act-variants --out "$R"
# issue 17: the kernels inside a whole layer step (reads the two ab files above)
KERNEL_DIR="$R/h200" bash scripts/h200-layer.sh "$R" >>"$LOG" 2>&1; echo "  layer exit $? [$SECONDS s]" | tee -a "$LOG"
tar czf "$OUT/h200.tgz" -C "$R" --exclude='*.partial.jsonl' --exclude='*.lock' h200
echo "done [$SECONDS s]" | tee -a "$LOG"
