#!/usr/bin/env bash
# Issue 17 on the H200 in one device session, about 3-4 minutes: which microbenchmark wins survive
# in a whole MoE layer step. A benchmark, not a test.
#   scripts/h200-layer.sh OUT [--verify]      then copy OUT/h200/layer* into results/h200/
# 1. `sweep layer`: every count / activation configuration inside the step (decode, decode in a
#    1024-token graph, a 2048-token prefill chunk) and megatron-core's fused MoE where importable.
# 2. `ab layer-count`, `ab layer-act`: seed 000's and seed 001's change, each over the kernel alone
#    on the layer's tensors, one layer step and a 48-layer graph, interleaved OFF/ON/OFF/ON.
# 3. the same A/B for the best activation cap the layer sweep found (skipped when that is 8192, done
#    in 2., or 512, which is the legacy grid itself at these M).
# 4. with --verify: the layer's correctness matrix (165 cases, no timing).
# 5. the layer report, from these files and the kernel sweeps' results/h200/count-block-ab.json
#    and act-grid-rows.json: OUT/h200/layer-report.md (results/h200/REPORT.md quotes it, tagged).
set -uo pipefail
OUT=${1:?usage: scripts/h200-layer.sh OUT [--verify]}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mb() { echo "+ moebench $*"; python3 -m moebench "$@"; }
mb sweep layer --out "$OUT"
DEV=$(dirname "$(ls "$OUT"/*/layer.json | head -1)")
mb ab layer-count --off count_block_size=1024 --on count_block_size=128 --arms 4 --iters 5 --out "$OUT"
mb ab layer-act --off act_variant=legacy --on act_variant=capped --arms 4 --iters 5 --out "$OUT"
CAP=$(python3 scripts/layer_report.py best-cap "$DEV/layer.json" --default 1024)
echo "best activation cap in the layer sweep at decode: $CAP"
if [ "$CAP" != 8192 ] && [ "$CAP" != 512 ]; then
  mb ab layer-act --off act_variant=legacy --on act_variant=capped --on act_grid_cap="$CAP" --arms 4 --iters 5 \
    --out "$OUT/best"
  for ext in json md; do mv "$OUT/best/$(basename "$DEV")/layer-act-ab.$ext" "$DEV/layer-act-best-ab.$ext"; done
fi
if [ "${2:-}" = --verify ]; then mb verify layer --out "$OUT"; fi
python3 scripts/layer_report.py "$DEV" --kernel-dir "${KERNEL_DIR:-results/h200}" -o "$DEV/layer-report.md"
cat "$DEV/layer-report.md"
