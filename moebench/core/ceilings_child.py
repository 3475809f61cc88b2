"""The device ceilings, measured in a process of their own: `python -m moebench.core.ceilings_child
PATH` detects this process's CUDA device, measures (moebench.core.device.measure_ceilings) and writes
PATH as `moebench device` does ({"device": ..., "ceilings": ...}), for
device.load_or_measure_ceilings(child=True).
"""

from __future__ import annotations

import sys
from pathlib import Path

from moebench.core import device
from moebench.errors import BackendError


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m moebench.core.ceilings_child PATH", file=sys.stderr)
        return 2
    try:
        info = device.detect(False)
    except BackendError as e:
        print(str(e), file=sys.stderr)
        return 2
    c = device.measure_ceilings(info)
    c["measured_in"] = "a child of the timed run"
    device.write_ceilings(Path(argv[0]), info, c)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
