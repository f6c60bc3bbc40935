"""The pure parts of producing: grouping per replica into batch messages, event-time pacing."""

from __future__ import annotations

import pytest

from skewwatch.sim.emit import EventTimePacer, ReplicaBatcher


def ev(replica: str, ts: float) -> dict[str, object]:
    return {"replica": replica, "ts": ts}


def test_batcher_releases_full_groups_per_replica_in_order() -> None:
    b = ReplicaBatcher(batch=3, max_delay_s=100.0)
    out = []
    for i in range(7):
        out += b.add(ev(f"r{i % 2}", float(i)))
    assert out == [("r0", [ev("r0", 0.0), ev("r0", 2.0), ev("r0", 4.0)]),
                   ("r1", [ev("r1", 1.0), ev("r1", 3.0), ev("r1", 5.0)])]
    assert b.flush() == [("r0", [ev("r0", 6.0)])] and b.flush() == []


def test_batcher_releases_a_group_that_waited_too_long_in_event_time() -> None:
    b = ReplicaBatcher(batch=100, max_delay_s=1.0)
    assert b.add(ev("slow", 0.0)) == [] and b.add(ev("busy", 0.5)) == []
    assert b.add(ev("busy", 1.0)) == [("slow", [ev("slow", 0.0)])]


def test_batch_of_one_is_every_event_alone() -> None:
    b = ReplicaBatcher(batch=1)
    assert b.add(ev("r0", 0.0)) == [("r0", [ev("r0", 0.0)])]
    with pytest.raises(ValueError):
        ReplicaBatcher(batch=0)


def test_pacer_maps_event_time_to_wall_time() -> None:
    wall = [100.0]
    p = EventTimePacer(speed=2.0, now=lambda: wall[0])
    assert p.delay(1000.0) == 0.0  # the first event anchors
    assert p.delay(1010.0) == pytest.approx(5.0)  # 10 s of event time at 2x
    wall[0] = 106.0
    assert p.delay(1010.0) == 0.0  # already late: no wait
    assert EventTimePacer(speed=None).delay(1e12) == 0.0
    with pytest.raises(ValueError):
        EventTimePacer(speed=0.0)
