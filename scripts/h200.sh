#!/usr/bin/env bash
# Every GPU result under results/h200/, in one session on the device. A benchmark, not a test.
#   scripts/h200.sh OUT      (then copy OUT/A/h200/* into results/h200/)
# Run A carries the cross-checks (do_bench_cudagraph, profiler kernel time); run B repeats the
# default sweeps back to back for the run-to-run spread; TIMER.md compares them.
set -uo pipefail
OUT=${1:?usage: scripts/h200.sh OUT}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mb() { echo "+ moebench $*"; python3 -m moebench "$@"; }
mkdir -p "$OUT/A/h200" "$OUT/B/h200" "$OUT/C/h200"
mb device --out "$OUT/A" --remeasure
cp "$OUT/A/h200/device.json" "$OUT/B/h200/"; cp "$OUT/A/h200/device.json" "$OUT/C/h200/"
mb sweep count-block --out "$OUT/A" --cross-check dobench,profiler
mb sweep act-grid --out "$OUT/A" --cross-check dobench,profiler
mb sweep count-block --out "$OUT/B"
mb sweep act-grid --out "$OUT/B"
mb sweep act-grid-rows --out "$OUT/A"
mb sweep count-variants --out "$OUT/A"
mb sweep act-variants --out "$OUT/A"
mb ab count-block --off block_size=1024 --on block_size=128 --arms 4 --iters 5 --out "$OUT/A"
mb sweep act-grid --out "$OUT/C" --l2 cold
mb verify count-block --out "$OUT/A"
mb verify act-grid --out "$OUT/A"
python3 -m moebench.analysis.timer_report "$OUT/A" "$OUT/B" --sweeps count-block,act-grid -o "$OUT/A/h200/TIMER.md" \
  --header "Produced by scripts/h200.sh: run A = sweeps with --cross-check dobench,profiler; run B = the same sweeps again, back to back, in a new process."
python3 scripts/timer_study.py cause "$OUT/study"  # back-to-back methods: scripts/h200-instrument.sh
