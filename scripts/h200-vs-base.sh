#!/usr/bin/env bash
# This tree's count-block and act-grid against an older moebench's, in one device call: fresh
# processes alternating BASE, NEW, BASE, NEW, then `compare --fail-on-regression` both ways between
# every BASE and NEW run. A benchmark, not a test.
#   [RUNS=2] scripts/h200-vs-base.sh BASE_TREE OUT [SWEEPS...]    (default sweeps: count-block act-grid)
# BASE_TREE: the older tree (e.g. `git archive a931c94 | tar x -C .base`), whose results are
# written with its own code; MOEBENCH_COMMIT_BASE names its commit. Upstream kernels come from
# $MOEBENCH_MEGATRON_LM for both.
set -uo pipefail
BASE=${1:?usage: scripts/h200-vs-base.sh BASE_TREE OUT [SWEEPS...]}
OUT=${2:?usage: scripts/h200-vs-base.sh BASE_TREE OUT [SWEEPS...]}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd) || exit 2  # the runs cd into each tree
shift 2
SWEEPS=${*:-count-block act-grid}
NEW=$PWD
export PYTHONUNBUFFERED=1
for s in $SWEEPS; do
  for i in $(seq "${RUNS:-2}"); do
    for side in base new; do
      tree=$NEW; commit=${MOEBENCH_COMMIT:-}
      [ $side = base ] && { tree=$BASE; commit=${MOEBENCH_COMMIT_BASE:-}; }
      echo "+ $side $s run $i [$SECONDS s]"
      (cd "$tree" && MOEBENCH_COMMIT=$commit PYTHONPATH=$tree python3 -m moebench sweep "$s" \
         --out "$OUT/$side$i" >"$OUT/$side$i-$s.log" 2>&1) || echo "  exit $?"
    done
  done
  for b in $(seq "${RUNS:-2}"); do
    for n in $(seq "${RUNS:-2}"); do
      for pair in "base$b new$n" "new$n base$b"; do
        set -- $pair
        PYTHONPATH=$NEW python3 -m moebench compare "$OUT/$1/h200/$s.json" "$OUT/$2/h200/$s.json" \
          --fail-on-regression >"$OUT/compare-$s-$1-$2.txt" 2>&1
        echo "compare $s $1 -> $2: exit $? ($(grep -m1 'matched cases' "$OUT/compare-$s-$1-$2.txt"))"
      done
    done
  done
done
