"""The built-in passes (the contract and the registry: moebench.core.passes): the cross-check
timers (`dobench`, `nvbench`, `profiler`) and the hardware counters (`counters`). Importing this
package registers them, in the order their after_all hooks run: nvbench before the profiler
(CUPTI disturbs later replays), the counters last (a child process, after every timing)."""

from moebench.passes import crosscheck  # noqa: I001 - registration, in this order
from moebench.passes import counters

__all__ = ["counters", "crosscheck"]
