"""The cyclic garbage collector paused while a batch of short-lived, acyclic objects is made.

A decode, a step's build or a decision makes many objects per event or replica, none in a
reference cycle. With the collector running, every few hundred allocations it scans the growing
young generation again and promotes survivors: work that finds nothing to free and grows with the
batch (bench/README.md, "Costs the code was shaped by"). Paused, reference counting still frees
everything; the collector is back on right after. Nested pauses keep it off
until the outermost one ends.

>>> import gc
>>> with gc_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC for the ``with`` block (re-enabled after only if it was enabled before)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
