"""The count family's part of a sweep's results page (records only)."""

from moebench.core.text import md_table, num


def markdown_sections(records) -> str:
    """Each timed row against the empty-kernel floor (the bytes-moved floor of a few KB means
    nothing here) and the geometry the seed argues from: CTAs with work, pairs per thread."""
    timed = [r for r in records if r.status == "ok" and r.timing.get("median_us") is not None]
    if not timed:
        return ""
    out = ["## Against the empty-kernel floor", "",
           "empty = a no-op Triton kernel at grid = SM count (grid 1 for one-CTA launches), captured and replayed the "
           "same way; the count kernel "
           "moves a few KB, so its bytes-moved floor is not a useful reference.", ""]
    rows = []
    for r in timed:
        w, g = r.work, r.launch
        rows.append([r.label, r.params["tokens"], g.get("block_size"), g.get("num_warps"),
                     f"{r.timing['median_us']:.2f}", num(w.get("empty_us")), num(w.get("over_empty_us")),
                     num(w.get("x_empty")), w.get("ctas"), w.get("ctas_with_work"), w.get("pairs_per_thread"),
                     num(w.get("delta_us"), "+.2f"), num(w.get("per_step_delta_us"), "+.1f")])
    out.append(md_table(["variant", "tokens", "block", "warps", "µs", "empty µs", "over empty µs", "× empty", "CTAs",
                         "with work", "pairs/thread", "Δ vs baseline µs", "per step µs"], rows))
    return "\n".join(out)
