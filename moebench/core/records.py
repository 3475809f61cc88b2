"""The record schema, and reading results documents back: a results JSON or a stream of
finished records (``NAME.partial.jsonl``), checked field by field.

One record per (case, variant): long format. Field order is column order; the dict groups
(params, checks, launch, timing, work, cross) are flattened in that order. Pivot only when
rendering (moebench.report.sweep). Writing results lives in moebench.core.store, what a run
records about itself in moebench.core.provenance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from moebench.core.text import kind as _kind
from moebench.errors import UsageError

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
        every value."""
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


# Numbers the readers compute with: a string or an object here would fail deep inside a table.
_NUMERIC = {"timing": ("median_us", "min_us", "max_us", "q1_us", "q3_us", "iqr_us", "rel_noise", "n_replays")}
_POSITIVE = ("median_us", "min_us", "max_us", "q1_us", "q3_us")  # times; the rest may be 0


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
            if v is not None and not _is_number(v):
                raise Malformed(f"{key}.{g}.{n}", f"expected a number, got {_kind(v)}")
            if v is not None and not (math.isfinite(v) and (v > 0 if n in _POSITIVE else v >= 0)):
                raise Malformed(f"{key}.{g}.{n}", f"expected a {'positive' if n in _POSITIVE else 'finite, non-negative'} "
                                f"number, got {v!r}")  # a zero or NaN time reads as a huge speed-up
    for k, v in d.get("params", {}).items():  # a case's values: pivots and groups hash them
        if not isinstance(v, (str, int, float, type(None))):
            raise Malformed(f"{key}.params.{k}", f"expected a number, a string, true/false or null, got {_kind(v)}")
    if not isinstance(d.get("timing", {}).get("timer"), (str, type(None))):
        raise Malformed(f"{key}.timing.timer", f"expected the timer's name, got {_kind(d['timing']['timer'])}")
    return Record.from_json(d)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


# provenance.device's numbers; every other value of ceilings and timing is a number but these texts
_DEVICE_NUMBERS = ("sm_count", "l2_bytes", "max_threads_per_sm", "total_mem_bytes", "sm_clock_max_mhz",
                   "mem_clock_max_mhz")
_TEXT = ("measured_at", "measured_in", "l2", "noise", "placement_memory")
_ANY = ("*",)  # any key may be null


def _check_types(d: dict, types_of: dict[str, tuple[tuple[type, ...], str]], key: str) -> None:
    """Each key of `d` that `types_of` names has one of its types (a boolean is no integer)."""
    for k, (types, name) in types_of.items():
        v = d.get(k)
        if k in d and (not isinstance(v, types) or (isinstance(v, bool) and bool not in types)):
            raise Malformed(f"{key}.{k}", f"expected {name}, got {_kind(v)}")


def check_provenance(prov: Any) -> dict:
    if not isinstance(prov, dict):
        raise Malformed("provenance", f"expected an object, got {_kind(prov)}")
    _check_types(prov, _PROVENANCE_TYPES, "provenance")
    _check_types(prov.get("page", {}), _PAGE_TYPES, "provenance.page")
    for k, v in prov.get("page", {}).get("pivot", {}).items():
        if not isinstance(v, str):
            raise Malformed(f"provenance.page.pivot.{k}", f"expected a string, got {_kind(v)}")
    for g, numbers, null in (("device", _DEVICE_NUMBERS, ("sm_clock_max_mhz", "mem_clock_max_mhz")),
                             ("ceilings", None, ()), ("timing", None, _ANY)):
        for k, v in (prov.get(g) or {}).items():  # what the pages compute with and print
            if (k not in numbers) if numbers else (k in _TEXT or isinstance(v, dict)):
                continue
            if not (_is_number(v) or (v is None and (null is _ANY or k in null))):
                raise Malformed(f"provenance.{g}.{k}", "expected a number" + (" or null" if null is _ANY or k in null else "")
                                + f", got {_kind(v)}")
    shard = prov.get("shard")
    if shard is not None and not (len(shard) == 2 and all(type(x) is int and x >= 0 for x in shard)
                                  and shard[0] < shard[1]):
        raise Malformed("provenance.shard", f"expected [index, count] with 0 <= index < count, got {shard!r}"[:200])
    for k, v in (prov.get("cases") or {}).items():
        if not isinstance(v, (str, type(None))):
            raise Malformed(f"provenance.cases.{k}", f"expected the baseline's case id or null, got {_kind(v)}")
    return prov


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise Malformed("", "nested too deeply to be a results file") from None


# ----------------------------------------------------------------------------------- the stream


@dataclass
class StreamEntry:
    record: Record
    settings: dict | None  # the run_settings of the run that wrote it (its header line)
    run: int = -1  # that header's index in StreamRead.headers (-1: none came before it)


@dataclass
class StreamRead:
    entries: list[StreamEntry]
    headers: list[dict]
    torn: int = 0  # an unterminated last line (the writer was killed mid-write)
    unreadable: int = 0  # complete lines that are not a record
    complete_bytes: int = 0  # the length of its complete lines (moebench.core.store.repair_stream cuts to it)


def read_stream(path: Path) -> StreamRead:
    """Every intact record of a stream, with the settings of the run that wrote it. A torn last
    line is dropped (and counted)."""
    data = path.read_bytes()
    out = StreamRead([], [], complete_bytes=len(data))
    body = data
    if data and not data.endswith(b"\n"):
        out.complete_bytes = data.rfind(b"\n") + 1
        body, out.torn = data[:out.complete_bytes], 1
    settings, run_index = None, -1
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
                run_index = len(out.headers) - 1
                continue
            rec = record_from(d.get("record"), f"line {i + 1}.record")
        except (ValueError, UnicodeDecodeError):
            out.unreadable += 1
            continue
        out.entries.append(StreamEntry(rec, settings, run_index))
    return out


# ----------------------------------------------------------------------------------- reading results

# What a stream's header says of the run that wrote the records after it; records of runs that differ
# in any of these are not one set of results.
_RUN_IDENTITY = ("spec_sha256", "git_commit", "settings")


def _stream_results(path: Path) -> tuple[dict, list[Record]]:
    """A stream read as results: each case's latest record, under the header of the run that wrote
    it. A stream another run appended to holds records of several runs; they read as one set only
    when those runs agree on spec, commit and settings (a resumed run), else UsageError."""
    s = read_stream(path)
    latest = {e.record.case_id: e for e in s.entries}
    runs = sorted({e.run for e in latest.values()})
    heads = [s.headers[i] if i >= 0 else {} for i in runs] or [s.headers[-1] if s.headers else {}]
    differ = [k for k in _RUN_IDENTITY if any(h.get(k) != heads[0].get(k) for h in heads)]
    if differ:
        raise UsageError(f"{path}: holds the records of {len(heads)} runs that differ in {', '.join(differ)} "
                         "(another run appended to this stream); read the final .json, or one run's lines")
    head = heads[-1]
    prov = {k: v for k, v in head.items() if k != "settings"}
    return {**prov, "settings": head.get("settings"), "complete": False}, [e.record for e in latest.values()]


def load_results(path: Path) -> tuple[dict, list[Record]]:
    """Read a results JSON (or a .partial.jsonl) back into provenance + records. Anything that is
    not one is a UsageError naming the file and the key path of the first bad value."""
    if not path.exists():
        raise UsageError(f"{path}: no such results file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file; expected a results .json")
    try:
        if path.suffix == ".jsonl":
            return _stream_results(path)
        doc = _parse_json(path.read_text())
        if not isinstance(doc, dict):
            raise Malformed("", f"expected an object with 'provenance' and 'records', got {_kind(doc)}")
        prov = check_provenance(doc.get("provenance", {}))
        recs = doc.get("records", [])
        if not isinstance(recs, list):
            raise Malformed("records", f"expected a list of records, got {_kind(recs)}")
        out = [record_from(r, f"records[{i}]") for i, r in enumerate(recs)]
        family = prov.get("page", {}).get("family") or (out[0].family if out else None)
        for i, r in enumerate(out):  # a page reads every record as its family's (a pr file adds the layer's)
            if r.family != family and "pr" not in prov:
                raise Malformed(f"records[{i}].family", f"{r.family!r}, where the file's records are of family "
                                f"{family!r}: a results file holds one family's records")
        return prov, out
    except Malformed as e:
        raise UsageError(f"{path}: not a moebench results file: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a moebench results file ({type(e).__name__}: {e})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None


