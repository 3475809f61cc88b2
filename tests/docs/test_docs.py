"""The prose agrees with the code and with the committed results, without pinning any wording.

- Code blocks: ```python compiles; the blocks a page names as files (a first line `# NAME.py` or
  `# NAME.yaml`) are written to a folder, and the page's bash lines that use them run there as
  written; every ```yaml spec passes `moebench validate`; every `python3 -m moebench ...` line
  names a real command with options it has; `make` targets and scripts exist.
- Figures: a measured figure in prose is followed by `<!--fig EXPR-->` (EXPR over figures.py),
  the test evaluates it and compares it at the printed precision, and the paragraph names the file
  visibly. A number with a measured unit and no tag fails, unless written as code or marked
  `<!--not-measured-->` (after the figure, or at the start of its line).
- `<!-- generated: PAGE table N -->` ... `<!-- end generated -->` equals that table of PAGE.
- Every relative link, and every path written as code, resolves; a cited section exists.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

import figures
import warm

ROOT = figures.ROOT
PROSE = sorted({ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
                ROOT / "results/h200/REPORT.md", ROOT / "results/h200/TIMER.md",
                ROOT / "results/h200x2/DEVICES.md", ROOT / "results/h200/history/README.md",
                ROOT / "results/h200/vs-base/README.md", ROOT / "results/h200/check-569be3d/README.md"})
IDS = [p.relative_to(ROOT).as_posix() for p in PROSE]

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
GENERATED = re.compile(r"<!-- generated: (\S+) table (\d+) -->\n(.*?)<!-- end generated -->", re.S)
DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"  # 4,176 has a thousands separator, "6, µs" not
NUM = rf"[-−+]?{DIGITS}"
UNIT = r"(?:\s?(?:µs|us|ns|ms|s|GB/s|TB/s)\b|×|%)"
# a sign right after a digit or a tag is a range's dash (`3.4×<!--fig ...-->-24.1×`), not a minus
TAG = re.compile(rf"(?P<sign>±)?(?P<num>(?:(?<![\w>.])[-−+])?{DIGITS})(?P<unit>{UNIT})?\**"
                 r"<!--fig\s+(?P<pct>pct:)?(?P<expr>.*?)-->", re.S)
ALIASES = re.compile(r"<!--figs\s+(.*?)-->", re.S)
EXEMPT = re.compile(rf"{NUM}{UNIT}?\**<!--not-measured-->")
UNTAGGED = re.compile(rf"(?<![\w./]){NUM}{UNIT}")
RANGE = re.compile(rf"(?<![\w./]){NUM}(?=\s?[-–]\s?{NUM}{UNIT})")  # the untagged first end of a range
SPAN = re.compile(r"``.*?``|`[^`\n]*`", re.S)
MOEBENCH = re.compile(r"^python3 -m moebench\b(.*)$")
BARE = re.compile(r"(?<!-m )(?<![\w./-])moebench (?:sweep|verify|validate|list|show|render|device|ab|compare|"
                  r"recommend|plot|conformance|merge|history)\b")


def _doc(path: Path) -> str:
    return path.read_text()


def _prose(text: str) -> str:
    """The text outside fenced and generated blocks (each replaced by a blank line, so paragraphs stay)."""
    text = GENERATED.sub("\n\n", text)
    return FENCE.sub("\n\n", text)


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(GENERATED.sub("", text))]


def _paragraphs(text: str) -> list[str]:
    return re.split(r"\n[ \t]*\n", text)


# ----------------------------------------------------------------------------------- figures


def _aliases(text: str) -> dict:
    """The names `<!--figs NAME=EXPR ...-->` define (UPPERCASE, each EXPR over figures.py and the
    names before it): a file, or a list of run files."""
    env = dict(figures.NAMES)
    out: dict = {}
    for m in ALIASES.finditer(text):
        for part in re.split(r"[;\s]*(?=\b[A-Z][A-Z0-9_]*\s*=[^=])", m.group(1).strip()):
            if part.strip():
                name, expr = part.split("=", 1)
                out[name.strip()] = env[name.strip()] = eval(expr, {"__builtins__": {}, **env})  # noqa: S307
    return out


def _files_named(expr: str, aliases: dict) -> list[str]:
    """The files an expression reads: its path literals and the aliases it uses (a list of runs
    stands for the folder that holds them all)."""
    files = re.findall(r'"([^"]+\.(?:json|md|yaml|txt))"', expr)
    for a, v in aliases.items():
        if re.search(rf"\b{a}\b", expr):
            files += [v] if isinstance(v, str) else [os.path.commonpath(list(v)) + "/*"]
    return files


def _visible(path: str, para: str) -> bool:
    """The paragraph names the file: its name (any extension), its folder, or the path itself."""
    seen = re.sub(r"<!--.*?-->", "", para, flags=re.S)
    p = Path(path)
    if "*" not in p.name:
        return any(n in seen for n in (path, p.stem + "."))
    # runs in a folder: the paragraph names one of the folders above them (`repro/call5/`)
    folders = [q.name for q in p.parents if q.name and "*" not in q.name and q.name != "results"]
    return any(f + "/" in seen for f in folders)


def _check_tags(path: Path) -> list[str]:
    text = _prose(_doc(path))
    aliases = _aliases(text)
    env = dict(figures.NAMES, **aliases)
    problems = []
    paras = _paragraphs(text)
    for i, para in enumerate(paras):
        for m in TAG.finditer(para):
            expr = " ".join(m.group("expr").split())
            where = f"{path.name}: {m.group('num')}{m.group('unit') or ''} <!--fig {expr}-->"
            try:
                got = float(eval(expr, {"__builtins__": {}, **env}))  # noqa: S307 (the repository's own docs)
            except Exception as e:  # noqa: BLE001
                problems.append(f"{where}: {type(e).__name__}: {e}")
                continue
            if m.group("pct"):
                got *= 100
            printed = m.group("num").replace("−", "-").replace(",", "")
            decimals = len(printed.split(".")[1]) if "." in printed else 0
            if m.group("sign"):
                got = abs(got)
            if abs(got - float(printed)) > 0.5 * 10 ** -decimals + 1e-9:
                problems.append(f"{where}: the file says {got:.{decimals + 2}f}")
            # a table or a list names its file in itself or in the paragraph just before it
            ctx = para + ("\n" + paras[i - 1] if para.lstrip().startswith(("|", "- ")) and i else "")
            for f in _files_named(expr, aliases):
                if not _visible(f, ctx):
                    problems.append(f"{where}: the paragraph does not name {f}")
    return problems


def _untagged(path: Path) -> list[str]:
    lines = [x for x in _prose(_doc(path)).splitlines() if not x.lstrip().startswith("<!--not-measured-->")]
    text = SPAN.sub("", "\n".join(lines))
    found = [f"{path.name}: the range {m.group(0)}.. has an untagged first end" for m in RANGE.finditer(text)]
    text = re.sub(r"<!--.*?-->", "", EXEMPT.sub("", TAG.sub("", text)), flags=re.S)
    for line in text.splitlines():
        found += [f"{path.name}: {m.group(0)!r} in: {line.strip()[:120]}" for m in UNTAGGED.finditer(line)]
    return found


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_every_quoted_figure_is_its_file(path):
    problems = _check_tags(path) + _untagged(path)
    assert not problems, "\n".join(problems)


def test_the_figure_check_catches_a_stale_and_an_untagged_figure(tmp_path):
    page = tmp_path / "page.md"
    f = "results/h200/count-block.json"
    page.write_text(f'From `{f}`: 2.40 µs<!--fig cell("{f}", block_size=128, tokens=1024)-->, and 7.5% slower.\n')
    assert any("the file says 2.41" in p for p in _check_tags(page))
    assert _untagged(page) and "7.5%" in _untagged(page)[0]
    page.write_text(f'Here: 2.41 µs<!--fig cell("{f}", block_size=128, tokens=1024)-->.\n')
    assert any("does not name" in p for p in _check_tags(page))
    page.write_text(f'In `{f}`: ±3.55%<!--fig pct: cell("{f}", "rel_noise", block_size=1024, tokens=1024)-->, '
                    "`0.5%` and 1 s<!--not-measured-->.\n")
    assert not _check_tags(page) and not _untagged(page)


# ----------------------------------------------------------------------------------- generated tables


def _tables(text: str) -> list[str]:
    out, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line.rstrip())
        elif cur:
            out.append("\n".join(cur))
            cur = []
    return out


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_generated_blocks_equal_their_page(path):
    for m in GENERATED.finditer(_doc(path)):
        page, n, body = ROOT / m.group(1), int(m.group(2)), m.group(3)
        assert page.exists(), m.group(1)
        assert _tables(body) == [_tables(page.read_text())[n - 1]], f"{path.name}: block of {m.group(1)} table {n}"


def test_the_headline_page_is_what_render_makes_of_its_json(tmp_path):
    src = ROOT / "results/h200/count-block.json"
    (tmp_path / src.name).write_bytes(src.read_bytes())
    r = warm.run(["render", tmp_path / src.name], cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stderr
    rendered = (tmp_path / "count-block.md").read_text()
    assert _tables(rendered)[0] == _tables(src.with_suffix(".md").read_text())[0]


# ----------------------------------------------------------------------------------- links and paths


def _targets(path: Path) -> list[str]:
    text = _prose(_doc(path))
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    spans = [s.strip("`") for s in SPAN.findall(text)]
    files = [s for s in spans if re.fullmatch(r"[\w./-]+\.(?:md|json|png|csv|txt|log|yaml|py|sh|sbatch|sqlite)", s)]
    folders = [s for s in spans if re.fullmatch(r"(?:results|docs|scripts|sweeps|examples|moebench|tests|configs)"
                                                r"(?:/[\w.-]+)*/?", s)]
    def placeholder(t: str) -> bool:  # out/FOLDER/NAME.png, .series/run.sh, kernels.py: not a file of the repo
        return (bool(re.search(r"(?<![a-z])(?:OUT|NAME|FOLDER|DIR|FILE|PATH|PREFIX|RESULTS|SPEC|COMMIT|NN|DEVICE|SWEEP)"
                               r"(?![a-z])", t)) or t.split("/")[0] in ("out", ".series", ".venv")
                or ("/" not in t and not t.endswith((".md", ".json", ".png", ".csv", ".txt", ".log"))))
    spans = [t for t in files + folders if not placeholder(t)]
    return [t for t in links + spans if not re.match(r"\w+:", t) and "*" not in t]


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_every_linked_file_exists(path):
    missing = []
    for t in _targets(path):
        t = t.split("#")[0]
        if t and not ((path.parent / t).exists() or (ROOT / t).exists()):
            missing.append(t)
    assert not missing, f"{path.name}: {missing}"


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_every_cited_section_exists(path):
    bad = []
    for doc, section in re.findall(r"([\w./-]*\w\.md)`?,\s+\"([^\"]+)\"", _prose(_doc(path))):
        named = [*(ROOT / "results").glob(f"**/{Path(doc).name}"), *(ROOT / "docs").glob(Path(doc).name)]  # `TIMER.md`
        target = next((p for p in (path.parent / doc, ROOT / doc) if p.exists()), named[0] if len(named) == 1 else None)
        heads = [h.lstrip("#").strip() for h in target.read_text().splitlines() if h.startswith("#")] if target else []
        if not any(h.startswith(section.rstrip(".,")) for h in heads):
            bad.append(f"{doc}, {section!r}")
    assert not bad, f"{path.name}: {bad}"


# ----------------------------------------------------------------------------------- code blocks


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", MOEBENCH_RELAUNCHED="1")


def _click():
    import typer.main

    from moebench.cli import app

    return typer.main.get_command(app)


def _lines(block: str) -> list[str]:
    out, cur = [], ""
    for line in block.splitlines():
        cur += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out.append(re.sub(r"\s+#.*$", "", cur).strip())
            cur = ""
    return [x for x in out if x and not x.startswith("#")]


def _check_moebench_line(line: str) -> str | None:
    args = shlex.split(MOEBENCH.match(line).group(1))
    cmd, path = _click(), ["moebench"]
    while args and args[0].startswith("-"):
        if args[0] not in {o for p in cmd.params for o in p.opts + p.secondary_opts}:
            return f"{line}: moebench has no option {args[0]}"
        args.pop(0)
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        if args[0] not in cmd.commands:
            return f"{line}: {' '.join(path)} has no command {args[0]!r}"
        path.append(args[0])
        cmd = cmd.commands[args.pop(0)]
    if hasattr(cmd, "commands"):
        return f"{line}: {' '.join(path)} needs a sub-command"
    opts = {o for p in cmd.params for o in p.opts + p.secondary_opts} | {"--help"}
    for a in args:
        if a.startswith("-") and not re.fullmatch(NUM, a) and a.split("=")[0] not in opts:
            return f"{line}: {' '.join(path)} has no option {a.split('=')[0]}"
    return None


def _check_shell_line(line: str) -> str | None:
    if MOEBENCH.match(line):
        return _check_moebench_line(line)
    words = shlex.split(line)
    if words[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        missing = [w for w in words[1:] if "=" not in w and not w.startswith("-") and w not in targets]
        return f"{line}: no make target {missing}" if missing else None
    for w in words[:3]:
        if re.match(r"(?:scripts|examples)/\S+\.(?:sh|py|sbatch)$", w) and not (ROOT / w).exists():
            return f"{line}: {w} does not exist"
    return None


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_code_blocks_name_real_commands_and_compile(path):
    text = _doc(path)
    problems = []
    for lang, body in _blocks(text):
        if lang == "python":
            try:
                ast.parse(body)
            except SyntaxError as e:
                problems.append(f"python block: {e}")
        elif lang == "bash":
            problems += [p for p in map(_check_shell_line, _lines(body)) if p]
    problems += [f"bare command: {m.group(0)!r}" for m in BARE.finditer(text)]
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def _named_files(text: str) -> dict[str, str]:
    """The blocks that say which file they are (`# NAME.py` / `# NAME.yaml` on their first line)."""
    out = {}
    for lang, body in _blocks(text):
        m = re.match(r"#\s*([\w.-]+\.(?:py|yaml))\b", body)
        if lang in ("python", "yaml") and m:
            out[m.group(1)] = body
    return out


@pytest.mark.parametrize("path", PROSE, ids=IDS)
def test_spec_blocks_validate_and_the_named_files_run_as_written(path, tmp_path):
    text = _doc(path)
    files = _named_files(text)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    specs = []
    for lang, body in _blocks(text):
        doc = yaml.safe_load(body) if lang == "yaml" else None
        if isinstance(doc, dict) and "family" in doc:
            name = next((n for n, b in files.items() if b == body), None)
            if name is None:
                name = f"spec{len(specs)}.yaml"
                (tmp_path / name).write_text(body)
            specs.append(name)
    plugins = [x for n in files if n.endswith(".py") for x in ("--plugin", n)]
    if specs:
        r = warm.run(["validate", *specs, *plugins], cwd=tmp_path, env=_env(), timeout=120)
        assert r.returncode == 0, f"{path.name}: {r.stdout}{r.stderr}"
    ran = 0
    for lang, body in _blocks(text):
        for line in _lines(body) if lang == "bash" else []:
            if MOEBENCH.match(line) and any(n in shlex.split(line) for n in files):
                r = warm.run(shlex.split(MOEBENCH.match(line).group(1)), cwd=tmp_path, env=_env(), timeout=120)
                assert r.returncode == 0, f"{path.name}: `{line}` exited {r.returncode}:\n{r.stdout}{r.stderr}"
                ran += 1
    assert ran or not any(n.endswith(".py") for n in files), f"{path.name}: no bash line runs its plugin"


# ----------------------------------------------------------------------------------- what the pages list


def test_the_readme_lists_every_command():
    """The command table names every command and sub-command `--help` lists, and nothing else."""
    listed = set()
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"\| `([a-z]+)(?: ([a-z]+))?\b[^`]*` \|", line)
        if m:
            listed.add(" ".join(x for x in m.groups() if x))
    cli = _click()
    want = {f"{n} {s}" if hasattr(c, "commands") else n
            for n, c in cli.commands.items() for s in (getattr(c, "commands", None) or [None])}
    assert listed == want, f"missing {sorted(want - listed)}, not commands {sorted(listed - want)}"


def test_the_parameter_tables_agree_with_the_families():
    """docs/plugins.md's table of a family's parameters has every parameter, with its role and
    default (the meaning column is prose and not compared)."""
    from moebench.core.family import REQUIRED, catalogue

    text = (ROOT / "docs/plugins.md").read_text()
    for name in ("count", "act"):
        section = text.split(f"#### `{name}`", 1)[1].split("\n#", 1)[0]
        rows = re.findall(r"^\| `(\w+)` \| (\w+) \| ([^|]+) \|", section, re.M)
        fam = catalogue()[name]
        assert [r[0] for r in rows] == list(fam.params), name
        for pname, role, default in rows:
            p = fam.params[pname]
            want = (f"model: `{p.model_key}`" if p.model_key else "required" if p.default is REQUIRED
                    else f"`{p.default!r}`")
            assert (role, default.strip()) == (p.role, want), (name, pname)
