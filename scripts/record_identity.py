"""Are two runs' records the same case by case? For a refactor that must not change a number.

    python scripts/record_identity.py BEFORE.json AFTER.json [--fields ids,status,checks,launch,work]

Compares, per record (matched by case_id), the fields named (default: the set of case ids, then
status, checks, launch and work of each record; `params`, `launch_from`, `error`, `timing` and
`cross` can be added). Timings differ between any two runs, so they are left out by default.
Prints one line per difference and a last summary line; exits 1 when anything differs, 2 when a
file cannot be read. Reads the results JSON only (no torch, no moebench import).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_FIELDS = ("ids", "status", "checks", "launch", "work")


def load(path: Path) -> dict[str, dict]:
    doc = json.loads(path.read_text())
    records = doc["records"] if isinstance(doc, dict) else doc
    out: dict[str, dict] = {}
    for r in records:
        out[r["case_id"]] = r
    return out


def differences(before: dict[str, dict], after: dict[str, dict], fields) -> list[str]:
    diffs = []
    if "ids" in fields:
        for cid in sorted(set(before) - set(after)):
            diffs.append(f"{cid}: only in the first file")
        for cid in sorted(set(after) - set(before)):
            diffs.append(f"{cid}: only in the second file")
    for cid in sorted(set(before) & set(after)):
        for f in fields:
            if f == "ids":
                continue
            a, b = before[cid].get(f), after[cid].get(f)
            if a != b:
                diffs.append(f"{cid}: {f} differs: {json.dumps(a, sort_keys=True, default=str)[:200]} -> "
                             f"{json.dumps(b, sort_keys=True, default=str)[:200]}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--fields", default=",".join(DEFAULT_FIELDS),
                    help="comma list of record fields to compare; 'ids' compares the sets of case ids")
    a = ap.parse_args(argv)
    fields = tuple(f.strip() for f in a.fields.split(",") if f.strip())
    try:
        before, after = load(a.before), load(a.after)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"cannot read the results: {e}", file=sys.stderr)
        return 2
    diffs = differences(before, after, fields)
    for d in diffs:
        print(d)
    n = len(set(before) & set(after))
    print(f"{a.before.name} vs {a.after.name}: {n} records compared on {', '.join(fields)}: "
          + (f"{len(diffs)} differences" if diffs else "identical"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
