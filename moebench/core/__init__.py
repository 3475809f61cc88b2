"""The floor every family stands on: the family contract and catalogue, specs and cases, the case
pipeline, placements and timer, records, device, stats, the run driver and its passes. Knows no
family, no analysis, no report."""
