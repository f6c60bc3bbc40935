"""gc_paused: the collector is off inside, back on after (also on error), and nesting keeps it off."""

from __future__ import annotations

import gc

import pytest

from skewwatch.gc_pause import gc_paused


def test_paused_inside_and_restored_after_an_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_nested_pauses_keep_it_off_until_the_outermost_ends() -> None:
    with gc_paused():
        with gc_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
