"""The record schema, and writing results atomically (temp file + rename, never half-written).

One record per (case, variant): long format. Field order is column order; the dict groups
(params, checks, launch, timing, work, cross) are flattened in that order. Pivot only when
rendering (moebench.core.report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

FORMATS = ("csv", "json", "md", "parquet")


@dataclass
class Record:
    sweep: str
    family: str
    case_id: str
    variant: str
    label: str
    status: str  # ok | mismatch | error | unavailable
    error: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)  # ref_check, baseline_equal, non-vacuity
    launch: dict[str, Any] = field(default_factory=dict)  # what ran: grid, block_size, num_warps, ...
    launch_from: dict[str, Any] = field(default_factory=dict)  # where each resolved launch value came from
    timing: dict[str, Any] = field(default_factory=dict)  # median_us, iqr_us, ... (empty off-GPU)
    work: dict[str, Any] = field(default_factory=dict)  # bytes, floor_us, x_floor, occupancy, ...
    cross: dict[str, Any] = field(default_factory=dict)  # do_bench_cudagraph, profiler kernel time

    GROUPS = ("params", "checks", "launch", "launch_from", "timing", "work", "cross")
    PREFIX = {"launch": "launch_", "launch_from": "launch_from_"}

    def to_row(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k not in self.GROUPS}
        for g in self.GROUPS:
            for k, v in getattr(self, g).items():
                row.setdefault(self.PREFIX.get(g, "") + k, v)
        return row

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Record":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD (with -dirty for uncommitted changes); $MOEBENCH_GIT_COMMIT where the tree was copied
    without its .git (a remote GPU machine)."""
    if os.environ.get("MOEBENCH_GIT_COMMIT"):
        return os.environ["MOEBENCH_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd or Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(spec, device, *, quick: bool, verify: bool, ceilings: dict, extra: dict | None = None) -> dict:
    from moebench import __version__

    return {
        "sweep": spec.name,
        "spec_path": str(spec.path),
        "spec_sha256": spec.sha256,
        "model": spec.model_name,
        "seed": spec.seed,
        "quick": quick,
        "matrix": "verify" if verify else "sweep",
        "command": " ".join(["moebench"] + sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "moebench": __version__,
        "git_commit": git_commit(),
        "device": device.to_dict(),
        "ceilings": ceilings,
        "timing": asdict(spec.timing),
        **(extra or {}),
    }


def result_stem(spec_name: str, *, quick: bool, verify: bool) -> str:
    return spec_name + ("-verify" if verify else "") + ("-quick" if quick else "")


class ResultsWriter:
    """Streams records to `<stem>.partial.jsonl` as they finish, and writes the final files
    atomically. An interrupted sweep therefore loses at most the case in flight."""

    def __init__(self, out_dir: Path, stem: str, prov: dict, formats: Iterable[str]):
        self.out_dir = out_dir
        self.stem = stem
        self.prov = prov
        self.formats = tuple(formats)
        self.partial = out_dir / f"{stem}.partial.jsonl"
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, rec: Record) -> None:
        with open(self.partial, "a") as f:
            f.write(json.dumps({"spec_sha256": self.prov["spec_sha256"], "record": rec.to_json()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finalize(self, records: list[Record], *, complete: bool, markdown: str | None = None) -> list[Path]:
        prov = {**self.prov, "complete": complete, "n_records": len(records)}
        paths = []
        if "json" in self.formats:
            p = self.out_dir / f"{self.stem}.json"
            atomic_write_text(p, json.dumps({"provenance": prov, "records": [r.to_json() for r in records]},
                                            indent=1, default=str) + "\n")
            paths.append(p)
        rows = [r.to_row() for r in records]
        if "csv" in self.formats or "parquet" in self.formats:
            import pandas as pd

            df = pd.DataFrame(rows)
            if "csv" in self.formats:
                p = self.out_dir / f"{self.stem}.csv"
                atomic_write_text(p, df.to_csv(index=False))
                paths.append(p)
            if "parquet" in self.formats:
                p = self.out_dir / f"{self.stem}.parquet"
                import io

                buf = io.BytesIO()
                df.to_parquet(buf, index=False)
                atomic_write_bytes(p, buf.getvalue())
                paths.append(p)
        if "md" in self.formats and markdown is not None:
            p = self.out_dir / f"{self.stem}.md"
            atomic_write_text(p, markdown)
            paths.append(p)
        if self.partial.exists():
            self.partial.unlink()
        return paths


def load_results(path: Path) -> tuple[dict, list[Record]]:
    """Read a results JSON (or a .partial.jsonl) back into provenance + records."""
    from moebench.errors import UsageError

    if not path.exists():
        raise UsageError(f"{path}: no such results file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file; expected a results .json")
    try:
        if path.suffix == ".jsonl":
            recs, prov = [], {}
            for line in path.read_text().splitlines():
                if line.strip():
                    d = json.loads(line)
                    prov.setdefault("spec_sha256", d.get("spec_sha256"))
                    recs.append(Record.from_json(d["record"]))
            return prov, recs
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("records", []), list):
            raise ValueError("expected an object with 'provenance' and 'records'")
        return doc.get("provenance", {}), [Record.from_json(r) for r in doc.get("records", [])]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a moebench results file ({e})") from None


def previous_records(out_dir: Path, stem: str, spec_sha256: str) -> dict[str, Record]:
    """Completed records of an earlier run of the same spec (final file and partial stream),
    keyed by case id; used by --resume."""
    found: dict[str, Record] = {}
    for p in (out_dir / f"{stem}.json", out_dir / f"{stem}.partial.jsonl"):
        if not p.exists():
            continue
        try:
            prov, recs = load_results(p)
        except Exception:  # noqa: BLE001 - an unreadable old file is simply not resumed from
            continue
        if prov.get("spec_sha256") != spec_sha256:
            continue
        for r in recs:
            if r.status == "ok":
                found[r.case_id] = r
    return found
