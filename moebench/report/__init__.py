"""Pages and tables above the families: the sweep page, the families' own sections, A/B and
conformance pages. Reads records only: never imports torch or a kernel module."""
