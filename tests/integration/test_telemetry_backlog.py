"""A worker that starts on a backlog joins every step with the telemetry of its time.

Ten minutes of requests and telemetry are on the topics before the worker starts (a restart after an
outage). Telemetry is small, so the first fetches bring all of it while the requests take many polls;
the join keeps a bounded history per key (``telemetry_join.history_for``), so without flow control the samples of
the early steps are pushed out before those steps close and they see their telemetry as stale. The
worker holds telemetry that runs more than ``[window] telemetry_ahead_s`` ahead of the requests'
watermark and pauses its partition (``pipeline/telemetry_pacing.py``): every step must carry a fresh
sample from its own time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from skewwatch.kafka_client import run_blocking
from skewwatch.pipeline.replica_step_record import read_step_header, replica_step_dicts
from skewwatch.sim.emit import produce_traffic
from skewwatch.sim.generator import GeneratorConfig, generate_chunks
from skewwatch.topics import delete_topics, ensure_topics
from tests.conftest import topic_names, unique_settings
from tests.integration.worker_proc import WorkerProcess, consume_until

pytestmark = pytest.mark.kafka

START = 1_700_000_000.0
RUN_FOR = 600.0  # well past the join's 160 s of history
STEP = 5.0
REPLICAS = 4


@pytest.fixture(scope="module")
def steps(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    settings = unique_settings(kafka_bootstrap)
    run_blocking(ensure_topics(kafka_bootstrap, settings))
    topics = settings.topics
    config = GeneratorConfig(models=("m",), replicas=REPLICAS, rate=4.0, seed=5)
    try:
        # the whole backlog first, then the worker
        asyncio.run(produce_traffic(kafka_bootstrap, generate_chunks(config, START, RUN_FOR),
                                    requests_topic=topics.requests, telemetry_topic=topics.gpu_telemetry,
                                    batch=50))
        last_end = START + RUN_FOR - 2 * STEP  # the last steps close once the watermark passes them

        def done(records: list[Any]) -> bool:
            return any(h.window_end >= last_end for h in (read_step_header(r.headers) for r in records) if h)

        with WorkerProcess(settings, tmp_path_factory.mktemp("backlog") / "worker.log") as worker:
            records = asyncio.run(consume_until(kafka_bootstrap, [topics.replica_steps], done, 180))
            log = worker.log_tail()
        # one record per input partition, model and step (progress markers carry no step header)
        bodies = [b for r in records if read_step_header(r.headers) for b in replica_step_dicts(r.value)]
        assert bodies, log
        yield bodies
    finally:
        try:
            run_blocking(delete_topics(kafka_bootstrap, topic_names(settings)))
        except Exception as exc:  # best effort, as in conftest
            print(f"could not delete test topics: {exc}")


def test_every_step_of_a_backlog_has_fresh_telemetry_of_its_time(steps: list[dict[str, Any]]) -> None:
    ends = {b["features"]["window_end"] for b in steps}
    assert len(ends) >= (RUN_FOR - 60.0) / STEP, sorted(ends)  # the whole backlog was stepped through
    stale = [(b["features"]["replica"], b["features"]["window_end"] - START, b["telemetry_stale"])
             for b in steps if b["telemetry"] is None or b["telemetry_stale"]]
    assert not stale, f"{len(stale)} of {len(steps)} steps without fresh telemetry, first: {stale[:5]}"
    for body in steps:
        age = body["features"]["window_end"] - body["telemetry"]["ts"]
        assert 0.0 <= age <= STEP, body  # as of the step's end: never a sample from its future
