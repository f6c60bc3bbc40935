"""Hand the heap's free memory back to the operating system after a burst (glibc ``malloc_trim``).

A worker that catches up on a backlog decodes large polls and builds a step's objects for every
replica; once they are freed, glibc keeps most of that memory in its heap for reuse, so the process's
RSS stays at the burst's height (the scale benchmark's worker: hundreds of MiB above what it holds).
``malloc_trim(0)`` returns the free pages of every arena to the kernel; the worker calls it every
``limits.memory_trim_s`` seconds (0: never). Where the C library is not glibc (macOS, musl), there is
nothing to call and :func:`trim_heap` returns False.

>>> isinstance(trim_heap(), bool)
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return free heap memory to the OS; True if some was (False: none, or not glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
