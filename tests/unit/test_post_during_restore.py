"""The POST and /readyz while stage 2 restores partitions after a rebalance.

aiokafka reports a new assignment before its callback has restored it, and the restore (checkpoints,
then the decisions already on the topics) holds the stage's lock. So /readyz says "restoring" until
it is done, and a POST waits for it, bounded, then answers 503 saying the stage is restoring rather
than blaming Kafka's acknowledgement.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from aiokafka import TopicPartition

from skewwatch.agents.checkpoint import Checkpoint
from skewwatch.agents.http_api import WorkerApi
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.model_stage import ModelStage
from skewwatch.config import Settings
from skewwatch.kafka_security import Secret
from skewwatch.web_auth import AccessPolicy

TOKEN = "t0ken-for-the-post"


class FakeConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass


class SlowCheckpoints:
    """Checkpoint reads that finish when the test says so (a restore on a slow host)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def read(self, topic: str, partitions: list[int]) -> dict[int, Checkpoint]:
        await self.release.wait()
        return {}


class State:
    """What the API reads from the worker: stage 2, and a broker that answers."""

    def __init__(self, stage2: ModelStage) -> None:
        self.stage2 = stage2
        self.metrics = WorkerMetrics()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return not self.stage2.restoring, {}

    def broker_problem(self) -> str | None:
        return None


def new_stage() -> tuple[ModelStage, SlowCheckpoints, TopicPartition]:
    settings = Settings()
    stage = ModelStage(settings, "127.0.0.1:9", None, WorkerMetrics())  # type: ignore[arg-type]
    tp = TopicPartition(settings.topics.replica_steps, 0)
    stage.consumer = FakeConsumer({tp})  # type: ignore[assignment]
    stage.checkpoints = checkpoints = SlowCheckpoints()  # type: ignore[assignment]

    async def nothing_published(starts: dict[int, int | None]) -> None:
        pass

    stage.restored = nothing_published  # type: ignore[method-assign]  # no broker to read the topics from
    return stage, checkpoints, tp


async def post(client: TestClient) -> tuple[int, dict[str, Any], str | None]:
    answer = await client.post("/api/v1/update_weights", headers={"Authorization": f"Bearer {TOKEN}"})
    return answer.status, await answer.json(), answer.headers.get("Retry-After")


def test_an_assigned_partition_is_restoring_until_its_callback_has_run() -> None:
    async def scenario() -> list[bool]:
        stage, checkpoints, tp = new_stage()
        seen = [stage.restoring]  # assigned, the callback not started: no state yet
        restore = asyncio.create_task(stage.on_assigned({tp}))
        await asyncio.sleep(0.01)
        seen += [stage.restoring, await stage.acquire(0.05)]  # the callback holds the lock
        checkpoints.release.set()
        await restore
        seen += [stage.restoring, await stage.acquire(0.05)]
        stage.release()
        return seen

    assert asyncio.run(scenario()) == [True, True, False, False, True]


def test_a_post_waits_for_a_short_restore_and_answers_503_saying_so_for_a_long_one() -> None:
    async def scenario() -> list[Any]:
        stage, checkpoints, tp = new_stage()
        policy = AccessPolicy(token=Secret(TOKEN), beyond_loopback=False)
        api = WorkerApi(State(stage), policy, busy_wait_s=0.3, ack_timeout_s=0.1)
        async with TestClient(TestServer(api.app)) as client:
            restore = asyncio.create_task(stage.on_assigned({tp}))
            await asyncio.sleep(0.01)
            long_one = await post(client)  # the restore outlasts the wait
            ready = (await client.get("/readyz")).status
            waiting = asyncio.create_task(post(client))
            await asyncio.sleep(0.1)
            checkpoints.release.set()  # the restore ends within the wait: the POST goes through
            await restore
            short_one = await waiting
            return [long_one, ready, short_one, (await client.get("/readyz")).status]

    long_one, ready, short_one, ready_after = asyncio.run(scenario())
    status, body, retry_after = long_one
    assert status == 503 and retry_after == "2"
    assert "restoring" in body["error"] and "Kafka" not in body["error"]
    assert ready == 503 and ready_after == 200
    assert short_one[:2] == (200, {"published": {}, "throttled": [], "unknown": []})
