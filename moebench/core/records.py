"""The record schema, the stream of finished records, and writing results so nothing completed is lost.

One record per (case, variant): long format. Field order is column order; the dict groups
(params, checks, launch, timing, work, cross) are flattened in that order. Pivot only when
rendering (moebench.report.sweep).

How a run keeps what it finished (`ResultsWriter`):

- Each finished record is appended to ``OUT/<device>/NAME.partial.jsonl`` and flushed to the OS
  before the next case starts, and fsynced at most every FSYNC_EVERY_S (and at the end): a
  killed process loses nothing flushed; a machine that crashes, at most that second. That stream
  is the source of truth for ``--resume`` whatever ``--format`` says: a run killed at any moment
  (SIGKILL, a full disk) loses at most the case in flight and a torn last line, which the next
  reader drops (cutting the file back to its last complete line).
- The final files (csv, json, md, parquet) are written whole to a temporary file and renamed over
  the old one, with the user's umask. A complete run then removes the stream; an interrupted run
  keeps it beside its INCOMPLETE files.
- A results file is never replaced by one holding fewer records unless ``--force`` says so: the
  records of this run stay in the stream instead.
- Every record carries ``resume_key``, the hash of what determines its numbers: the case (family,
  variant, label, every parameter, the model values and seed among them) and the run's settings
  (`run_settings`: device, whether it was timed, the timer settings with --l2, --cross-check, the
  kill-switch variables of the family, the baseline launch). The spec's bytes are not part of it,
  so a comment or a new axis value keeps every finished record; ``--resume`` keeps exactly the
  records whose key matches and says what it dropped and why.
- One writer per output name: `OutputLock` holds an flock on ``OUT/<device>/.NAME.lock``; a second
  run into the same name stops at once, naming the holder.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from moebench.errors import OutputError, UsageError

FORMATS = ("csv", "json", "md", "parquet")
FSYNC_EVERY_S = 1.0  # the finished-records stream: fsync at most this often (it is flushed after every record)
# the libraries a format needs beyond the package's own dependencies: any one of them will do
FORMAT_LIBRARIES = {"parquet": ("pyarrow", "fastparquet")}


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
    resume_key: str = ""  # hash of what determines this record's numbers (record_key)

    GROUPS = ("params", "checks", "launch", "launch_from", "timing", "work", "cross")
    PREFIX = {"launch": "launch_", "launch_from": "launch_from_"}
    TEXT = ("sweep", "family", "case_id", "variant", "label", "status")

    def to_row(self) -> dict[str, Any]:
        row = {k: _plain(getattr(self, k)) for k in _RECORD_FIELDS if k not in self.GROUPS}
        for g in self.GROUPS:
            pre = self.PREFIX.get(g, "")
            for k, v in getattr(self, g).items():
                row.setdefault(pre + k, _plain(v))
        return row

    def to_json(self) -> dict[str, Any]:
        """The record as plain data, copied: dataclasses.asdict's result, without its deepcopy of
        every value (2280 verify records: 0.02 s against 0.15 s on a 2-core CPU)."""
        return {k: _plain(getattr(self, k)) for k in _RECORD_FIELDS}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Record":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


_RECORD_FIELDS = tuple(f.name for f in fields(Record))


def _plain(v: Any) -> Any:
    """A copy of JSON-like data: dicts, lists and tuples rebuilt, anything else (numbers, text,
    None) shared, as it is immutable in a record."""
    t = type(v)
    if t is dict:
        return {k: _plain(x) for k, x in v.items()}
    if t is list:
        return [_plain(x) for x in v]
    if t is tuple:
        return tuple(_plain(x) for x in v)
    return v


# ----------------------------------------------------------------------------------- checking what was read


class Malformed(ValueError):
    """A results document that is not what moebench writes; `key` is the path to the bad value."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


def _kind(v: Any) -> str:
    from moebench.core.text import kind

    return kind(v)


# Numbers the readers compute with: a string or an object here would fail deep inside a table.
_NUMERIC = {"timing": ("median_us", "min_us", "max_us", "q1_us", "q3_us", "iqr_us", "rel_noise", "n_replays")}


def record_from(d: Any, key: str) -> Record:
    """A record read from a results file, checked field by field; Malformed names the bad key."""
    if not isinstance(d, dict):
        raise Malformed(key, f"expected an object (a record), got {_kind(d)}")
    for f in Record.TEXT:
        if f not in d:
            raise Malformed(f"{key}.{f}", "missing")
        if not isinstance(d[f], str):
            raise Malformed(f"{key}.{f}", f"expected a string, got {_kind(d[f])}")
    for f in ("error", "resume_key"):
        if f in d and not isinstance(d[f], str):
            raise Malformed(f"{key}.{f}", f"expected a string, got {_kind(d[f])}")
    for g in Record.GROUPS:
        if g in d and not isinstance(d[g], dict):
            raise Malformed(f"{key}.{g}", f"expected an object, got {_kind(d[g])}")
    for g, names in _NUMERIC.items():
        for n in names:
            v = d.get(g, {}).get(n)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise Malformed(f"{key}.{g}.{n}", f"expected a number, got {_kind(v)}")
    return Record.from_json(d)


# provenance keys the readers use: the type each must have when present, and its name
_PROVENANCE_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "sweep": ((str,), "a string"), "spec_path": ((str,), "a string"), "spec_sha256": ((str,), "a string"),
    "command": ((str,), "a string"), "matrix": ((str,), "a string"), "device": ((dict,), "an object"),
    "ceilings": ((dict,), "an object"), "timing": ((dict,), "an object"), "settings": ((dict,), "an object"),
    "cross_checks": ((list,), "a list"), "shard": ((list, type(None)), "a list or null"),
    "complete": ((bool,), "true or false"), "quick": ((bool,), "true or false"),
    "page": ((dict,), "an object"), "cases": ((dict, type(None)), "an object or null"),
}
# provenance.page: the type each key must have when present
_PAGE_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "family": ((str,), "a string"), "description": ((str,), "a string"), "pivot": ((dict,), "an object"),
    "baseline": ((dict, type(None)), "an object or null"), "moe_layers": ((int, type(None)), "an integer or null"),
    "host_only": ((bool,), "true or false"),
}


def check_provenance(prov: Any, key: str = "provenance") -> dict:
    if not isinstance(prov, dict):
        raise Malformed(key, f"expected an object, got {_kind(prov)}")
    for k, (types, name) in _PROVENANCE_TYPES.items():
        if k in prov and not isinstance(prov[k], types):
            raise Malformed(f"{key}.{k}", f"expected {name}, got {_kind(prov[k])}")
    for k, (types, name) in _PAGE_TYPES.items():
        v = prov.get("page", {}).get(k)
        if k in prov.get("page", {}) and (not isinstance(v, types) or (isinstance(v, bool) and bool not in types)):
            raise Malformed(f"{key}.page.{k}", f"expected {name}, got {_kind(v)}")
    for k, v in prov.get("page", {}).get("pivot", {}).items():
        if not isinstance(v, str):
            raise Malformed(f"{key}.page.pivot.{k}", f"expected a string, got {_kind(v)}")
    for k, v in (prov.get("cases") or {}).items():
        if not isinstance(v, (str, type(None))):
            raise Malformed(f"{key}.cases.{k}", f"expected the baseline's case id or null, got {_kind(v)}")
    return prov


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise Malformed("", "nested too deeply to be a results file") from None


# ----------------------------------------------------------------------------------- writing files


def _umask() -> int:
    """The process umask (reading it means setting it: put it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failed write (no such folder, a file in the way, no permission, the disk full) into
    an OutputError naming the path."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a whole file or nothing: a temporary file beside it, fsynced, renamed over it. The
    file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's 0600."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~_umask())
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


def writable_dir(path: Path, option: str) -> Path:
    """Create folder `path` (with its parents) and prove a file can be written in it, so a bad
    --out or -o stops the command before any work, naming the option."""
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise UsageError(f"{option}: {p} is not a folder" + ("" if p == path else f" (in {path})"))
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise UsageError(f"{option}: cannot write in {path}: {e.strerror or e}") from None
    return path


def check_formats(text: str, option: str = "--format") -> tuple[str, ...]:
    """`csv,json,md` -> ("csv", "json", "md"): non-empty, known, no repeats, and the library each
    needs importable, all before any case runs."""
    import importlib.util

    fs = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    if not fs:
        raise UsageError(f"{option}: expected a comma list of {', '.join(FORMATS)}, got {text!r}")
    for f in fs:
        if f not in FORMATS:
            raise UsageError(f"{option}: unknown format {f!r}; choose from {', '.join(FORMATS)}")
        libs = FORMAT_LIBRARIES.get(f)
        if libs and not any(importlib.util.find_spec(m) for m in libs):
            raise UsageError(f"{option}: {f} needs {' or '.join(libs)}, which is not installed "
                             f"(pip install {libs[0]}); or drop {f}")
    return fs


# ----------------------------------------------------------------------------------- provenance


# Where the tree has no .git of its own (copied to a GPU machine), the commit it was copied from;
# MOEBENCH_GIT_COMMIT is the older name, still read.
COMMIT_ENV = ("MOEBENCH_COMMIT", "MOEBENCH_GIT_COMMIT")
_PROJECT = Path(__file__).resolve().parents[2]  # the folder that holds the moebench package


def _is_moebench_checkout(top: Path) -> bool:
    """Whether a git work tree's top folder is moebench's own: it holds this very package and a
    pyproject.toml naming the project moebench."""
    try:
        if top.resolve() != _PROJECT:
            return False
        text = (top / "pyproject.toml").read_text()
    except OSError:
        return False
    return any(line.replace(" ", "") == 'name="moebench"' for line in text.splitlines())


def git_commit(cwd: Path | None = None) -> str | None:
    """moebench's own commit: $MOEBENCH_COMMIT when set, else HEAD (with -dirty for uncommitted
    changes) of the git repository that holds this package, and only when that repository is
    moebench's own (a copy of the tree without its .git that sits inside another repository would
    otherwise name that repository's commit); else None (provenance then says "unknown")."""
    for var in COMMIT_ENV:
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    where = _PROJECT
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True,
                             timeout=5)
        if top.returncode != 0 or not _is_moebench_checkout(Path(top.stdout.strip())):
            return None
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def portable_path(path: Path | str) -> str:
    """A spec path as provenance keeps it: relative to the moebench checkout when inside it
    (``sweeps/count-block.yaml``), else relative to the working folder when below it, else
    absolute. A results file then never carries the clone's own location."""
    from moebench.core.spec import PACKAGE_ROOT

    p = Path(path)
    try:
        full = p.resolve()
    except (OSError, RuntimeError):
        return str(p)
    for base in (PACKAGE_ROOT, Path.cwd().resolve()):
        try:
            return str(full.relative_to(base))
        except ValueError:
            continue
    return str(full)


def provenance(spec, device, *, quick: bool, verify: bool, ceilings: dict, extra: dict | None = None) -> dict:
    from moebench import __version__

    return {
        "sweep": spec.name,
        "spec_path": portable_path(spec.path),
        "spec_sha256": spec.sha256,
        "model": spec.model_name,
        "seed": spec.seed,
        "quick": quick,
        "matrix": "verify" if verify else "sweep",
        "command": " ".join(["moebench"] + sys.argv[1:]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "moebench": __version__,
        "git_commit": git_commit() or "unknown",
        "device": device.to_dict(),
        "ceilings": ceilings,
        "timing": asdict(spec.timing),
        # what a page needs of the spec, so that render and merge read the results file alone
        "page": {"family": spec.family.name, "description": spec.description, "pivot": dict(spec.pivot),
                 "baseline": spec.baseline, "moe_layers": (spec.model or {}).get("moe_layers"),
                 "host_only": bool(spec.family.host_only)},
        "cases": case_map(spec, quick=quick, verify=verify),
        **(extra or {}),
    }


def case_map(spec, *, quick: bool, verify: bool) -> dict[str, str | None] | None:
    """The whole matrix of a run (every shard's cases), in order: case id -> id of the baseline
    launch at its shape (None without a baseline). Kept in provenance.cases so that `merge`
    counts missing cases, orders records and reads each against its baseline without the spec."""
    from moebench.core.cases import baseline_case, expand

    try:
        cases = expand(spec, quick=quick, verify=verify, force=True)
        return {c.id: baseline_case(spec, c).id if spec.baseline else None for c in cases}
    except Exception:  # noqa: BLE001 - provenance stands without it; merge then says it cannot count
        return None


def result_stem(spec_name: str, *, quick: bool, verify: bool) -> str:
    return spec_name + ("-verify" if verify else "") + ("-quick" if quick else "")


# ----------------------------------------------------------------------------------- what determines a number


def run_settings(spec, device, *, timed: bool, cross: Iterable[str], environ: Mapping[str, str]) -> dict:
    """Everything besides the case itself that a record's numbers depend on. Changing any of it
    between runs makes `--resume` run the case again: the device (name, backend, SMs, L2),
    whether the run was timed, the timer settings (with --l2), the cross-checks, every kill-switch
    variable the family's variants read (as set, or None), the baseline launch every case is
    checked against, and the content hash of each plugin file that defines a variant or the family
    (`code`; record_key takes only the case's own)."""
    switches = sorted({var for v in spec.family.variants.values() for var, _ in v.env.values()})
    out = {
        "device": {"name": device.name, "backend": device.backend, "sm_count": device.sm_count,
                   "l2_bytes": device.l2_bytes},
        "timed": bool(timed),
        "timing": asdict(spec.timing),
        "cross_checks": sorted(cross),
        "switches": {var: (environ.get(var) or "").strip() or None for var in switches},
        "baseline": spec.baseline,
    }
    code = {"family": _source_sha(spec.family.origin),
            "variants": {n: h for n, v in spec.family.variants.items() if (h := _source_sha(v.source))}}
    if code["family"] or code["variants"]:
        out["code"] = code
    return out


def _source_sha(source: str) -> str | None:
    """sha256 of the plugin file behind a variant's or family's source ('plugin FILE', or 'plugin
    MODULE (entry point NAME)'); None for built-in and upstream code."""
    if not isinstance(source, str) or not source.startswith("plugin "):
        return None
    what = source[len("plugin "):]
    path: str | None = what
    if " (entry point " in what:
        import importlib.util

        try:
            found = importlib.util.find_spec(what.split(" (entry point ")[0].split(":")[0])
            path = found.origin if found is not None else None
        except (ImportError, ValueError):
            path = None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def record_key(case, settings: dict) -> str:
    """The resume key of a case run under `settings`: 16 hex digits of a sha256 over the case
    (family, variant, label, every parameter), the settings, and the content hash of the plugin
    file behind the case's variant and family (editing a plugin re-runs its cases, and only
    those), in canonical JSON."""
    code = settings.get("code") or {}
    mine = {"family": code.get("family"), "variant": (code.get("variants") or {}).get(case.variant)}
    doc = {"case": [case.family, case.variant, case.label, case.params],
           "settings": {k: v for k, v in settings.items() if k != "code"}}
    if any(mine.values()):
        doc["code"] = mine
    blob = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def settings_diff(old: dict | None, new: dict) -> str:
    """What changed between two run_settings, as `key: old -> new` phrases."""
    if not isinstance(old, dict):
        return "made by an earlier moebench that kept no settings"

    def flat(d: Any, pre: str = "") -> dict[str, Any]:
        if isinstance(d, dict) and d:
            out: dict[str, Any] = {}
            for k, v in d.items():
                out.update(flat(v, f"{pre}.{k}" if pre else str(k)))
            return out
        return {pre: d}

    a, b = flat(old), flat(new)
    bits = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            name = f"${k.split('.', 1)[1]}" if k.startswith("switches.") else k
            show = [("unset" if v is None and k.startswith("switches.") else repr(v)) for v in (a.get(k), b.get(k))]
            bits.append(f"{name}: {show[0]} -> {show[1]}")
    return "; ".join(bits) or "the same settings"


# ----------------------------------------------------------------------------------- the stream


@dataclass
class StreamEntry:
    record: Record
    settings: dict | None  # the run_settings of the run that wrote it (its header line)


@dataclass
class StreamRead:
    entries: list[StreamEntry]
    headers: list[dict]
    torn: int = 0  # an unterminated last line (the writer was killed mid-write)
    unreadable: int = 0  # complete lines that are not a record
    cut_to: int | None = None  # the byte length the file was cut back to


def read_stream(path: Path, *, repair: bool = False) -> StreamRead:
    """Every intact record of a stream, with the settings of the run that wrote it. A torn last
    line is dropped; with `repair` (the caller holds the output lock) the file is cut back to the
    end of its last complete line, so the next append starts on a line of its own."""
    data = path.read_bytes()
    out = StreamRead([], [])
    body = data
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        body, out.torn = data[:cut], 1
        if repair:
            with writing(path), open(path, "r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
            out.cut_to = cut
    settings = None
    for i, line in enumerate(body.split(b"\n")[:-1]):
        if not line.strip():
            continue
        try:
            d = _parse_json(line.decode())
            if not isinstance(d, dict):
                raise Malformed("", "not an object")
            if "run" in d:
                run = d["run"] if isinstance(d["run"], dict) else {}
                settings = run.get("settings") if isinstance(run.get("settings"), dict) else None
                out.headers.append(run)
                continue
            rec = record_from(d.get("record"), f"line {i + 1}.record")
        except (ValueError, UnicodeDecodeError):
            out.unreadable += 1
            continue
        out.entries.append(StreamEntry(rec, settings))
    return out


def stream_path(dest: Path, stem: str) -> Path:
    return dest / f"{stem}.partial.jsonl"


# ----------------------------------------------------------------------------------- one writer per output


class OutputLock:
    """An exclusive flock on ``DEST/.STEM.lock`` for as long as a run writes STEM's files. The
    file holds the holder's pid and command, so a second run can say who has it. The lock file is
    removed on release while still locked; a run that opened the old file just before checks that
    the path still names the file it locked, and tries again if not."""

    def __init__(self, dest: Path, stem: str):
        self.path = dest / f".{stem}.lock"
        self.files = dest / f"{stem}.*"
        self.fd: int | None = None

    def __enter__(self) -> "OutputLock":
        for _ in range(20):
            with writing(self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                os.close(fd)
                raise UsageError(f"{self.files}: another moebench is writing these "
                                 f"results ({holder or 'pid unknown'}); wait for it to finish, or pass another "
                                 "--out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}: {' '.join(['moebench'] + sys.argv[1:])}\n".encode(), 0)
                return self
            os.close(fd)
        raise OutputError(f"{self.path}: could not take the lock (it kept being replaced)")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


# ----------------------------------------------------------------------------------- the writer


PAGE_MARK = "<!-- moebench page:"


def page_trailer(prov: dict, n_records: int) -> str:
    """The last line of a results page: how many records it shows and which spec made it, so a
    later run can tell (without a JSON twin) whether writing its page would replace a bigger one or
    another spec's."""
    doc = {"records": n_records, "spec_path": prov.get("spec_path"), "spec_sha256": prov.get("spec_sha256")}
    return f"\n{PAGE_MARK} {json.dumps(doc)} -->\n"


def _page_info(path: Path) -> dict:
    """What a page's trailer says ({} for a page without one: an older moebench's, or a hand-made one)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return {}
    at = tail.rfind(PAGE_MARK)
    if at < 0:
        return {}
    try:
        doc = json.loads(tail[at + len(PAGE_MARK):].split("-->", 1)[0])
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def existing_records(dest: Path, stem: str, formats: Iterable[str]) -> tuple[int, Path | None]:
    """The most records any of STEM's result files in the given formats holds now, and that file
    (0, None when there is none). A markdown page counts what its JSON twin holds (whether or not
    json is among the formats), else what its trailer says."""
    best, where = 0, None
    for f in formats:
        p = dest / f"{stem}.{f}"
        if not p.is_file():
            continue
        n = 0
        try:
            if f == "json" or (f == "md" and (dest / f"{stem}.json").is_file()):
                _, recs = load_results(dest / f"{stem}.json")
                n = len(recs)
            elif f == "md":
                v = _page_info(p).get("records")
                n = v if isinstance(v, int) and not isinstance(v, bool) else 0
            elif f == "csv":
                with open(p, newline="") as fh:
                    n = max(0, sum(1 for _ in csv.reader(fh)) - 1)
            elif f == "parquet":
                import pyarrow.parquet as pq

                n = pq.ParquetFile(p).metadata.num_rows
        except Exception:  # noqa: BLE001 - a file that cannot be read holds no records worth keeping
            n = 0
        if n > best:
            best, where = n, p
    return best, where


def other_spec(dest: Path, stem: str, prov: dict, formats: Iterable[str]) -> str | None:
    """Why STEM's results in DEST were made by another spec of the same name (a spec file at
    another path with other content), else None. A spec edited in place, or the same content
    elsewhere, is the same spec."""
    for f in ("json", *formats):
        p = dest / f"{stem}.{f}"
        if not p.is_file() or f in ("csv", "parquet"):
            continue
        try:
            old = load_results(p)[0] if f == "json" else _page_info(p)
        except UsageError:
            continue
        path, sha = old.get("spec_path"), old.get("spec_sha256")
        if not (isinstance(path, str) and isinstance(sha, str)):
            continue
        if path != prov.get("spec_path") and sha != prov.get("spec_sha256"):
            return (f"{p} holds the results of another spec named {prov.get('sweep')!r} ({path}, sha256 {sha[:12]}); "
                    f"this run's is {prov.get('spec_path')} (sha256 {str(prov.get('spec_sha256'))[:12]}): not "
                    "replaced (pass --force to replace them, or another --out)")
    return None


@dataclass
class Written:
    """What finalize did: the files it wrote, the stream it kept (None when removed), and the
    existing file it left in place because it holds more records (with that count)."""

    paths: list[Path]
    stream: Path | None
    kept: tuple[Path, int] | None = None


class ResultsWriter:
    """Streams records to ``STEM.partial.jsonl`` as they finish, and writes the final files
    atomically. `settings` (run_settings) heads each run's part of the stream, so a later
    `--resume` can say what changed. The caller holds the OutputLock."""

    def __init__(self, out_dir: Path, stem: str, prov: dict, formats: Iterable[str], *, force: bool = False,
                 keys: Mapping[str, str] | None = None):
        self.out_dir = out_dir
        self.keys = dict(keys or {})  # case id -> record_key: stamped on each record as it is added
        self.stem = stem
        self.prov = prov
        self.formats = tuple(formats)
        self.force = force
        self.partial = stream_path(out_dir, stem)
        self._stream = None
        self._synced = 0.0  # monotonic time of the stream's last fsync
        self._wrote = False
        why = None if force else other_spec(out_dir, stem, prov, self.formats)
        if why:
            raise UsageError(why)

    def _open(self):
        if self._stream is None:
            with writing(self.partial):
                self.out_dir.mkdir(parents=True, exist_ok=True)
                if self.partial.exists():
                    read_stream(self.partial, repair=True)  # never append onto a torn line
                self._stream = open(self.partial, "ab")
            self._wrote = True
            head = {k: self.prov.get(k) for k in ("sweep", "spec_sha256", "command", "timestamp", "git_commit")}
            self._write([{"run": {**head, "settings": self.prov.get("settings")}}])
        return self._stream

    def _write(self, docs: list[dict]) -> None:
        f = self._open()
        with writing(self.partial):
            f.write(b"".join(json.dumps(d, default=str).encode() + b"\n" for d in docs))
            f.flush()  # in the OS's hands: a killed process loses nothing written
            now = time.monotonic()
            if now - self._synced >= FSYNC_EVERY_S:  # on the disk: a crashed machine loses at most that
                os.fsync(f.fileno())
                self._synced = now

    def add(self, rec: Record) -> None:
        self.add_many([rec])

    def add_many(self, recs: Iterable[Record]) -> None:
        """Append records with one fsync (resumed records are copied into this run's stream)."""
        docs = []
        for r in recs:
            r.resume_key = self.keys.get(r.case_id, r.resume_key)
            docs.append({"record": r.to_json()})
        if docs:
            self._write(docs)

    def close(self) -> None:
        if self._stream is not None:
            os.fsync(self._stream.fileno())
            self._stream.close()
            self._stream = None

    def finalize(self, records: list[Record], *, complete: bool, markdown: str | None = None) -> Written:
        self.close()
        have, where = existing_records(self.out_dir, self.stem, self.formats)
        if have > len(records) and not self.force:
            return Written([], self.partial if self.partial.exists() else None, (where, have))
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
                buf = io.BytesIO()
                df.to_parquet(buf, index=False)
                atomic_write_bytes(p, buf.getvalue())
                paths.append(p)
        if "md" in self.formats and markdown is not None:
            p = self.out_dir / f"{self.stem}.md"
            atomic_write_text(p, markdown.rstrip("\n") + "\n" + page_trailer(prov, len(records)))
            paths.append(p)
        stream = self.partial if self.partial.exists() else None
        if complete and self._wrote and stream is not None:  # merge never wrote it: a stream it leaves alone
            with writing(stream):
                stream.unlink()
            stream = None
        return Written(paths, stream)


# ----------------------------------------------------------------------------------- reading results


def load_results(path: Path) -> tuple[dict, list[Record]]:
    """Read a results JSON (or a .partial.jsonl) back into provenance + records. Anything that is
    not one is a UsageError naming the file and the key path of the first bad value."""
    if not path.exists():
        raise UsageError(f"{path}: no such results file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file; expected a results .json")
    try:
        if path.suffix == ".jsonl":
            s = read_stream(path)
            latest = {e.record.case_id: e.record for e in s.entries}
            head = s.headers[0] if s.headers else {}
            prov = {k: v for k, v in head.items() if k != "settings"}
            return {**prov, "settings": head.get("settings"), "complete": False}, list(latest.values())
        doc = _parse_json(path.read_text())
        if not isinstance(doc, dict):
            raise Malformed("", f"expected an object with 'provenance' and 'records', got {_kind(doc)}")
        prov = check_provenance(doc.get("provenance", {}))
        recs = doc.get("records", [])
        if not isinstance(recs, list):
            raise Malformed("records", f"expected a list of records, got {_kind(recs)}")
        return prov, [record_from(r, f"records[{i}]") for i, r in enumerate(recs)]
    except Malformed as e:
        raise UsageError(f"{path}: not a moebench results file: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a moebench results file ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None


@dataclass
class Resumed:
    """What `--resume` found: the records it keeps (by case id), and what it dropped and why."""

    kept: dict[str, Record]
    dropped: Counter = field(default_factory=Counter)  # reason -> records
    torn: int = 0
    unreadable: int = 0
    other_cases: int = 0  # records of cases this run does not have
    sources: list[Path] = field(default_factory=list)

    def summary(self, n_cases: int) -> str:
        where = ", ".join(p.name for p in self.sources) or "nothing to resume from"
        line = f"--resume: kept {len(self.kept)} of {n_cases} cases ({where})"
        bits = [f"{n} {why}" for why, n in self.dropped.most_common()]
        if self.torn:
            bits.append("a torn last line (the file was cut back to its last complete record)")
        if self.unreadable:
            bits.append(f"{self.unreadable} unreadable line{'s' if self.unreadable != 1 else ''}")
        if self.other_cases:
            bits.append(f"{self.other_cases} record{'s' if self.other_cases != 1 else ''} of cases this run does "
                        "not have")
        return line + ("; dropped " + "; ".join(bits) if bits else "")


def previous_records(out_dir: Path, stem: str, keys: Mapping[str, str], settings: dict, *,
                     repair: bool = True) -> Resumed:
    """The records of earlier runs that `--resume` keeps: status ok, and a resume_key equal to the
    key this run computes for the case (`keys`: case id -> record_key). Read from the final JSON
    and the stream (the stream last: its records are newer). A record of a case this run also has
    that does not qualify is counted under the reason it was dropped."""
    res = Resumed({})
    cands: dict[str, list[tuple[Record, dict | None]]] = {}
    final = out_dir / f"{stem}.json"
    if final.is_file():
        try:
            prov, recs = load_results(final)
            res.sources.append(final)
            for r in recs:
                cands.setdefault(r.case_id, []).append((r, prov.get("settings")))
        except UsageError:
            res.unreadable += 1
    stream = stream_path(out_dir, stem)
    if stream.is_file():
        s = read_stream(stream, repair=repair)
        res.sources.append(stream)
        res.torn, res.unreadable = res.torn + s.torn, res.unreadable + s.unreadable
        for e in s.entries:
            cands.setdefault(e.record.case_id, []).append((e.record, e.settings))
    for cid, found in cands.items():
        if cid not in keys:
            res.other_cases += len(found)
            continue
        good = [r for r, _ in found if r.status == "ok" and r.resume_key == keys[cid]]
        if good:
            res.kept[cid] = good[-1]
            continue
        r, old = found[-1]
        if r.status != "ok":
            res.dropped[f"{r.status} (run again)"] += 1
        elif not r.resume_key:
            res.dropped["made by an earlier moebench without resume keys"] += 1
        else:
            changed = settings_diff(old, settings)
            res.dropped[f"made under other settings ({changed})" if changed != "the same settings"
                        else "made for a different case definition"] += 1
    return res
