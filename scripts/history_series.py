#!/usr/bin/env python3
"""Snapshot trees of a list of commits, for a results history across commits (issue 26, item 3).

    scripts/history_series.py [--out .series] [--sweep count-block] [--force] COMMIT...

OUT is deleted and remade: only an earlier series (its .moebench-series marker), an empty
folder, or with --force any other folder, never a checkout or a folder that holds one. For each
commit, in the order given, `git archive` writes its tree (without results/, which a
sweep does not read, unless --with-results) into OUT/NN-<short hash>/, and OUT/series.tsv lists
"NN <full hash> <folder>". OUT/run.sh then runs, from the checkout's root on a GPU machine (the
tree travels without .git, so the snapshots are the only way to run old commits there):

    bash .series/run.sh [RESULTS_DIR]        (default RESULTS_DIR: .series/runs)

one `moebench sweep SWEEP` in each snapshot, in commit order, with MOEBENCH_COMMIT and
MOEBENCH_GIT_COMMIT set to the snapshot's commit (and git's search for a repository stopped at
OUT, so a snapshot never reports the enclosing checkout's commit), then, with the checkout's own
moebench, `history add` of every run into RESULTS_DIR/history.sqlite and `history check`
(its table also in RESULTS_DIR/check.md). OUT is git-ignored. Nothing here needs torch.
"""

from __future__ import annotations

import argparse
import io
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".moebench-series"  # in every folder this script makes: the only folders it deletes unasked
RUNNER = """#!/usr/bin/env bash
# Made by scripts/history_series.py: one `moebench sweep {sweep}` per snapshot below, in commit order,
# then the history of them all. Run from the checkout's root: bash {out}/run.sh [RESULTS_DIR]
set -uo pipefail
SERIES={out_q}
RES=${{1:-$SERIES/runs}}
PY=${{PYTHON:-python3}}
mkdir -p "$RES"
RES=$(cd "$RES" && pwd)
export GIT_CEILING_DIRECTORIES=$(cd "$SERIES" && pwd) PYTHONUNBUFFERED=1
fail=0
while read -r n commit dir; do
  echo "+ [$SECONDS s] $n $commit: moebench sweep {sweep}"
  ( cd "$SERIES/$dir" && MOEBENCH_COMMIT=$commit MOEBENCH_GIT_COMMIT=$commit PYTHONPATH=$PWD \\
      "$PY" -m moebench sweep {sweep} {sweep_args}--out "$RES/$dir" ) >"$RES/$dir.log" 2>&1
  rc=$?; echo "  exit $rc"; [ $rc -eq 0 ] || fail=1
done < "$SERIES/series.tsv"
files=$(find "$RES" -name '{sweep}.json' -o -name '{sweep}-quick.json' | sort)
[ -n "$files" ] || {{ echo "no {sweep} results under $RES: see the .log files there" >&2; exit 2; }}
"$PY" -m moebench history add $files --db "$RES/history.sqlite" || exit $?
"$PY" -m moebench history check --db "$RES/history.sqlite" --sweep {sweep} --markdown > "$RES/check.md"
rc=$?
cat "$RES/check.md"
"$PY" -m moebench history check --db "$RES/history.sqlite" --sweep {sweep}
echo "history check exit $rc (sweeps: $([ $fail -eq 0 ] && echo all ok || echo some failed))"
exit $rc
"""


def git(repo: Path, *args: str, binary: bool = False):
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=not binary)
    if r.returncode != 0:
        err = r.stderr if not binary else r.stderr.decode(errors="replace")
        raise SystemExit(f"error: git {' '.join(args)}: {err.strip().splitlines()[-1] if err.strip() else 'failed'}")
    return r.stdout


def snapshot(repo: Path, commit: str, dest: Path, with_results: bool) -> None:
    """The commit's tree under dest, from `git archive` (no .git)."""
    paths = ["--", "."] if with_results else ["--", ".", ":(exclude)results", ":(exclude).series"]
    data = git(repo, "archive", "--format=tar", commit, *paths, binary=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.12: refuse links out of dest
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)


def refuse_out(out: Path, checkouts: list[Path], *, force: bool) -> str | None:
    """Why OUT must not be deleted and remade, or None: it is (or holds) a checkout, it is not a
    folder, or it is a folder with files that is not an earlier series (no MARKER) and --force was
    not given. OUT is resolved."""
    for c in checkouts:
        c = c.resolve()
        if out == c or c.is_relative_to(out):
            return f"is the checkout {c} or a folder that holds it: never deleted"
    if not out.exists() and not out.is_symlink():
        return None
    if not out.is_dir() or out.is_symlink():
        return "exists and is not a folder: not replaced"
    if (out / MARKER).is_file() or not any(out.iterdir()) or force:
        return None
    return (f"is not an earlier series (no {MARKER} in it) and is not empty: not deleted (pass --force to delete "
            "it and remake it, or another --out)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commits", nargs="+", help="Commits (any git revision), in series order.")
    ap.add_argument("--repo", type=Path, default=ROOT, help="The git checkout.")
    ap.add_argument("--out", type=Path, default=None, help="Snapshot folder (default: REPO/.series).")
    ap.add_argument("--sweep", default="count-block", help="The sweep run.sh runs in each snapshot.")
    ap.add_argument("--sweep-args", default="", help="Extra arguments of that sweep (e.g. '--cross-check dobench').")
    ap.add_argument("--with-results", action="store_true", help="Keep results/ in the snapshots.")
    ap.add_argument("--force", action="store_true", help="Delete --out even if it is not an earlier series "
                    "(never a checkout or a folder that holds one).")
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    out = (a.out or repo / ".series").resolve()
    full = []
    for c in a.commits:
        r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{c}^{{commit}}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"error: {c}: not a commit of {repo}", file=sys.stderr)
            return 2
        full.append(r.stdout.strip())
    why = refuse_out(out, [repo, ROOT], force=a.force)
    if why:
        print(f"error: --out {a.out or out}: {why}", file=sys.stderr)
        return 2
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by scripts/history_series.py: the next run may delete and remake this folder\n")
    lines = []
    for i, h in enumerate(full):
        d = f"{i + 1:02d}-{h[:10]}"
        snapshot(repo, h, out / d, a.with_results)
        lines.append(f"{i + 1:02d}\t{h}\t{d}")
    (out / "series.tsv").write_text("\n".join(lines) + "\n")
    try:
        rel = out.relative_to(repo)
    except ValueError:
        rel = out
    extra = " ".join(shlex.quote(x) for x in shlex.split(a.sweep_args))
    (out / "run.sh").write_text(RUNNER.format(sweep=a.sweep, out=rel, out_q=shlex.quote(str(rel)),
                                              sweep_args=extra + " " if extra else ""))
    print(f"{len(full)} snapshots in {out}; run from {repo}: bash {rel}/run.sh [RESULTS_DIR]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
