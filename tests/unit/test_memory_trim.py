"""agents/memory.py: freed heap memory goes back to the OS (glibc), so RSS falls after a burst."""

from __future__ import annotations

import os
import platform
import resource

import pytest

from skewwatch.agents.memory import trim_heap


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_trim_returns_a_freed_burst_to_the_os() -> None:
    # small blocks (under the mmap threshold) stay in glibc's heap after free: RSS does not fall alone
    burst = [os.urandom(1) * 3000 + bytes(i % 7) for i in range(60_000)]  # ~180 MB of 3 KB blocks
    keep = burst[::50]  # what is still held pins some pages, as live state does
    grown = rss_bytes()
    del burst
    trim_heap()  # the first call may release little if free() already gave the top back
    after = rss_bytes()
    assert len(keep) == 1200
    assert after < grown - 100 * 2**20, (grown, after)
