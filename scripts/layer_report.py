"""The REPORT.md section "Which microbenchmark wins survive in a layer", from one GPU run's layer files.

Reads, from a results directory (OUT/<device>/):

- `layer-count-ab.json`: `moebench ab layer-count --off count_block_size=1024 --on count_block_size=128`
- `layer-act-ab.json`: `moebench ab layer-act --off act_variant=legacy --on act_variant=capped` (cap 8192)
- `layer-act-best-ab.json` (optional): the same with the best cap of the layer sweep
- `layer.json` (optional): `moebench sweep layer`, every configuration in the step
- `count-block-ab.json`, `act-grid-rows.json` (optional, --kernel-dir): the kernel sweeps' own savings

and writes the section: per change, the kernel sweep's saving, the saving of the kernel alone at
the layer's shape, in one layer step, their ratio (the conversion), and the 48-layer graph's saving
against 48 x the isolated one; then the fastest configurations in the step.

    python3 scripts/layer_report.py results/h200 --kernel-dir results/h200 -o layer-report.md
    python3 scripts/layer_report.py best-cap results/h200/layer.json    # prints the best cap

Pure Python over results files: no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's moebench, run from anywhere

from moebench.analysis.ab import separation_cell  # noqa: E402
from moebench.core.records import load_results  # noqa: E402
from moebench.core.store import atomic_write_text  # noqa: E402
from moebench.analysis import TIE_NOTE, fastest  # noqa: E402
from moebench.report.ties import fastest_text, full_labels  # noqa: E402
from moebench.core.text import md_table, num  # noqa: E402
from moebench.report.sections.layer import SEPARATION_LEGEND, conversions  # noqa: E402

HEADING = "## Which microbenchmark wins survive in a layer"
# The decode shape the seeds argue from (256 live tokens in a 256-token graph), with the count at
# seed 000's BLOCK_SIZE 128 as sweeps/layer-act.yaml has it: where the best cap is looked for.
DECODE = {"tokens": 256, "buffer_tokens": 256, "op": "silu_mul_bounded", "count_block_size": 128}


def _load(path: Path):
    return load_results(path) if path.is_file() else (None, [])


def best_cap(sweep: Path, shape: dict = DECODE) -> int | None:
    """The activation grid cap of the fastest capped step at the decode shape of a layer sweep."""
    _, records = _load(sweep)
    capped = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None
              and r.variant == "step" and r.launch.get("act_variant") == "capped"
              and all(r.params.get(k) == v for k, v in shape.items())]
    if not capped:
        return None
    return int(min(capped, key=lambda r: r.timing["median_us"]).launch["act_grid_cap"])


def kernel_sweep_saving(path: Path, tokens: int = 256) -> tuple[str, str] | None:
    """(Δ text, where) of the count family's own A/B at `tokens`, from its `ab` summary."""
    if not path.is_file():
        return None
    import json

    doc = json.loads(path.read_text())
    for c in (doc.get("ab") or doc.get("provenance", {}).get("ab") or {}).get("cases", []):
        if c.get("case") == f"tokens={tokens}" and c.get("delta_us") is not None:
            _, records = load_results(path)
            cap = next((r.params.get("buffer_tokens") for r in records if r.params.get("tokens") == tokens), None)
            return f"{c['delta_us']:+.3f} ({c.get('separation')})", f"`{path.name}`, {tokens} of {cap} tokens"
    return None


def act_sweep_saving(path: Path, layer_rows: int, cap: int) -> tuple[str, str] | None:
    """(Δ text, where) of the act family's capacity sweep (act-grid-rows: capped vs legacy at
    2048 live rows) at the M with the layer's grid, next_pow2 of the layer's rows, for `cap`."""
    _, records = _load(path)
    m = 1 << (layer_rows - 1).bit_length()
    at = {r.variant: r for r in records if r.status == "ok" and r.params.get("rows") == m
          and r.timing.get("median_us") is not None and (r.variant == "legacy" or r.launch.get("grid_cap") == cap)}
    if "capped" not in at or "legacy" not in at:
        return None
    d = at["capped"].timing["median_us"] - at["legacy"].timing["median_us"]
    return (f"{d:+.3f} (one sweep, no arms)",
            f"`{path.name}`, M {m} (the layer's {layer_rows} rows take the same grid), "
            f"{at['capped'].params.get('live_rows')} live rows")


def _on_launch(records, key: str):
    """The launch value `key` of the ON side's kernel-alone records of an A/B."""
    return next((r.launch.get(key) for r in records if r.timing.get("ab_side") == "ON"
                 and r.params.get("scope") != "step"), None)


def change_rows(directory: Path, kernel_dir: Path | None) -> tuple[list[list[str]], list[str]]:
    """One table row per A/B file present, and a sentence per change on what survives."""
    rows, verdicts = [], []
    for name, what in (("layer-count-ab.json", "seed 000: count BLOCK_SIZE 1024 → 128"),
                       ("layer-act-ab.json", "seed 001: activation min(M, 512) → cap 8192"),
                       ("layer-act-best-ab.json", None)):
        prov, records = _load(directory / name)
        if not records:
            continue
        if what is None:
            on = ", ".join((prov.get("ab") or {}).get("on", []))
            what = f"activation min(M, 512) → the layer sweep's best ({on})"
        ks = None
        if kernel_dir is not None and "count" in name:
            ks = kernel_sweep_saving(kernel_dir / "count-block-ab.json")
        elif kernel_dir is not None and _on_launch(records, "rows"):
            ks = act_sweep_saving(kernel_dir / "act-grid-rows.json", int(_on_launch(records, "rows")),
                                  _on_launch(records, "act_grid_cap"))
        for c in conversions(records):
            row = [what, f"{c.shape.get('tokens')} of {c.shape.get('buffer_tokens')}",
                   f"{ks[0]} ({ks[1]})" if ks else "—",
                   f"{c.isolated.delta:+.3f} ({separation_cell(c.isolated)})" if c.isolated else "—",
                   f"{c.one.delta:+.3f} ({separation_cell(c.one)})" if c.one else "—", num(c.conversion),
                   num(c.projection, "+.1f"),
                   f"{c.many.delta:+.1f} ({separation_cell(c.many)})" if c.many else "—",
                   num(c.many_vs_projection)]
            rows.append(row)
            verdicts.append(f"- **{what}**: {_verdict(c)}")
    return rows, verdicts


def _verdict(c) -> str:
    """What the numbers say, in words: whether the isolated win survives in the step."""
    iso, one = c.isolated, c.one
    if iso is None or one is None:
        return "the A/B lacks the isolated or the one-layer arm; no verdict."
    if iso.separation != "better":
        return (f"no separated win even alone at the layer's shape (isolated Δ {iso.delta:+.3f} µs, "
                f"{separation_cell(iso)}).")
    text = (f"alone it saves {-iso.delta:.3f} µs per launch; in the layer step it "
            f"{'saves' if one.delta < 0 else 'costs'} {abs(one.delta):.3f} µs ({separation_cell(one)}), a conversion "
            f"of {num(c.conversion)}")
    if one.separation == "worse":
        text += ": the win **reverses** in the layer"
    elif one.separation == "overlap":
        text += ": the win is **not separated from noise** in the layer"
    elif (c.conversion or 0) >= 0.75:
        text += ": the win **survives**"
    else:
        text += ": the win **survives in part**"
    if c.many is not None and c.projection:
        text += (f". Over {c.layers} layers in one graph the change {'saves' if c.many.delta < 0 else 'costs'} "
                 f"{abs(c.many.delta):.1f} µs against a projected saving of {-c.projection:.1f} µs "
                 f"({num(c.many_vs_projection)} of it; {separation_cell(c.many)})")
    return text + "."


def _baseline_test(prov: dict):
    """is_baseline for the sweep a results file came from; without its spec, the record whose
    own Δ against the baseline is 0."""
    from moebench.core.cases import is_baseline
    from moebench.core.spec import load_spec
    from moebench.errors import MoebenchError

    try:
        spec = load_spec(prov["sweep"])
        return lambda r: is_baseline(spec, r.variant, r.params)
    except (MoebenchError, KeyError, TypeError):
        return lambda r: r.work.get("delta_us") == 0


def sweep_rows(path: Path) -> list[list[str]]:
    """Per shape of the layer sweep: the fastest configuration, the seeds' before-launch and the
    upstream arm."""
    prov, records = _load(path)
    if not records:
        return []
    is_base = _baseline_test(prov)
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    shapes: dict[tuple, list] = {}
    for r in timed:
        key = (r.params.get("op"), r.params.get("tokens"), r.params.get("buffer_tokens"), r.params.get("local_experts"))
        shapes.setdefault(key, []).append(r)
    shape_keys = ("op", "tokens", "buffer_tokens", "local_experts")
    names = dict(zip(map(id, timed), full_labels(timed, [k for k in timed[0].params if k not in shape_keys])))
    rows = []
    for (op, tokens, cap, local), rs in shapes.items():
        top = fastest(rs)
        best = top[0]
        base = next((r for r in rs if is_base(r)), None)

        def cell(r):
            return f"{names[id(r)]} {r.timing['median_us']:.2f}"

        won = cell(best) if len(top) == 1 else fastest_text(top, lambda r: names[id(r)])
        rows.append([op, f"{tokens} of {cap}", local, cell(base) if base else "—", won,
                     num(best.work.get("delta_us"), "+.2f"), num(best.work.get("per_step_delta_us"), "+.1f"),
                     ", ".join(cell(r) for r in rs if r.variant == "mcore") or "—"])
    return rows


def section(directory: Path, kernel_dir: Path | None = None) -> str:
    rows, verdicts = change_rows(directory, kernel_dir)
    prov = next((load_results(p)[0] for p in sorted(directory.glob("layer*.json"))), {}) or {}
    dev = prov.get("device", {})
    out = [HEADING, "",
           f"moebench's `layer` family times a whole Qwen3-30B-A3B MoE layer step on one EP4 rank (routing, token "
           f"count, offsets, permute, FC1 grouped GEMM, activation, FC2 grouped GEMM, combine; bf16, one CUDA "
           f"graph, live tokens in a device scalar) with a count and an activation variant inside it, and the same "
           f"kernel alone on the step's own tensors. Device: {dev.get('name', '?')}, torch {dev.get('torch', '?')}, "
           f"triton {dev.get('triton', '?')}. Each change is an interleaved A/B (4 arms OFF/ON/OFF/ON) over three "
           "launches: the kernel alone, one layer step, and 48 layer steps with distinct weights in one graph.", ""]
    if rows:
        out += [md_table(["change", "live of capacity tokens", "kernel sweep Δ µs", "alone at the layer's shape Δ µs",
                          "in one layer step Δ µs", "conversion", "48 × alone µs", "48-layer graph Δ µs",
                          "48-layer / projection"], rows), "", SEPARATION_LEGEND, "", *verdicts, ""]
    else:
        out += ["No layer A/B results in this directory.", ""]
    srows = sweep_rows(directory / "layer.json")
    if srows:
        out += ["Every configuration of `moebench sweep layer` in the step (µs per layer step; Δ and per step "
                "against the seeds' before-launch at the same shape; `layer.md` has every row):", "",
                md_table(["op", "live of capacity tokens", "local experts", "before", "fastest", "fastest Δ µs",
                          "per step µs", "megatron-core fused MoE"], srows), ""]
        if any(r[4].startswith("tie: ") for r in srows):
            out += [f"tie: {TIE_NOTE} Δ and per step are those of the first named.", ""]
    out += ["Files: `layer.{csv,json,md}`, `layer-count-ab.{json,md}`, `layer-act-ab.{json,md}`"
            + (", `layer-act-best-ab.{json,md}`" if (directory / "layer-act-best-ab.json").is_file() else "") + "."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["best-cap"]:
        ap = argparse.ArgumentParser(prog="layer_report best-cap")
        ap.add_argument("sweep", type=Path)
        ap.add_argument("--default", type=int, default=1024)
        a = ap.parse_args(argv[1:])
        print(best_cap(a.sweep) or a.default)
        return 0
    ap = argparse.ArgumentParser(prog="layer_report", description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path, help="OUT/<device>/ with the layer results files")
    ap.add_argument("--kernel-dir", type=Path, help="where count-block-ab.json (the kernel sweep's A/B) is")
    ap.add_argument("-o", "--out", type=Path, help="write the section here (default: print it)")
    a = ap.parse_args(argv)
    text = section(a.directory, a.kernel_dir)
    if a.out:
        atomic_write_text(a.out, text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
