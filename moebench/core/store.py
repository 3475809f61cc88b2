"""Writing results so nothing completed is lost, and nothing is replaced that should not be: the
rules are docs/method.md, 'Results files'. The stream (`ResultsWriter`: flushed after every record,
fsynced at most every FSYNC_EVERY_S) is the source of truth for ``--resume`` whatever ``--format``
says; the final files are written whole (`atomic_write_bytes`) and never over more records or
another spec's (`identity`); one writer per output name (`OutputLock`). A file any command writes
with -o goes through `output_file` first.
"""

from __future__ import annotations

import fcntl
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from moebench.core.provenance import settings_diff
from moebench.core.records import Record, StreamRead, load_results, read_stream
from moebench.core.text import printable
from moebench.errors import OutputError, UsageError

FORMATS = ("csv", "json", "md", "parquet")
FSYNC_EVERY_S = 1.0  # the finished-records stream: fsync at most this often (it is flushed after every record)
# the libraries a format needs beyond the package's own dependencies: any one of them will do
FORMAT_LIBRARIES = {"parquet": ("pyarrow", "fastparquet")}


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
    """Write a whole file or nothing: a temporary file beside it, fsynced, renamed over it. A
    symbolic link is written through (the temporary file sits beside its target), never replaced.
    The file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's 0600."""
    target = Path(os.path.realpath(path))
    with writing(path):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def output_file(path: Path, *, inputs: Iterable[Path | str] = (), force: bool = False, option: str = "-o") -> Path:
    """Check a file a command is about to write (the -o of plot, recommend, conformance, merge),
    before any work: never one of the command's inputs (through any link), never a folder, never an
    existing file unless `force`, and in a folder that can be written (made when the file is
    written, so a command that fails leaves no empty folder behind)."""
    target = os.path.realpath(path)
    for i in inputs:
        if os.path.realpath(i) == target:
            raise UsageError(f"{option}: {path} is one of the inputs ({i}); not overwritten, write elsewhere")
    if path.is_dir():
        raise UsageError(f"{option}: {path} is a folder; name the file to write")
    if (path.exists() or path.is_symlink()) and not force:
        raise UsageError(f"{option}: {path} exists; not replaced (pass --force to replace it, or another {option})")
    _writable_ancestor(Path(target).parent, option, path)
    return path


def writable_dir(path: Path, option: str) -> Path:
    """Create folder `path` (with its parents) where a file can be written, so a bad --out or -o
    stops the command before any work, naming the option."""
    _writable_ancestor(path, option, path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option}: cannot make {path}: {e.strerror or e}") from None
    return path


def _writable_ancestor(folder: Path, option: str, given: Path) -> None:
    """The nearest of `folder` and its parents that exists is a folder a byte can be written to
    and synced in (not a file, not /proc, not a full disk); else a UsageError naming `option`."""
    for p in [folder, *folder.parents]:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise UsageError(f"{option}: {p} is not a folder" + ("" if p == given else f" (in {given})"))
            try:
                with tempfile.TemporaryFile(dir=p) as f:
                    f.write(b"x")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise UsageError(f"{option}: cannot write in {p}: {e.strerror or e}") from None
            return


def check_formats(text: str, option: str = "--format") -> tuple[str, ...]:
    """`csv,json,md` -> ("csv", "json", "md"): non-empty, known, no repeats, and the library each
    needs importable, all before any case runs."""
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


def repair_stream(path: Path) -> StreamRead:
    """Read a stream and cut a torn last line off the file (the caller holds the output lock), so
    the next append starts on a line of its own."""
    s = read_stream(path)
    if s.torn:
        with writing(path), open(path, "r+b") as f:
            f.truncate(s.complete_bytes)
            f.flush()
            os.fsync(f.fileno())
    return s


def stream_path(dest: Path, stem: str) -> Path:
    return dest / f"{stem}.partial.jsonl"


def result_stem(spec_name: str, *, quick: bool, verify: bool) -> str:
    return spec_name + ("-verify" if verify else "") + ("-quick" if quick else "")


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


PAGE_MARK = "<!-- moebench page:"


def _identity_doc(prov: dict, n_records: int) -> dict:
    return {"records": n_records, "spec_path": prov.get("spec_path"), "spec_sha256": prov.get("spec_sha256")}


def page_text(markdown: str, prov: dict, n_records: int) -> str:
    """A results page as written: its text made printable (nothing read from a results file can
    act on a terminal or a viewer), then the trailer line that says how many records it shows and
    which spec made it, so a later run can tell (without a JSON twin) whether writing its page would
    replace a bigger one or another spec's."""
    return (printable(markdown.rstrip("\n"), lines=True) + "\n"
            + f"\n{PAGE_MARK} {json.dumps(_identity_doc(prov, n_records))} -->\n")


def sidecar(path: Path) -> Path:
    """Where a csv or parquet results file written without its JSON twin keeps its identity (they
    have no room for it): ``.NAME.csv.spec`` beside it."""
    return path.with_name(f".{path.name}.spec")


def identity(path: Path) -> dict | None:
    """What a results file says of itself, {records, spec_path, spec_sha256}: a JSON's provenance,
    a page's trailer, a csv's or parquet's sidecar; None when it says nothing (not written by
    moebench, or unreadable)."""
    try:
        if path.suffix == ".json":
            prov, recs = load_results(path)
            kind = next((k for k in ("ab", "pr") if k in prov), None)  # another command's file of this name
            return {**_identity_doc(prov, len(recs)), **({"kind": kind} if kind else {})}
        if path.suffix == ".md":
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
                tail = f.read().decode(errors="replace")
            at = tail.rfind(PAGE_MARK)
            text = tail[at + len(PAGE_MARK):].split("-->", 1)[0] if at >= 0 else ""
        else:
            text = sidecar(path).read_text()
        doc = json.loads(text) if text else None
    except (OSError, ValueError, UsageError):
        return None
    return doc if isinstance(doc, dict) else None


def _present(dest: Path, stem: str, formats: Iterable[str]) -> list[tuple[Path, dict | None, dict | None]]:
    """STEM's files in DEST of these formats: (path, what it says of itself, what its JSON twin says)."""
    twin = dest / f"{stem}.json"
    twin_doc = identity(twin) if twin.is_file() else None
    return [(p, identity(p), twin_doc) for p in (dest / f"{stem}.{f}" for f in formats) if p.is_file()]


def _records(doc: dict | None) -> int:
    n = (doc or {}).get("records")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def existing_records(dest: Path, stem: str, formats: Iterable[str]) -> tuple[int, Path | None]:
    """The most records any of STEM's result files in the given formats holds now (what it says,
    or what its JSON twin says, whichever is more), and that file; (0, None) when there is none."""
    best, where = 0, None
    for p, own, twin in _present(dest, stem, formats):
        if (own or twin or {}).get("kind"):
            continue  # an ab or pr file of this name: other_spec refuses it as that
        n = max(_records(own), _records(twin))
        if n > best:
            best, where = n, p
    return best, where


def _another_spec(old: dict, prov: dict) -> bool:
    """Whether a file's identity `old` names a spec other than this run's `prov`: both its path and
    its content differ (a spec edited in place, or the same content elsewhere, is the same spec)."""
    path, sha = old.get("spec_path"), old.get("spec_sha256")
    return isinstance(path, str) and isinstance(sha, str) and path != prov.get("spec_path") \
        and sha != prov.get("spec_sha256")


def other_spec(dest: Path, stem: str, prov: dict, formats: Iterable[str]) -> str | None:
    """Why STEM's results in DEST must not be replaced by this run's (prov): they were made by
    another spec of the same name (a spec file at another path with other content), or a file
    there says nothing of the spec that made it, nor does its JSON twin (a file moebench did not
    write); else None."""
    for p, own, twin in _present(dest, stem, dict.fromkeys(("json", *formats))):
        old = own or twin
        if old is not None and old.get("kind"):
            return (f"{p} holds `moebench {old['kind']}` results of the spec {old.get('spec_path')}, not a sweep's: "
                    "not replaced (pass --force to replace it, or another --out)")
        if old is None:
            return (f"{p} exists and does not say which spec made it (not a file moebench wrote, or unreadable): "
                    "not replaced (pass --force to replace it, or another --out)")
        if _another_spec(old, prov):
            return (f"{p} holds the results of another spec named {prov.get('sweep')!r} ({old['spec_path']}, "
                    f"sha256 {old['spec_sha256'][:12]}); this run's is {prov.get('spec_path')} "
                    f"(sha256 {str(prov.get('spec_sha256'))[:12]}): not replaced (pass --force to replace them, "
                    "or another --out)")
    return None


def page_problem(dest: Path, prov: dict, n_records: int) -> str | None:
    """Why `render` must not write its page over DEST: a page of another spec, one holding more
    records, or a file that does not say what made it; else None."""
    if not (dest.exists() or dest.is_symlink()):
        return None
    old = identity(dest)
    if old is None:
        return f"{dest} exists and is not a page moebench wrote (no trailer): not replaced (pass --force)"
    if _another_spec(old, prov):
        return (f"{dest} is the page of another spec ({old['spec_path']}, sha256 {old['spec_sha256'][:12]}); "
                f"these results are {prov.get('spec_path')}'s: not replaced (pass --force)")
    n = old.get("records")
    if isinstance(n, int) and n > n_records:
        return f"{dest} shows {n} records and these results hold {n_records}: not replaced (pass --force)"
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
                    repair_stream(self.partial)  # never append onto a torn line
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
            import pandas as pd  # heavy: only when a table format is written

            df = pd.DataFrame(rows)
            for f in ("csv", "parquet"):
                if f not in self.formats:
                    continue
                p = self.out_dir / f"{self.stem}.{f}"
                if f == "csv":
                    atomic_write_text(p, df.to_csv(index=False))
                else:
                    buf = io.BytesIO()
                    df.to_parquet(buf, index=False)
                    atomic_write_bytes(p, buf.getvalue())
                if "json" in self.formats:  # the JSON twin says which spec made it: no sidecar (none stale)
                    with writing(sidecar(p)):
                        sidecar(p).unlink(missing_ok=True)
                else:
                    atomic_write_text(sidecar(p), json.dumps(_identity_doc(prov, len(records))) + "\n")
                paths.append(p)
        if "md" in self.formats and markdown is not None:
            p = self.out_dir / f"{self.stem}.md"
            atomic_write_text(p, page_text(markdown, prov, len(records)))
            paths.append(p)
        stream = self.partial if self.partial.exists() else None
        if complete and self._wrote and stream is not None:  # merge never wrote it: a stream it leaves alone
            with writing(stream):
                stream.unlink()
            stream = None
        return Written(paths, stream)


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


def previous_records(out_dir: Path, stem: str, keys: Mapping[str, str], settings: dict) -> Resumed:
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
        s = repair_stream(stream)
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
        else:
            changed = settings_diff(old, settings)
            res.dropped[f"made under other settings ({changed})" if changed != "the same settings"
                        else "made for a different case definition"] += 1
    return res
