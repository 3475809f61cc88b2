"""Small text helpers shared by messages, tables and pages. Pure Python, no dependencies."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from moebench import errors

# the checkout moebench runs from (the folder above the package): its sweeps/, configs/ and results/
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def kind(v: Any) -> str:
    """What sort of value `v` is, as a phrase: 'a mapping', 'an integer', 'nothing (empty)'."""
    if v is None:
        return "nothing (empty)"
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer",
            float: "a number", bool: "a boolean"}.get(type(v), type(v).__name__)


def show(v: Any) -> str:
    """A value as a short phrase for an error message: scalars as written, containers by kind."""
    if v is None or isinstance(v, (dict, list, set, tuple)):
        return kind(v) if not isinstance(v, (list, dict)) or v else f"an empty {kind(v)[2:]}"
    if isinstance(v, bool):
        return str(v).lower()
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def printable(text: Any, *, lines: bool = False) -> str:
    """Text read from a results file, made safe to print on a terminal or put in a page: every
    control character, and so every terminal escape sequence, is shown as its escape (``\\x1b``)
    instead of acting (errors.one_line). Newlines and tabs stay with `lines` (a whole page), else
    they are escaped too."""
    return errors.one_line(str(text), "\n\t" if lines else "")


def num(v: float | None, spec: str = ".2f") -> str:
    """A number for a table cell; an em dash for none."""
    return "—" if v is None else format(v, spec)


def md_table(head: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table. A `|` or a line break inside a cell is escaped, so a label never
    splits its row."""
    def cell(c: Any) -> str:
        return printable(str(c).replace("\n", " ")).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (isinstance(x, float) and math.isnan(x))


def ordered(items: Iterable) -> list:
    """Distinct items (scalars or tuples), sorted position by position: numbers in numeric order,
    then anything else (labels, strings) in order of first appearance, so variants read in the
    order the spec lists them; None last."""
    seen = list(dict.fromkeys(items))
    first: dict = {}
    for t in seen:
        for i, x in enumerate(t if isinstance(t, tuple) else (t,)):
            first.setdefault((i, x), len(first))

    def key(t):
        t = t if isinstance(t, tuple) else (t,)
        return tuple((0, float(x)) if _is_number(x) else (2, 0) if x is None else (1, first[(i, x)])
                     for i, x in enumerate(t))

    return sorted(seen, key=key)


def varying(rows: Sequence[dict], names: Iterable[str] | None = None) -> list[str]:
    """The names (default: every key of `rows`, in order) whose set (non-None) values differ across
    `rows`: a launch parameter a variant does not read is None there, and that alone does not make
    it vary."""
    out = []
    for n in (dict.fromkeys(k for r in rows for k in r) if names is None else names):
        values = {repr(r.get(n)) for r in rows if r.get(n) is not None and not (isinstance(r.get(n), float)
                                                                               and math.isnan(r.get(n)))}
        if len(values) > 1:
            out.append(n)
    return out


def slugify(name: str) -> str:
    """A device's folder name under results/: 'NVIDIA H200' -> 'h200'."""
    s = name.lower()
    s = re.sub(r"^nvidia\s+", "", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "device"


# A name read from a file that becomes a file name (a sweep's results, a noise model): letters,
# digits, '.', '_', '-', not starting with a dot, so never a path, '..' or a hidden file; and at
# most 100 characters, which leaves room for every suffix a run adds within a file name's 255 bytes
# (`.NAME-verify-quick.partial.jsonl`).
STEM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def safe_stem(name: Any) -> str | None:
    """`name` when it can name a file inside a folder and nothing else (STEM_RE), else None."""
    return name if isinstance(name, str) and STEM_RE.fullmatch(name) else None

def one_line(e: BaseException) -> str:
    """An exception's message as one line for a record or a message (errors.first_line), at most
    300 characters."""
    return errors.first_line(e)[:300]


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the file at `path`, `what` it should be ("a noise model"), or a one-line
    SpecError: no such file, a directory or not a regular file, over `limit` bytes, unreadable."""
    try:
        if not path.exists():
            raise errors.SpecError(path, "", "no such file")
        if path.is_dir():
            raise errors.SpecError(path, "", f"is a directory, expected {what}")
        if not path.is_file():
            raise errors.SpecError(path, "", f"not a regular file, expected {what}")
        size = path.stat().st_size
        if size > limit:
            raise errors.SpecError(path, "", f"{size} bytes is too large for {what} (at most {limit}); "
                                   "is this the right file?")
        return path.read_bytes()
    except OSError as e:
        raise errors.SpecError(path, "", f"cannot read: {e.strerror or e}") from None
    except ValueError as e:  # e.g. an embedded NUL byte in the path
        raise errors.SpecError(path, "", f"cannot read: {e}") from None
