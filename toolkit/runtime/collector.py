"""The worker process's garbage collector: what it scans, and how often.

CPython's cyclic collector runs a young-generation pass every 700 net allocations of
container objects, and from time to time a full pass over every object the process holds.
A worker allocates a few hundred short-lived containers per workflow cycle (rows, frames,
contexts), so with the defaults it ran a young pass every two or three cycles, and each full
pass walked the 60,000 objects left by the imports and the loaded definitions, none of which
ever become garbage. Measured on the one-step drain (docs/decisions.md, "The worker's garbage
collector"): 15 % of the worker's CPU was the collector's.

:func:`worker_collector` moves what exists once the worker is ready out of the collector's
reach (``gc.freeze``) and raises the young generation's threshold, so the cycles' objects
are mostly freed by their reference counts before a pass sees them. The older generations'
thresholds stay as they are: a cyclic garbage still gets collected, later.

The same block also spares the process's exit a last full pass: the interpreter's
finalisation collects over every object, about 0.15 s for a worker's heap (measured from the
supervisor's return to the process's end, 0.14-0.23 s before and 0.03-0.04 s after), while
what a process leaves behind is freed by the operating system anyway.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator

#: Net allocations of container objects between two young-generation passes (CPython's
#: default is 700). Chosen by measurement: 5,000 and 50,000 drained slower (same rounds).
YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def worker_collector() -> Iterator[None]:
    """Within the block, the collector set for a worker process (see the module's text).

    On entry: one full collection, then every surviving object frozen (never scanned again;
    reference counting still frees it) and the young generation's threshold raised to
    :data:`YOUNG_THRESHOLD`. On exit, the threshold and the frozen objects are given back,
    so a caller that goes on (a test running the command in its own process) keeps the
    collector it had. Once the process exits, everything left is frozen first
    (``atexit``), so the interpreter's finalisation does not walk it again; exit handlers
    registered before this block (logging's flush, a tracer's export) still run after.
    """
    atexit.unregister(gc.freeze)  # registered once, however many blocks the process runs
    atexit.register(gc.freeze)
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
