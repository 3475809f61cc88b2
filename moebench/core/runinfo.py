"""What a sweep's results file says about its run beyond the records: the settings and sources it
ran with (before the first case) and what the run driver's Summary reports (after the last). The
CLI hands these to moebench.core.provenance.provenance; it builds none of it by hand."""

from __future__ import annotations

from typing import Sequence


def run_extra(spec, cases: Sequence, *, cross: Sequence[str], timed: bool, shard: tuple[int, int] | None,
              settings: dict, noise_model: dict | None = None) -> dict:
    """The provenance a run adds before it starts: the cross-checks asked for (the Summary later
    says which ran), whether it is timed, its cases and shard, the settings its records are
    resumed under, the noise model of a timed run (moebench.core.noise: the chosen model's
    provenance), and where upstream and plugin kernels came from when the run uses them."""
    extra = {"cross_checks": list(cross), "timed": timed, "n_cases": len(cases),
             "shard": list(shard) if shard else None, "settings": settings}
    if timed and noise_model is not None:
        extra["noise_model"] = noise_model
    if any(spec.family.variants[c.variant].source == "upstream" for c in cases):
        from moebench.sources import upstream

        extra["upstream"] = upstream.provenance()
    from moebench.sources import plugins

    if plugins.loaded():
        extra["plugins"] = plugins.loaded()
    return extra


def summary_fields(summary) -> dict:
    """What the run driver's Summary adds to the provenance once the run ends."""
    return {
        "sweep_wall_s": summary.wall_s,  # cases incl. compile + verify
        "compile_s_total": summary.compile_s,
        "jit_specializations": summary.jit_specializations,
        "wall_phases_s": summary.phases,  # where the cases' time went (scripts/wall_profile.py)
        "complete": summary.complete,
        "cross_checks": summary.passes,  # what ran, and only that
    }
