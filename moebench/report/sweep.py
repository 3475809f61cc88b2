"""Records -> tables. Long format in, PR-style pivots out (rows one parameter, columns another).

Library code: returns DataFrames and strings; the CLI prints them. pandas is imported where a
table is pivoted, so that the commands that only print a verdict start without it.
"""

from __future__ import annotations

from typing import Any

from moebench.analysis import metric_of, params_text, value_of
from moebench.analysis.reference import Reference
from moebench.core.noise import page_line
from moebench.core.records import Record
from moebench.core.text import md_table, ordered, printable, varying
from moebench.report.conformance import section as twins_section
from moebench.report.counters import section as counters_section  # records with cross.counters
from moebench.report.sections import SWEEP, family_section
from moebench.report.sections.layer import ratio
from moebench.report.ties import NOT_TAKEN, _label, full_labels

STATUS_MARK = {"mismatch": "✗ mismatch", "error": "✗ error", "unavailable": "n/a"}


def frame(records: list[Record]) -> pd.DataFrame:
    """Long format. Parameter columns stay objects: a launch parameter a variant does not read is
    None (not NaN, which would split groups and turn integer caps into floats)."""
    import pandas as pd

    df = pd.DataFrame([r.to_row() for r in records])
    names = {k for r in records for k in r.params}
    for c in df.columns:
        if c in names:
            df[c] = pd.Series([r.params.get(c) for r in records], index=df.index, dtype=object)
    return df


def pivots(records: list[Record], rows: str, cols: str, metric: str,
           param_names: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """One pivot per combination of the other varying parameters. Cells hold the metric, or a
    status mark for failed cases. Returns (title, table) pairs.

    With several variant labels along the rows, a parameter splits the tables only when every
    label sweeps the same values of it (a shared axis). One swept inside a single variant entry
    (`axes: {act_grid_cap: [512, 1024]}`) or by a few labels only goes into those rows' labels
    (`count 128, act cap, act_grid_cap=512`), so no table is one row long and no two rows read
    alike; one set by the column value (the partner of a `zip`) is named in the title."""
    import pandas as pd

    df = frame(records)
    if df.empty:
        return []
    if metric not in df.columns:
        df[metric] = None
    others = [c for c in varying([{"label": r.label, **r.params} for r in records], ["label"] + param_names)
              if c in df.columns and c not in (rows, cols)]
    row_keys = ([rows] if rows in df.columns else [])
    if "label" in others:  # several variants: they become row groups, like the PR's "(before)" row
        others.remove("label")
        row_keys = ["label"] + row_keys
    col = cols if cols in df.columns else "label"
    by_col = [c for c in others if (df.groupby(col, dropna=False, sort=False)[c].nunique(dropna=True) <= 1).all()]
    others = [c for c in others if c not in by_col]
    if "label" in row_keys or cols == "label":
        others, inner = _shared_axes(df, others)
        df["label"] = full_labels(records, inner)

    def cell(r: dict) -> Any:
        if r["status"] != "ok":
            return STATUS_MARK.get(r["status"], r["status"])
        v = r[metric]
        return None if pd.isna(v) else v

    tables = []
    groups = df.groupby(others, dropna=False, sort=True) if others else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        title = ", ".join([f"{k}={_label(v)}" for k, v in zip(others, key)] + _per_column(g, col, by_col))
        idx = row_keys or ["label"]
        row_vals = ordered(tuple(t) for t in g[idx].itertuples(index=False, name=None))
        col_vals = ordered((v,) for v in g[col])
        need = list(dict.fromkeys([*idx, col, "status", metric]))
        cells = {(tuple(r[i] for i in idx), r[col]): cell(r) for r in g[need].to_dict("records")}
        data = [[_safe(cells.get((rv, cv[0]))) for cv in col_vals] for rv in row_vals]
        shown = [tuple(_safe(_label(x)) for x in rv) for rv in row_vals]
        index = pd.MultiIndex.from_tuples(shown, names=idx) if len(idx) > 1 else pd.Index(
            [rv[0] for rv in shown], name=idx[0], dtype=object)
        t = pd.DataFrame(data, index=index, columns=pd.Index([_safe(cv[0]) for cv in col_vals], name=col))
        tables.append((printable(title), t))
    return tables


def _safe(v: Any) -> Any:
    """A cell or label read from a results file: text printable (no escape sequence reaches a
    terminal or a page), numbers as they are."""
    return printable(v) if isinstance(v, str) else v


def _shared_axes(df: pd.DataFrame, names: list[str]) -> tuple[list[str], list[str]]:
    """(shared, inner): of `names`, those every label sweeps over the same values (they split the
    tables), and those that vary inside some labels only (they go into those labels). A name
    constant within each label is neither: the label already says it."""
    shared, inner = [], []
    for c in names:
        sets = [frozenset(map(repr, g.dropna())) for _, g in df.groupby("label", sort=False)[c]]
        sets = [x for x in sets if x]
        if sets and len(set(sets)) == 1 and len(sets[0]) > 1:
            shared.append(c)
        elif any(len(x) > 1 for x in sets):
            inner.append(c)
    return shared, inner


def _per_column(g: pd.DataFrame, col: str, names: list[str]) -> list[str]:
    """Title parts for parameters set by the column value: `tokens per column: 256, 256, 2048`."""
    parts = []
    for c in names:
        by = {}
        for cv, v in zip(g[col], g[c]):
            if v is not None and not (isinstance(v, float) and v != v):  # None or NaN
                by.setdefault(cv, v)
        if len({repr(v) for v in by.values()}) > 1:
            parts.append(f"{c} per column: " + ", ".join(str(_label(by.get(cv[0]))) for cv in ordered((v,) for v in g[col])))
    return parts


NOT_TAKEN_NOTE = (f"{NOT_TAKEN} in a row label: the variant does not take that parameter; what it launched with is "
                  "in the record's launch columns (in the CSV and JSON).")


def fmt(v: Any, metric: str = "") -> str:
    if v is None or (isinstance(v, float) and v != v):  # None or NaN
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if metric.endswith("_pct") or metric.startswith("x_"):
            return f"{v:.2f}"
        return f"{v:.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def pivot_rows(t: pd.DataFrame, metric: str, corner: str | None = None) -> tuple[list[str], list[list[str]]]:
    """A pivot's header and rows as text: the row key, then each cell formatted (`fmt`)."""
    head = [corner or " / ".join(str(n) for n in t.index.names)] + [str(c) for c in t.columns]
    rows = [[" ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))] + [fmt(v, metric) for v in row]
            for key, row in t.iterrows()]
    return head, rows


def beside_reference(records: list[Record], ref: Reference, rows: str, cols: str, metric: str,
                     param_names: list[str]) -> list[tuple[str, str, Any]]:
    """For `show --reference`: (kind, title, table) for each measured pivot ("measured"), the
    reference over the same rows and columns ("reference"), and measured / reference ("ratio").
    Cells are matched on the (rows, cols) values alone; other parameters are whatever each side
    held fixed. Pivots with no reference cell at all are left out."""
    import pandas as pd

    ref_cells = {(value_of(r, rows), value_of(r, cols)): metric_of(r, metric) for r in ref.records}
    out = []
    for title, t in pivots(records, rows, cols, metric, param_names):
        def row_val(key):
            return key[-1] if isinstance(key, tuple) else key

        ref_t = pd.DataFrame([[ref_cells.get((row_val(k), c)) for c in t.columns] for k in t.index],
                             index=t.index, columns=t.columns)
        ratios = pd.DataFrame([[ratio(t.loc[k, c], ref_t.loc[k, c]) for c in t.columns] for k in t.index],
                              index=t.index, columns=t.columns)
        if ref_t.isna().all().all():
            continue
        pre = f"{title}, " if title else ""
        out += [("measured", title, t), ("reference", f"{pre}{ref.label}", ref_t),
                ("ratio", f"{pre}measured ÷ {ref.label}", ratios)]
    return out


def page_metric(spec, records: list[Record]) -> str:
    """What a page's pivots show: the spec's metric where a case was timed (or where no kernel runs:
    a host-only family), else ref_check, the correctness check."""
    timed = spec.family.host_only or any(r.timing.get("median_us") is not None for r in records)
    return spec.pivot.get("metric", "median_us") if timed else "ref_check"


def page_pivots(spec, records: list[Record]) -> tuple[str, str, list[tuple[str, pd.DataFrame]]]:
    """The pivots of a results page (and of the terminal after a sweep): (metric, the corner
    "rows \\ cols", the tables), over the spec's pivot."""
    metric = page_metric(spec, records)
    rows, cols = spec.pivot.get("rows", "label"), spec.pivot.get("cols", "label")
    return metric, f"{rows} \\ {cols}", pivots(records, rows, cols, metric, list(spec.family.params))


def verdict_line(records: list[Record], host_only: bool = False) -> str:
    """'2280/2280 exact' when every passing case equals the torch reference bit for bit; for bf16
    kernels that pass within their stated ulp bound, says how many were exact and how many not. A
    host-only family's cases are evaluated, not checked against a kernel."""
    if host_only:
        return f"{sum(r.status == 'ok' for r in records)}/{len(records)} cases evaluated"
    v = {s: sum(r.status == s for r in records) for s in ("mismatch", "error", "unavailable")}
    ok = [r for r in records if r.status == "ok"]
    inexact = [r for r in ok if r.checks.get("ref_check", "exact") != "exact"]
    ran = len(records) - v["unavailable"]
    if inexact:
        line = (f"{len(ok)}/{ran} pass (every launch torch.equal to the baseline launch; "
                f"{len(ok) - len(inexact)} exact against torch, {len(inexact)} within the stated ulp bound)")
    else:
        line = f"{len(ok)}/{ran} exact"
    if v["mismatch"]:
        line += f", {v['mismatch']} mismatched"
    if v["error"]:
        line += f", {v['error']} failed to run"
    if v["unavailable"]:
        line += f", {v['unavailable']} unavailable (kernel source not here)"
    return line


def sweep_markdown(spec, records: list[Record], prov: dict) -> str:
    """The results page: what ran, where, the verdict, the PR-style tables and the floors."""
    dev = prov.get("device", {})
    c = prov.get("ceilings", {}) or {}
    out = [f"# {spec.name}", ""]
    if prov.get("complete") is False:
        n = prov.get("n_cases")
        out += [f"**INCOMPLETE: {len(records)} of {n if n is not None else '?'} cases.** The run was interrupted; "
                "`--resume` runs the rest into the same OUT.", ""]
    if spec.description:
        out += [spec.description.strip(), ""]
    host = spec.family.host_only
    if host:
        out.append("- Evaluated on the host: a model of the kernel's sizing, no kernel launched, nothing timed.")
    elif dev.get("backend") == "interpret":
        out.append(f"- Device: this machine's CPU, kernels run by the Triton interpreter as if on a "
                   f"{dev.get('sm_count')}-SM GPU (correctness only, nothing timed); torch {dev.get('torch')}, "
                   f"triton {dev.get('triton')}")
    else:
        out.append(f"- Device: {dev.get('name')} ({dev.get('sm_count')} SMs, L2 {dev.get('l2_bytes', 0) / 2**20:.0f} "
                   f"MiB), driver {dev.get('driver')}, CUDA {dev.get('cuda')}, torch {dev.get('torch')}, "
                   f"triton {dev.get('triton')}")
    out += [f"- Command: `{prov.get('command')}`",
            f"- Spec: `{prov.get('spec_path')}` sha256 {str(prov.get('spec_sha256'))[:12]}, seed {prov.get('seed')}, "
            f"commit {prov.get('git_commit')}, {prov.get('timestamp')}"]
    if not host:
        out.append(f"- Correctness: **{verdict_line(records)}** (torch reference and `torch.equal` against the "
                   f"baseline launch {params_text(spec.baseline or {}) or 'none'})")
        borrowed = spec.family.borrowed_work(r.variant for r in records)
        if borrowed:
            out.append(f"- Work model: {', '.join(f'`{v}`' for v in borrowed)} (plugin) "
                       f"{'declares' if len(borrowed) == 1 else 'declare'} none, so the bytes, CTAs with work and "
                       f"floors of {'its' if len(borrowed) == 1 else 'their'} records are the {spec.family.name} "
                       "family's model, which assumes its kernels' access pattern (`work=` on `variant(...)` "
                       "declares a plugin's own).")
    timed = [r for r in records if r.timing.get("median_us") is not None]
    if timed:
        t = prov.get("timing", {})
        noise = [n for r in timed if (n := r.timing.get("rel_noise")) is not None]
        out.append(f"- Timer: {timer_text(t)}" + (f"; worst achieved ±{100 * max(noise):.2f}%." if noise else "."))
        out.append(page_line(prov, timed))
        if c:
            out.append(f"- Ceilings on this device: copy {c.get('copy_dram_gbps', 0):,.0f} GB/s from DRAM, "
                       f"{c.get('copy_l2_gbps', 0):,.0f} GB/s L2-resident (bytes read + written); empty kernel "
                       f"{c.get('empty_us', 0):.2f} µs at grid 1, {c.get('empty_sms_us', 0):.2f} µs at grid = SMs.")
    elif host:
        pass
    elif prov.get("matrix") == "verify":
        out.append("- Timing: none — `verify` runs the correctness matrix only.")
    elif dev.get("backend") == "interpret":
        out.append("- Timing: none — this run had no CUDA device (Triton interpreter on the CPU checks "
                   "correctness only).")
    else:
        out.append("- Timing: none in this run.")
    out.append("")
    metric, corner, tables = page_pivots(spec, records)
    for title, t in tables:
        out += [f"## {metric}" + (f" — {title}" if title else ""), "", md_table(*pivot_rows(t, metric, corner)), ""]
    if any(NOT_TAKEN in str(k) for _, t in tables for k in t.index):
        out += [NOT_TAKEN_NOTE, ""]
    # a family may add sections of its own (e.g. combine's band table), after the pivots
    own = family_section(SWEEP, spec.family, records)
    if own is not None:
        out += [own, ""]
    out += [s + "\n" for s in (counters_section(spec, records),) if s]
    twins = twins_section(records)
    if twins:
        out += [twins, ""]
    bad = [r for r in records if r.status != "ok"]
    if bad:
        out += ["## Failed cases", ""]
        out += [f"- `{r.case_id}` {r.label} {params_text(r.params)}: {r.status}: {r.error.splitlines()[0] if r.error else ''}"
                for r in bad]
        out.append("")
    return "\n".join(out)


def timer_text(t: dict) -> str:
    """How a number was made, from a results file's timing settings (provenance.timing)."""
    groups = t.get("groups") or 1
    most = max(groups, t.get("max_groups") or groups)
    sets = t.get("placements")
    copies = t.get("placement_copies") or 1
    where = (f"{sets} input sets x {copies} placements each" if copies > 1 else f"{sets} input sets") + (
        f" in {t.get('placement_memory')} memory" if t.get("placement_memory") else "")
    strata = t.get("placement_strata") or 1
    if t.get("placement_memory") == "private" and strata > 1 and t.get("placement_stride"):
        where += f", placement k offset (k mod {strata}) x {t['placement_stride']} B into its pool"
    stop = (f"the 95% half-width < {100 * (t.get('target_rel_noise') or 0):.1f}% or {t.get('max_seconds')} s")
    rerun = t.get("rerun_rel") or 0
    plus = f", plus a {100 * rerun:.1f}% run-to-run component in quadrature" if rerun else ""
    if groups > 1:
        grow = (f" (up to {most} while their interval is over {100 * (t.get('groups_rel_noise') or 0):.1f}%)"
                if most > groups else "")
        return (f"CUDA-graph replay, {t.get('launches_per_graph')} launches per graph over {where} (warm L2 "
                f"rotation: as many as fit), {groups} graphs{grow} each over its own freshly allocated placements, "
                f"replays interleaved; the number is the mean of the per-graph medians and its stated "
                f"half-width the t-interval between them{plus} (stop when {stop}). L2: {t.get('l2')}")
    return (f"CUDA-graph replay, {t.get('launches_per_graph')} launches per graph over {where}, per-launch median "
            f"over replays{plus} (stop when {stop}). L2: {t.get('l2')}")
