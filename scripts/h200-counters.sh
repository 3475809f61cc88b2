#!/usr/bin/env bash
# Issue 25 on the GPU, in one device call of about 4-5 minutes: hardware counters per case.
# Writes under OUT (default $OUT, else ./counters-out); OUT/counters.tgz bundles everything:
#   summary.txt                 what ran, exit codes, seconds, the tool and its version
#   plain/<slug>/count-block.*  count-block without --counters (item 5: the timings it is compared with)
#   counters/<slug>/count-block.*, act-grid.*   the sweeps with --counters (pages have the section)
#   act-grid-counters.png       the measured occupancy curve (moebench plot --counters)
#   compare-count-block.md      count-block with vs without --counters (moebench compare: noise-aware)
#   raw/<sweep>/ncu.csv, ncu.log, job.json   the tool's own output ($MOEBENCH_COUNTERS_RAW)
#   *.log                       each step's output
# Steps, each under its own time limit, so a stuck step costs only itself:
#   1 ceilings (moebench device --remeasure), copied under both --out roots
#   2 sweep count-block (no counters)            3 sweep count-block --counters (right after it)
#   4 sweep act-grid --counters                  5 compare, plot, bundle
# Run from the repository root on the H200 (nothing to install: ncu is /usr/local/cuda/bin/ncu):
#   MOEBENCH_COMMIT=<sha> bash scripts/h200-counters.sh "$OUT"
set -uo pipefail
OUT=${1:-${OUT:-counters-out}}
W=/tmp/moebench-counters
rm -rf "$W"; mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export MOEBENCH_COMMIT=${MOEBENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export MOEBENCH_NCU=${MOEBENCH_NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
export MOEBENCH_COUNTERS_RAW=$W/raw
SUMMARY=$W/summary.txt
say() { echo "[$(printf '%4d' $SECONDS) s] $*" | tee -a "$SUMMARY"; }
bundle() {  # re-made after every step: a cut run keeps what it has
  tar czf "$OUT/counters.tgz" -C "$W" --exclude='*.partial.jsonl' . 2>/dev/null
  cp "$SUMMARY" "$OUT/" 2>/dev/null
}
step() {  # step SECONDS NAME COMMAND...: run with a time limit, log to W/NAME.log
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  say "$name: exit $rc in $((SECONDS - t0)) s; $(grep -E '^counters: |: [0-9]+/[0-9]+ ' "$W/$name.log" | tr '\n' ' ')"
  bundle
  return $rc
}

say "commit $MOEBENCH_COMMIT; $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null)"
say "tool: $MOEBENCH_NCU: $("$MOEBENCH_NCU" --version 2>&1 | grep -i version | tail -1)"
"$MOEBENCH_NCU" --query-metrics >"$W/query-metrics.txt" 2>&1
say "optional metrics listed: $(grep -oE '^(smsp__thread_inst_executed|l1tex__t_requests_pipe_lsu_mem_global_op_(red|atom)) ' \
  "$W/query-metrics.txt" | tr -d ' ' | tr '\n' ' ')"

# 1 ceilings, measured once, copied under both --out roots
step 60 device python3 -m moebench device --out "$W/dev" --remeasure
CEIL=$(ls "$W"/dev/*/device.json 2>/dev/null | head -1)
SLUG=$(basename "$(dirname "${CEIL:-$W/dev/h200/device.json}")")
for root in plain counters; do mkdir -p "$W/$root/$SLUG"; [ -n "$CEIL" ] && cp "$CEIL" "$W/$root/$SLUG/device.json"; done

# 2, 3 count-block without and then with counters (item 5: the timings must agree within noise)
step 60 count-block-plain python3 -m moebench sweep count-block --out "$W/plain"
step 100 count-block-counters python3 -m moebench sweep count-block --out "$W/counters" --counters
# 4 act-grid with counters
step 170 act-grid-counters python3 -m moebench sweep act-grid --out "$W/counters" --counters

# 5 compare (no time asserted here: the page says SAME / FASTER / SLOWER per case), plot
python3 -m moebench compare "$W/plain/$SLUG/count-block.json" "$W/counters/$SLUG/count-block.json" \
  >"$W/compare-count-block.md" 2>&1
say "compare count-block plain vs --counters: exit $? ($(grep -oE '(SAME|FASTER|SLOWER|UNCLEAR)' "$W/compare-count-block.md" \
  | sort | uniq -c | tr '\n' ' '))"
python3 -m moebench plot "$W/counters/$SLUG/act-grid.json" --counters -o "$W/act-grid-counters.png" \
  >"$W/plot.log" 2>&1
say "plot --counters: exit $?; $(tail -1 "$W/plot.log")"
python3 - "$W/counters/$SLUG" >>"$SUMMARY" 2>&1 <<'PY'
import json, sys, collections
from pathlib import Path
for name in ("count-block", "act-grid"):
    p = Path(sys.argv[1]) / f"{name}.json"
    if not p.exists():
        print(name, "no results"); continue
    recs = json.loads(p.read_text())["records"]
    c = [r["cross"].get("counters") or {} for r in recs if r["status"] == "ok"]
    got = [x for x in c if "unavailable" not in x]
    bounds = collections.Counter((r["cross"].get("verdict") or {}).get("bound") for r in recs if r["status"] == "ok")
    far = sum(1 for r in recs if (r["cross"].get("work_check") or {}).get("far"))
    print(f"{name}: {len(got)}/{len(c)} ok cases with counters; bounds {dict(bounds)}; {far} far from the work model;",
          "unavailable:", {x["unavailable"] for x in c if "unavailable" in x} or "none")
PY
say "done"
bundle
