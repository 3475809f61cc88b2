"""Run a built-in sweep's cases through the run driver in this process (for the GPU suite)."""

from __future__ import annotations


def run(spec_name: str, *, l2: str = "warm", cross: tuple[str, ...] = (), where=None) -> list:
    """Records of the spec's default cases (those `where(case, impl, device)` keeps), timed on this GPU."""
    from moebench.core.cases import expand
    from moebench.core.device import detect
    from moebench.core.driver import Finished, Summary, run_sweep
    from moebench.core.pipeline import Options
    from moebench.core.spec import load_spec

    spec = load_spec(spec_name)
    spec.timing.l2 = l2
    dev = detect(False)
    cases = expand(spec)
    if where is not None:
        impl = spec.family.load()
        cases = [c for c in cases if where(c, impl, dev)]
    records = None
    for ev in run_sweep(spec, cases, Options(timing=spec.timing, time_it=True, cross=cross), dev):
        if isinstance(ev, Summary):
            records = ev.records
        elif isinstance(ev, Finished):  # an upstream kernel not installed here is no failure
            assert ev.record.status in ("ok", "unavailable"), f"{ev.record.case_id}: {ev.record.status} {ev.record.error}"
    return [r for r in records if r.status == "ok"]
