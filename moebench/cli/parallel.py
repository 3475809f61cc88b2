"""`moebench merge` (moebench.parallel.merge): parse -> merge_results -> write -> one summary line."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from moebench.cli.common import err, exit_code, out, print_failures
from moebench.cli.run import FORMAT_OPT
from moebench.core.store import OutputLock, ResultsWriter, check_formats, output_file, writable_dir
from moebench.errors import UsageError
from moebench.parallel.merge import merge_results
from moebench.parallel.shards import unshard_stem
from moebench.report.sweep import sweep_markdown, verdict_line

app = typer.Typer()


def _destination(text: Optional[str], files: list[Path]) -> tuple[Path, str]:
    """-o OUT -> (directory, stem). OUT is a directory (an existing one, or any path ending in /:
    the stem comes from the shard files, less their .shardIofN), or a file path with or without
    .json/.csv/.md. Default: beside the first file."""
    stem = unshard_stem(files[0].stem)
    if text is None:
        return files[0].parent, stem
    output = Path(text)  # before Path drops a trailing slash
    if output.is_dir() or text.endswith(("/", "\\")):
        return output, stem
    if output.suffix in (".json", ".csv", ".md", ".parquet"):
        output = output.with_suffix("")
    return output.parent, output.name


@app.command(short_help="Merge shard results into one results file.")
def merge(
    files: list[Path] = typer.Argument(..., help="Shard results .json files (e.g. OUT/DEVICE/NAME.shard*of4.json)."),
    output: Optional[str] = typer.Option(None, "-o", "--out", help="Where to write: a directory (one that exists, "
                                         "or a path ending in /), or a path without suffix (default: beside the "
                                         "first file, without .shardIofN)."),
    formats: str = FORMAT_OPT,
    force: bool = typer.Option(False, "--force", help="Replace results files that hold more records than the merge."),
):
    """Merge shard results into one file, from the files alone (no spec file is read and no plugin
    loaded). Shards must share the spec (sha256), the device class, the matrix, the timing settings,
    the kill-switch variables and the baseline launch; a case in two files must have identical
    results. Exit 1 when a case failed or the merge is incomplete (a shard missing, or a shard that
    did not finish)."""
    fmts = check_formats(formats)
    m = merge_results(files)
    dest, stem = _destination(output, m.files)
    writable_dir(dest, "-o")
    for suffix in fmts:  # never an input; replacing an older merge is the writer's call (more records, --force)
        output_file(dest / f"{stem}.{suffix}", inputs=m.files, force=True)
    prov = m.provenance
    spec = m.spec
    host_only = prov.get("device", {}).get("backend") == "host"  # what the files say: no kernel launched
    md = None
    if "md" in fmts:
        prov = {**prov, "complete": m.complete}
        md = sweep_markdown(spec, m.records, prov)
    with OutputLock(dest, stem):
        written = ResultsWriter(dest, stem, prov, fmts, force=force).finalize(m.records, complete=m.complete,
                                                                              markdown=md)
    if written.kept is not None:
        raise UsageError(f"-o: {written.kept[0]} holds {written.kept[1]} records and the merge {len(m.records)}; "
                         "not replaced (pass --force to replace it)")
    paths = written.paths

    for note in m.notes:
        err.print(f"note: {note}", style="yellow", highlight=False, soft_wrap=True)
    out.print(merged_line(m, prov, host_only), style="bold", highlight=False, soft_wrap=True)
    print_failures(m.records)
    out.print("Wrote " + ", ".join(str(p) for p in paths))
    raise typer.Exit(exit_code(m.records, m.complete))


def merged_line(m, prov: dict, host_only: bool) -> str:
    """One line on what the merge holds: the verdict, and what is missing when it is incomplete."""
    gaps = []
    if m.missing_shards:
        gaps.append(f"shard{'s' if len(m.missing_shards) > 1 else ''} "
                    f"{', '.join(map(str, m.missing_shards))} of {m.shard_count} missing")
    if m.missing_cases:
        gaps.append(f"{m.missing_cases} case{'s' if m.missing_cases > 1 else ''} of the spec missing")
    if m.incomplete_files:
        gaps.append("unfinished: " + ", ".join(str(f) for f in m.incomplete_files))
    line = verdict_line(m.records, host_only)
    dups = f", {m.duplicates} duplicate{'s' if m.duplicates != 1 else ''} kept once" if m.duplicates else ""
    return (f"{prov.get('sweep')}: merged {len(m.files)} file{'s' if len(m.files) != 1 else ''}, "
            f"{len(m.records)} records{dups}: {line}; "
            f"{'complete' if m.complete else 'INCOMPLETE (' + '; '.join(gaps) + ')'}")
