"""An `ab` run's page: the PR-ready A/B block (moebench.analysis.ab.ab_markdown) and the family's
own reading of both arms (the layer's conversion table). Records and statistics only."""

from __future__ import annotations

from typing import Sequence

from moebench.analysis.ab import ABPair, Setting, ab_markdown, timer_text
from moebench.core.baseline import launch_layers
from moebench.report.sections import ab_section


def ab_page(spec, device_name: str, off: Sequence[Setting], on: Sequence[Setting], *, arms: int, iters: int,
            pairs: list[ABPair], records: list) -> str:
    md = ab_markdown(spec_name=spec.name, device=device_name, off=off, on=on, arms=arms, iters=iters, pairs=pairs,
                     layers=spec.model.get("moe_layers"), timer_text=timer_text(spec),
                     per_launch=lambda p: launch_layers(spec.family, p.off.params))
    extra = ab_section(spec.family, records)  # the family's own reading of both arms (layer: the conversion)
    if extra:
        md += "\n" + extra.rstrip() + "\n"
    return md
