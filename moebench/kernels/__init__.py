"""Kernel families: Triton kernels, launchers, torch references, input builders, variants."""
