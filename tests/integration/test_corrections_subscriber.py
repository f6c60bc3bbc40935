"""CorrectionsSubscriber on the real broker: the latest correction per model, seq order, fail-static."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from skewwatch.client import Change, CorrectionsError, CorrectionsSubscriber
from skewwatch.client.corrections import ChangeStream
from skewwatch.config import Settings
from tests.integration.worker_proc import produce

pytestmark = pytest.mark.kafka


def correction(model: str, seq: int, weights: dict[str, float], actions: list[dict[str, Any]] | None = None,
               **extra: Any) -> tuple[bytes, bytes]:
    record = {"model": model, "ts": seq / 1000, "seq": seq, "weights": weights, "actions": actions or [], "v": 1,
              **extra}
    return model.encode(), orjson.dumps(record)


async def next_change(changes: ChangeStream, timeout: float = 20.0) -> Change:
    change: Change = await asyncio.wait_for(changes.__anext__(), timeout)
    return change



async def test_latest_per_model_and_seq_that_goes_backwards_is_ignored(kafka_settings: Settings) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.routing_corrections
    future = time.time() + 3600
    drain = {"replica": "b", "action": "drain", "severity": "CRITICAL", "reason": "xid", "params": {},
             "expires_at": future}
    expired = {**drain, "replica": "a", "expires_at": time.time() - 1}
    await produce(bootstrap, topic, [
        correction("m", 1000, {"a": 0.5, "b": 0.5}),
        correction("m", 3000, {"a": 0.9, "b": 0.1}, [drain, expired]),
        correction("m", 2000, {"a": 0.1, "b": 0.9}),  # older news: dropped
        correction("m", 3000, {"a": 0.2, "b": 0.8}),  # a replayed step re-sends its seq: dropped
        (b"m", b"{not json"),
        correction("n", 5000, {"x": 1.0}, mode="panic"),
    ])
    async with CorrectionsSubscriber(bootstrap, topic) as sub:
        await sub.wait_caught_up(timeout=30)
        assert sub.models() == ["m", "n"]
        assert sub.weights("m") == {"a": 0.9, "b": 0.1}
        assert [(a.replica, a.action) for a in sub.actions("m")] == [("b", "drain")]  # the expired one is gone
        assert sub.mode("m") == "normal" and sub.mode("n") == "panic"
        assert (sub.stats.out_of_order, sub.stats.malformed, sub.stats.kept) == (2, 1, 3)
        assert sub.weights("unknown") == {} and sub.actions("unknown") == []

        changes = sub.changes()
        waiting = asyncio.ensure_future(next_change(changes))
        await asyncio.sleep(0.2)
        await produce(bootstrap, topic, [correction("m", 4000, {"a": 0.0, "b": 0.0})])
        assert await waiting == Change("update", "m", 4000)
        assert sub.weights("m") == {"a": 0.5, "b": 0.5}  # all zero never routes the pool to nowhere

        await produce(bootstrap, topic, [(b"n", None)])  # type: ignore[list-item]  # tombstone
        assert await next_change(changes) == Change("removed", "n", None)
        assert sub.models() == ["m"]


@pytest.mark.parametrize("on_stale", ["keep", "equal"])
async def test_stale_after_missed_heartbeats_then_fresh_again(kafka_settings: Settings, on_stale: str) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.routing_corrections
    drain = {"replica": "b", "action": "drain", "severity": "CRITICAL", "reason": "xid", "params": {},
             "expires_at": time.time() + 3600}
    await produce(bootstrap, topic, [correction("m", 1000, {"a": 0.7, "b": 0.3}, [drain])])
    # heartbeats of 0.5 s, stale after 2 of them: 1 s without a record
    sub = CorrectionsSubscriber(bootstrap, topic, heartbeat_s=0.5, stale_after=2, on_stale=on_stale)  # type: ignore[arg-type]
    changes = sub.changes()  # before start: the initial read's changes too
    await sub.start()
    try:
        await sub.wait_caught_up(timeout=30)
        started = time.monotonic()
        assert await next_change(changes) == Change("update", "m", 1000)
        assert await next_change(changes) == Change("stale", "m", 1000)
        assert time.monotonic() - started < 10
        assert sub.is_stale("m")
        if on_stale == "keep":
            assert sub.weights("m") == {"a": 0.7, "b": 0.3}
            assert [a.action for a in sub.actions("m")] == ["drain"]
        else:
            assert sub.weights("m") == {"a": 0.5, "b": 0.5}
            assert sub.actions("m") == []
        await produce(bootstrap, topic, [correction("m", 2000, {"a": 0.6, "b": 0.4})])
        assert await next_change(changes) == Change("update", "m", 2000)
        assert await next_change(changes) == Change("fresh", "m", 2000)
        assert not sub.is_stale("m") and sub.weights("m") == {"a": 0.6, "b": 0.4}
    finally:
        await sub.stop()


async def test_a_correction_past_its_valid_for_s_routes_equally_by_default(
        kafka_settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A record's own ``valid_for_s`` (contract v1.9) decides when it expires, not the heartbeat rule,
    and the default then routes equally with no actions, logged once."""
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.routing_corrections
    drain = {"replica": "b", "action": "drain", "severity": "CRITICAL", "reason": "xid", "params": {},
             "expires_at": time.time() + 3600}
    await produce(bootstrap, topic, [correction("m", 1000, {"a": 0.7, "b": 0.3}, [drain], valid_for_s=1.0)])
    sub = CorrectionsSubscriber(bootstrap, topic)  # the heartbeat rule alone would wait 90 s
    changes = sub.changes()
    await sub.start()
    try:
        await sub.wait_caught_up(timeout=30)
        assert await next_change(changes) == Change("update", "m", 1000)
        with caplog.at_level("WARNING", logger="skewwatch.client.corrections"):
            assert await next_change(changes) == Change("stale", "m", 1000)
            await asyncio.sleep(1.5)  # more checks: still one line
        assert sub.weights("m") == {"a": 0.5, "b": 0.5} and sub.actions("m") == []
        expired = [r.getMessage() for r in caplog.records if "expired" in r.getMessage()]
        assert len(expired) == 1 and "valid for 1 s" in expired[0] and "routing equally" in expired[0]
    finally:
        await sub.stop()


async def test_missing_topic_is_one_clear_error(kafka_bootstrap: str) -> None:
    sub = CorrectionsSubscriber(kafka_bootstrap, "llm.routing-corrections.does-not-exist")
    with pytest.raises(CorrectionsError, match="does not exist"):
        await sub.start(timeout=3)
