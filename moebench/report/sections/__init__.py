"""The families' own parts of the pages, above the families: a built-in family's section of a
sweep page (and of an `ab` page, where it has one) lives here, one module per family, and reads
records only. A plugin family's pages have none: readers never import plugins, so a page re-rendered
from its JSON would lose one a plugin brought."""

from __future__ import annotations

from functools import partial
from typing import Callable

from moebench.report.sections import act, combine, count, layer

# family name -> its section of a sweep's results page, and of an `ab` run's page
SWEEP: dict[str, Callable[[list], str]] = {"count": count.markdown_sections, "act": act.markdown_sections,
                                           "combine": combine.markdown_sections, "layer": layer.markdown_sections}
AB: dict[str, Callable[[list], str]] = {"layer": layer.conversion_section}


def family_section(pages: dict[str, Callable[[list], str]], fam, records: list) -> str | None:
    """The family's own part of a page (`pages`: SWEEP or AB), or None where it has none."""
    fn = pages.get(fam.name) if fam.origin == "builtin" else None
    return fn(records) if fn is not None else None


ab_section = partial(family_section, AB)  # the reading of both arms of an `ab` run (layer: the conversion)
