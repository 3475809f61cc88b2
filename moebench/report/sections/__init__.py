"""The families' own parts of the pages, above the families: a built-in family's section of a
sweep page (and of an `ab` page, where it has one) lives here, one module per family, and reads
records only. A plugin family's pages have none: readers never import plugins, so a page re-rendered
from its JSON would lose one a plugin brought."""

from __future__ import annotations

from functools import partial
from typing import Callable

from moebench.errors import UsageError
from moebench.report.sections import act, combine, count, layer

# family name -> its section of a sweep's results page, and of an `ab` run's page
SWEEP: dict[str, Callable[[list], str]] = {"count": count.markdown_sections, "act": act.markdown_sections,
                                           "combine": combine.markdown_sections, "layer": layer.markdown_sections}
AB: dict[str, Callable[[list], str]] = {"layer": layer.conversion_section}


def family_section(pages: dict[str, Callable[[list], str]], fam, records: list) -> str | None:
    """The family's own part of a page (`pages`: SWEEP or AB), or None where it has none."""
    fn = pages.get(fam.name) if fam.origin == "builtin" else None
    if fn is None:
        return None
    try:
        return fn(records)
    except KeyError as e:  # a hand-edited record that lacks a parameter the section reads
        raise UsageError(f"a record of family {fam.name!r} has no {e.args[0]!r}, which the family's part of the "
                         "page reads (every record moebench writes carries all of its family's parameters)") from None


ab_section = partial(family_section, AB)  # the reading of both arms of an `ab` run (layer: the conversion)
