"""OrderedAcks and CommitPipeline: a checkpoint never covers an output the broker did not store.

The broker side is the producer's futures: these tests resolve or fail them by hand, which is what
aiokafka does when the broker acknowledges or refuses a batch. The checkpoint store records what it
was asked to write (its own behaviour on a real broker is tested in tests/integration).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from skewwatch.agents.acks import OrderedAcks
from skewwatch.agents.commit import CommitPipeline
from skewwatch.config import ConfigError, LimitSettings, load_settings


class RecordingStore:
    def __init__(self) -> None:
        self.writes: list[tuple[str, int, int, bytes]] = []

    async def write(self, input_topic: str, partition: int, offset: int, state: bytes) -> None:
        self.writes.append((input_topic, partition, offset, state))


def pipeline(interval_s: float = 0.0, max_pending: int = 4) -> tuple[CommitPipeline, RecordingStore]:
    store = RecordingStore()
    limits = LimitSettings(checkpoint_interval_s=interval_s, max_unacked_closes=max_pending)
    return CommitPipeline(store, "in", limits), store  # type: ignore[arg-type]


def test_jobs_of_a_key_run_in_order_and_other_keys_do_not_wait() -> None:
    async def scenario() -> list[str]:
        done: list[str] = []
        acks = OrderedAcks[int](max_pending=8)
        gate = asyncio.get_running_loop().create_future()

        async def job(name: str, wait: asyncio.Future[None] | None = None) -> None:
            if wait is not None:
                await wait
            done.append(name)

        await acks.submit(0, lambda: job("0a", gate))
        await acks.submit(0, lambda: job("0b"))
        await acks.submit(1, lambda: job("1a"))
        await asyncio.sleep(0.01)
        assert done == ["1a"]  # key 1 is not held up by key 0's slow job
        gate.set_result(None)
        await acks.drain()
        assert len(acks) == 0
        return done

    assert asyncio.run(scenario()) == ["1a", "0a", "0b"]


def test_submit_waits_when_a_key_has_max_pending_jobs() -> None:
    async def scenario() -> None:
        acks = OrderedAcks[int](max_pending=2)
        gate = asyncio.get_running_loop().create_future()
        await acks.submit(0, lambda: gate)
        await acks.submit(0, lambda: asyncio.sleep(0))
        third = asyncio.ensure_future(acks.submit(0, lambda: asyncio.sleep(0)))
        await asyncio.sleep(0.01)
        assert not third.done()  # back-pressure: two in flight
        gate.set_result(None)
        await asyncio.wait_for(third, 1)
        await acks.drain()

    asyncio.run(scenario())


def test_a_failure_skips_the_later_jobs_of_its_key_and_is_raised_once() -> None:
    async def scenario() -> None:
        ran: list[str] = []
        acks = OrderedAcks[int]()

        async def fail() -> None:
            raise OSError("broker refused the batch")

        async def later() -> None:
            ran.append("later")

        await acks.submit(0, fail)
        await acks.submit(0, later)
        with pytest.raises(OSError, match="refused"):
            await acks.drain()
        assert ran == []
        acks.raise_failure()  # raised once

    asyncio.run(scenario())


def test_max_pending_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        OrderedAcks[int](max_pending=0)


def test_checkpoint_is_written_only_after_every_output_it_covers_is_acknowledged() -> None:
    async def scenario() -> None:
        commits, store = pipeline()
        loop = asyncio.get_running_loop()
        output, dead_letter = loop.create_future(), loop.create_future()
        commits.hold(3, dead_letter)
        await commits.sent(3, [output])
        assert commits.due(3)
        assert await commits.save(3, 120, lambda: b"state")
        await asyncio.sleep(0.01)
        assert store.writes == [] and commits.take_commits() == {}
        output.set_result(None)
        await asyncio.sleep(0.01)
        assert store.writes == []  # the dead letter is not stored yet
        dead_letter.set_result(None)
        await commits.drain()
        assert store.writes == [("in", 3, 120, b"state")]
        assert commits.take_commits() == {TopicPartition("in", 3): 120}
        assert not commits.due(3) and commits.unsaved() == set()

    asyncio.run(scenario())


def test_a_refused_output_means_no_checkpoint_and_the_stage_sees_the_error() -> None:
    async def scenario() -> None:
        commits, store = pipeline()
        output = asyncio.get_running_loop().create_future()
        await commits.sent(0, [output])
        await commits.save(0, 10, lambda: b"s")
        output.set_exception(OSError("NotLeaderForPartition"))
        with pytest.raises(OSError, match="NotLeader"):
            await commits.drain()
        assert store.writes == [] and commits.take_commits() == {}

    asyncio.run(scenario())


def test_checkpoints_follow_the_interval_and_a_save_needs_an_offset() -> None:
    async def scenario() -> None:
        commits, store = pipeline(interval_s=3600.0)
        await commits.sent(0, [])
        assert commits.due(0)  # never saved: due at once
        assert not await commits.save(0, None, lambda: b"x")  # no offset yet: nothing to save
        await commits.save(0, 5, lambda: b"a")
        await commits.sent(0, [])
        assert not commits.due(0) and commits.unsaved() == {0}  # within the interval
        await commits.sent(1, [], changed=False)
        assert not commits.due(1) and commits.unsaved() == {0}
        await commits.drain()
        assert [w[2] for w in store.writes] == [5]
        commits.forget([0])
        assert commits.unsaved() == set()

    asyncio.run(scenario())


def test_the_snapshot_is_taken_when_saved_not_when_written() -> None:
    async def scenario() -> list[bytes]:
        commits, store = pipeline()
        state: dict[str, Any] = {"n": 1}
        output = asyncio.get_running_loop().create_future()
        await commits.sent(0, [output])
        await commits.save(0, 1, lambda: str(state["n"]).encode())
        state["n"] = 2  # the stage goes on while the broker acknowledges
        output.set_result(None)
        await commits.drain()
        return [w[3] for w in store.writes]

    assert asyncio.run(scenario()) == [b"1"]


def test_one_checkpoint_in_flight_per_partition() -> None:
    async def scenario() -> None:
        commits, store = pipeline()
        output = asyncio.get_running_loop().create_future()
        await commits.sent(0, [output])
        await commits.save(0, 1, lambda: b"first")
        await commits.sent(0, [])
        assert commits.unsaved() == {0} and not commits.due(0)  # the first is not written yet
        second = asyncio.ensure_future(commits.save(0, 2, lambda: b"second"))  # a forced save waits
        await asyncio.sleep(0.01)
        assert not second.done() and store.writes == []
        output.set_result(None)
        assert await asyncio.wait_for(second, 1)
        await commits.drain()
        assert [w[3] for w in store.writes] == [b"first", b"second"]
        assert commits.take_commits() == {TopicPartition("in", 0): 2}

    asyncio.run(scenario())


@pytest.mark.parametrize(("env", "match"), [
    ({"SKEWWATCH_LIMITS__MAX_UNACKED_CLOSES": "0"},
     r"limits.max_unacked_closes = 0 \(from SKEWWATCH_LIMITS__MAX_UNACKED_CLOSES\): expected an integer >= 1"),
    ({"SKEWWATCH_LIMITS__CHECKPOINT_INTERVAL_S": "-1"},
     r"limits.checkpoint_interval_s = -1.0 \(from SKEWWATCH_LIMITS__CHECKPOINT_INTERVAL_S\): expected a number >= 0"),
])
def test_bad_limits_are_refused_with_the_setting_named(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(env=env)


def test_limits_from_the_environment() -> None:
    limits = load_settings(env={"SKEWWATCH_LIMITS__CHECKPOINT_INTERVAL_S": "0",
                                "SKEWWATCH_LIMITS__MAX_UNACKED_CLOSES": "2"}).limits
    assert (limits.checkpoint_interval_s, limits.max_unacked_closes) == (0.0, 2)


def test_save_due_saves_what_is_due_or_everything_unsaved_when_forced() -> None:
    async def scenario() -> None:
        commits, store = pipeline(interval_s=3600.0)
        owned = {0: (10, lambda: b"p0"), 1: (20, lambda: b"p1")}  # partition 2 is not owned (revoked)
        for partition in (0, 1, 2):
            await commits.sent(partition, [])
        await commits.save_due(owned.get)  # never saved: all due; 2 has nothing to save
        await commits.drain()
        assert sorted(w[2] for w in store.writes) == [10, 20]
        await commits.sent(0, [])
        await commits.sent(1, [])
        await commits.save_due(owned.get)  # within the interval: nothing
        await commits.save_due(owned.get, force=True, partitions=[1])  # a revoke of 1: forced
        await commits.drain()
        assert [w[2] for w in store.writes][2:] == [20] and commits.unsaved() == {0, 2}

    asyncio.run(scenario())
