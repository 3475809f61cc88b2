"""The ceilings a number is read against (moebench.core.device.measure_ceilings): the DRAM copy
lands within 70-100% of the datasheet, the L2 copy above it, the empty-kernel floor in a band."""

import pytest

pytestmark = pytest.mark.gpu

DATASHEET_FRACTION = (0.70, 1.00)  # the band for the measured DRAM copy ceiling
# An empty Triton kernel replayed in a graph costs a launch and a CTA: 0.67 µs (grid 1) and 0.74 µs
# (grid = 132 SMs) on an H200 (results/h200/device.json). Below 0.3 µs the timer would be reading
# less than a launch; above 2 µs something (clock, contention) is off.
EMPTY_BAND_US = (0.3, 2.0)
# Vendor datasheet DRAM bandwidth (bytes read + written per second) by device name, to read the
# measured copy ceiling against: a lead, not a measurement.
DATASHEET_DRAM_GBPS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 80GB HBM3": 3350.0,
    "H100 PCIe": 2000.0,
    "H100 NVL": 3900.0,
    "GH200": 4000.0,
    "B200": 8000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100-SXM4-40GB": 1555.0,
}


def datasheet_dram_gbps(name: str) -> float | None:
    """The datasheet bandwidth of a device by its name (longest matching key), or None."""
    hits = [k for k in DATASHEET_DRAM_GBPS if k.lower() in name.lower()]
    return DATASHEET_DRAM_GBPS[max(hits, key=len)] if hits else None


def test_copy_ceiling_and_empty_kernel_floor(gpu_log):
    from moebench.core.device import detect, measure_ceilings

    d = detect(False)
    c = measure_ceilings(d)
    sheet = datasheet_dram_gbps(d.name)
    gpu_log(f"DRAM copy {c['copy_dram_gbps']:.0f} GB/s (read + write)"
            + (f" = {100 * c['copy_dram_gbps'] / sheet:.1f}% of the datasheet's {sheet:.0f}" if sheet else
               " (no datasheet figure for this device)"))
    gpu_log(f"L2 copy {c['copy_l2_gbps']:.0f} GB/s; empty kernel {c['empty_us']:.4f} µs (grid 1), "
            f"{c['empty_sms_us']:.4f} µs (grid = {d.sm_count} SMs)")
    assert c["copy_l2_gbps"] > c["copy_dram_gbps"]
    for key in ("empty_us", "empty_sms_us"):
        assert EMPTY_BAND_US[0] <= c[key] <= EMPTY_BAND_US[1], f"{key} = {c[key]:.4f} µs"
    if sheet is None:
        pytest.skip(f"no datasheet bandwidth for {d.name!r} in DATASHEET_DRAM_GBPS")
    lo, hi = DATASHEET_FRACTION
    assert lo * sheet <= c["copy_dram_gbps"] <= hi * sheet


def test_a_timed_run_measures_missing_ceilings_in_a_child(gpu_log, tmp_path):
    """Issue 23: a sweep that measured the ceilings in its own process (two 2 GiB copy buffers) put
    count cases in another level. With child=True this process must not allocate them: its
    allocator holds (almost) nothing more afterwards, and the file the child wrote is read."""
    import torch

    from moebench.core.device import ceilings_path, detect, load_or_measure_ceilings

    d = detect(False)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    notes = []
    c = load_or_measure_ceilings(d, tmp_path, child=True, note=notes.append)
    after = torch.cuda.memory_reserved()
    gpu_log(f"ceilings from a child: DRAM copy {c['copy_dram_gbps']:.0f} GB/s; this process reserved "
            f"{(after - before) / 2**20:.1f} MiB more")
    assert not notes, notes
    assert ceilings_path(tmp_path, d).exists() and c["copy_dram_gbps"] > 0
    assert c["measured_in"] == "a child of the timed run"
    assert after - before < 64 * 2**20  # the 2 x 2 GiB buffers were the child's
