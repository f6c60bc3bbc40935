"""Bridges: recorded expositions of each engine, served over real HTTP, map to the expected samples.

Each engine's fixture maps to the expected sample; counters become rates correctly across two
scrapes and across a counter reset. The fixtures under tests/fixtures/ are written the way the
exporters format them (prometheus_client for vLLM and SGLang, metrics-exporter-prometheus for TGI,
dcgm-exporter for DCGM); llamacpp_b11312.txt is what the real llama-server (scripts/engines.sh) answered
with two slots busy and a third request deferred. A local http.server serves them, so the real aiohttp +
parser path runs.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from skewwatch.collect.engine_maps import (
    ENGINE_MAPS,
    MIB,
    CounterTracker,
    map_exposition,
    normalize_name,
)
from skewwatch.collect.publish import encode_sample
from skewwatch.collect.scrape_command import ScrapeError, Scraper, run_bridge, scrape_command
from skewwatch.schemas.telemetry import decode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def set_value(text: str, series_prefix: str, value: float) -> str:
    """Replace the value of every sample line starting with ``series_prefix`` (name + label prefix)."""
    pattern = re.compile(r"^(" + re.escape(series_prefix) + r".*) \S+$", re.MULTILINE)
    new, count = pattern.subn(lambda m: f"{m.group(1)} {value}", text)
    assert count, f"no series {series_prefix!r} in the exposition"
    return new


class ExpositionServer:
    """A real HTTP server on 127.0.0.1 serving mutable texts by path (status per path too)."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, str]] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                status, body = pages.get(self.path, (404, "not found"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def serve(self, path: str, text: str, status: int = 200) -> str:
        self.pages[path] = (status, text)
        return self.url(path)


@pytest.fixture
def server() -> Iterator[ExpositionServer]:
    srv = ExpositionServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


async def scrape(scraper: Scraper, now: float = 1000.0) -> list[TelemetrySample]:
    async with aiohttp.ClientSession() as session:
        return await scraper.scrape(session, now=now)


# --------------------------------------------------------------------------- one fixture per engine family
ENGINE_CASES = [
    ("vllm_v0.6.txt", "vllm",
     {"queue_length": 5, "running_requests": 14, "kv_cache_usage": 0.6843, "kv_cache_hit_rate": 0.4213,
      "preemptions_total": 3}),
    # v1 engine, legacy gpu_* names; the hit rate needs a second scrape (counters)
    ("vllm_v0.8.txt", "vllm",
     {"queue_length": 9, "running_requests": 22, "kv_cache_usage": 0.8125, "preemptions_total": 12}),
    # data parallel, two engines: counts add up, usage is the mean
    ("vllm_v0.10.txt", "vllm",
     {"queue_length": 6, "running_requests": 60, "kv_cache_usage": 0.89, "preemptions_total": 75}),
    ("sglang_v0.4.txt", "sglang",
     {"queue_length": 6, "running_requests": 17, "kv_cache_usage": 0.63, "kv_cache_hit_rate": 0.71}),
    # SGLang's first exporter (label `name`): exposes its --max-running-requests; its cache_hit_rate is a
    # percentage (37.5), so the hit rate stays unknown rather than guessed
    ("sglang_v0.3.txt", "sglang",
     {"queue_length": 4, "running_requests": 31, "kv_cache_usage": 0.42, "batch_capacity": 256}),
    ("tgi_v2.txt", "tgi", {"queue_length": 11, "running_requests": 28}),
    # both slots busy (requests_processing 2), one request waiting for a slot (requests_deferred 1); the
    # hit rate and the per-token time are counter deltas, so they need a second scrape
    ("llamacpp_b11312.txt", "llamacpp", {"queue_length": 1, "running_requests": 2}),
]


@pytest.mark.parametrize(("fixture", "kind", "expected"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
async def test_engine_fixture_maps_to_expected_sample(server: ExpositionServer, fixture: str, kind: str,
                                                      expected: dict[str, float]) -> None:
    url = server.serve("/metrics", fixture_text(fixture))
    [sample] = await scrape(Scraper(url, kind, replica="replica-a"), now=1234.5)
    wire = sample.to_dict()
    measured = {k: v for k, v in wire.items() if k not in ("ts", "replica", "source", "v")}
    assert measured.keys() == expected.keys()  # nothing invented: unknown fields stay absent
    for name, value in expected.items():
        assert measured[name] == pytest.approx(value), name
    assert (sample.ts, sample.replica, sample.source) == (1234.5, "replica-a", kind)
    assert decode_telemetry(encode_sample(sample)) == sample  # the wire form passes the worker's contract
    for name in ("queue_length", "running_requests", "preemptions_total", "batch_capacity"):
        if name in wire:
            assert isinstance(wire[name], int)


# batch_capacity per fixture: only SGLang's first exporter exposes it (vLLM's cache_config_info labels
# hold no --max-num-seqs, TGI exports no --max-batch-size, llama.cpp no -np, DCGM is not an engine); the others need
# `skewwatch scrape --batch-capacity N`, which fills it in and never overrides an exposed value.
CAPACITY_CASES = [
    ("vllm_v0.6.txt", "vllm", None, None), ("vllm_v0.8.txt", "vllm", None, None),
    ("vllm_v0.10.txt", "vllm", None, None), ("sglang_v0.4.txt", "sglang", None, None),
    ("sglang_v0.3.txt", "sglang", None, 256), ("tgi_v2.txt", "tgi", None, None),
    ("llamacpp_b11312.txt", "llamacpp", None, None), ("llamacpp_b11312.txt", "llamacpp", 2, 2),
    ("vllm_v0.10.txt", "vllm", 512, 512), ("sglang_v0.4.txt", "sglang", 48, 48), ("tgi_v2.txt", "tgi", 64, 64),
    ("sglang_v0.3.txt", "sglang", 128, 256),  # the engine's own figure wins over the flag
]


@pytest.mark.parametrize(("fixture", "kind", "flag", "expected"), CAPACITY_CASES,
                         ids=[f"{c[0]}-flag{c[2]}" for c in CAPACITY_CASES])
def test_each_fixture_maps_to_its_batch_capacity(fixture: str, kind: str, flag: int | None,
                                                 expected: int | None) -> None:
    scraper = Scraper("http://unused", kind, replica="r", batch_capacity=flag)
    [sample] = scraper.map(fixture_text(fixture), now=1.0)
    assert sample.batch_capacity == expected
    if expected is not None:
        assert decode_telemetry(encode_sample(sample)) == sample


def test_dcgm_has_no_batch_capacity_and_refuses_the_flag() -> None:
    samples = Scraper("http://unused", "dcgm").map(fixture_text("dcgm_3.3.txt"), now=1.0)
    assert samples and all(s.batch_capacity is None for s in samples)
    with pytest.raises(ValueError, match="batch_capacity"):
        Scraper("http://unused", "dcgm", batch_capacity=8)
    result = CliRunner().invoke(scrape_command, ["--target", "http://127.0.0.1:1", "--kind", "dcgm",
                                                 "--batch-capacity", "8", "--once"])
    assert result.exit_code == 2 and "--batch-capacity is an engine setting" in result.output


def test_an_exposed_capacity_of_zero_is_unknown_not_a_contract_violation() -> None:
    text = set_value(fixture_text("sglang_v0.3.txt"), "sglang:max_running_requests{", 0)
    [sample] = map_exposition(text, ENGINE_MAPS["sglang"], CounterTracker(), ts=1.0, replica="r")
    assert sample.batch_capacity is None and sample.running_requests == 31


def test_a_first_exporter_hit_rate_below_one_percent_is_not_read_as_a_ratio() -> None:
    text = set_value(fixture_text("sglang_v0.3.txt"), "sglang:cache_hit_rate{", 0.8)  # 0.8 %, not 80 %
    [sample] = map_exposition(text, ENGINE_MAPS["sglang"], CounterTracker(), ts=1.0, replica="r")
    assert sample.kv_cache_hit_rate is None


async def test_dcgm_fixture_gives_one_sample_per_gpu_with_units_and_join_labels(server: ExpositionServer) -> None:
    url = server.serve("/metrics", fixture_text("dcgm_3.3.txt"))
    gpu0, gpu1 = await scrape(Scraper(url, "dcgm"))
    assert (gpu0.replica, gpu1.replica) == ("llama-70b-0", "llama-70b-1")  # from the pod label
    assert (gpu0.gpu_index, gpu0.node, gpu0.gpu_uuid) == (0, "gpu-node-7", "GPU-5f0e2a71-3c1b-8a4e-92d0-7a1c4b6e9f21")
    assert gpu0.source == "dcgm"
    assert gpu0.memory_used_bytes == 73282 * MIB
    assert gpu0.memory_total_bytes == (73282 + 7830 + 447) * MIB  # used + free + reserved = 81559 MiB (H100)
    assert gpu0.utilization_gpu == pytest.approx(0.87)
    assert (gpu0.power_w, gpu0.temperature_c, gpu0.throttle_reasons) == (pytest.approx(512.347), 41.0, 0)
    assert (gpu0.ecc_uncorrected_total, gpu0.xid_count_5m, gpu0.xid_last) == (0, 0, None)
    # GPU 1: XID 79 (fallen off the bus) within the exporter's window, 2 uncorrectable ECC errors, thermal cap
    assert (gpu1.xid_last, gpu1.xid_count_5m, gpu1.ecc_uncorrected_total) == (79, 1, 2)
    assert gpu1.throttle_reasons == 32 and gpu1.memory_ratio == pytest.approx(78770 / 81559)
    assert gpu1.kv_cache_usage is None and gpu1.queue_length is None
    assert [decode_telemetry(encode_sample(s)) for s in (gpu0, gpu1)] == [gpu0, gpu1]


async def test_dcgm_replica_from_flag_or_host_and_index(server: ExpositionServer) -> None:
    text = fixture_text("dcgm_3.3.txt")
    url = server.serve("/metrics", text)
    assert {s.replica for s in await scrape(Scraper(url, "dcgm", replica="pinned"))} == {"pinned"}
    without_pods = re.sub(r',container="vllm",namespace="inference",pod="[^"]+"', "", text)
    url = server.serve("/nopods", without_pods)
    assert [s.replica for s in await scrape(Scraper(url, "dcgm"))] == ["gpu-node-7-gpu0", "gpu-node-7-gpu1"]


def test_dcgm_latched_xid_outside_the_window_is_not_reported() -> None:
    # DCGM_FI_DEV_XID_ERRORS keeps the last XID forever; with a zero windowed count it is old news
    text = set_value(fixture_text("dcgm_3.3.txt"), 'DCGM_EXP_XID_ERRORS_COUNT{gpu="1"', 0)
    samples = map_exposition(text, ENGINE_MAPS["dcgm"], CounterTracker(), ts=1.0, replica=None)
    assert (samples[1].xid_last, samples[1].xid_count_5m) == (None, 0)
    # without the windowed count (default exporter config), the latched code is all there is
    no_count = "\n".join(line for line in text.splitlines() if "DCGM_EXP_XID_ERRORS_COUNT" not in line) + "\n"
    samples = map_exposition(no_count, ENGINE_MAPS["dcgm"], CounterTracker(), ts=1.0, replica=None)
    assert (samples[0].xid_last, samples[1].xid_last, samples[1].xid_count_5m) == (None, 79, None)


# --------------------------------------------------------------------------- counters across scrapes
async def test_vllm_hit_rate_from_counter_deltas_and_across_a_reset(server: ExpositionServer) -> None:
    first = fixture_text("vllm_v0.10.txt")
    scraper = Scraper(server.serve("/metrics", first), "vllm", replica="r")
    [s1] = await scrape(scraper, now=0.0)
    assert s1.kv_cache_hit_rate is None  # one scrape gives totals, not a rate
    assert s1.preemptions_total == 75

    q0, q1 = 'vllm:prefix_cache_queries_total{engine="0"', 'vllm:prefix_cache_queries_total{engine="1"'
    h0, h1 = 'vllm:prefix_cache_hits_total{engine="0"', 'vllm:prefix_cache_hits_total{engine="1"'
    second = set_value(set_value(first, q0, 5_001_000), q1, 4_801_000)
    second = set_value(set_value(second, h0, 3_100_600), h1, 2_950_200)
    second = set_value(second, 'vllm:num_preemptions_total{engine="0"', 43)
    server.serve("/metrics", second)
    [s2] = await scrape(scraper, now=5.0)
    assert s2.kv_cache_hit_rate == pytest.approx((600 + 200) / (1000 + 1000))
    assert s2.preemptions_total == 78

    # engine 0 restarts: its counters start again from zero; engine 1 carries on
    third = set_value(set_value(second, q0, 400), h0, 100)
    third = set_value(set_value(third, q1, 4_801_600), h1, 2_950_500)
    third = set_value(third, 'vllm:num_preemptions_total{engine="0"', 2)
    server.serve("/metrics", third)
    [s3] = await scrape(scraper, now=10.0)
    assert s3.kv_cache_hit_rate == pytest.approx((100 + 300) / (400 + 600))  # not negative, not > 1
    assert s3.preemptions_total == 80  # 78 + 2 new after the restart: the total never goes back

    # no queries in between: the hit rate is unknown, not 0
    server.serve("/metrics", third)
    [s4] = await scrape(scraper, now=15.0)
    assert s4.kv_cache_hit_rate is None and s4.preemptions_total == 80


async def test_vllm_legacy_gpu_prefix_counters(server: ExpositionServer) -> None:
    first = fixture_text("vllm_v0.8.txt")
    scraper = Scraper(server.serve("/metrics", first), "vllm", replica="r")
    await scrape(scraper)
    second = set_value(first, "vllm:gpu_prefix_cache_queries_total{", 121_000)
    second = set_value(second, "vllm:gpu_prefix_cache_hits_total{", 78_250)
    server.serve("/metrics", second)
    [sample] = await scrape(scraper)
    assert sample.kv_cache_hit_rate == pytest.approx(250 / 1000)


def test_llamacpp_hit_rate_and_time_per_token_from_its_counters_across_scrapes() -> None:
    first = fixture_text("llamacpp_b11312.txt")
    scraper = Scraper("http://unused", "llamacpp", replica="r")
    [s1] = scraper.map(first, now=0.0)
    assert (s1.kv_cache_hit_rate, s1.tpot_count, s1.tpot_mean_s) == (None, None, None)  # totals, no interval
    # the same server once the three requests finished (each 200 tokens): what its /metrics said then
    second = set_value(set_value(first, "llamacpp:prompt_tokens_total", 67), "llamacpp:prompt_tokens_cached_total", 74)
    second = set_value(set_value(second, "llamacpp:tokens_predicted_total", 620),
                       "llamacpp:tokens_predicted_seconds_total", 12.0083)
    second = set_value(set_value(second, "llamacpp:requests_processing", 0), "llamacpp:requests_deferred", 0)
    [s2] = scraper.map(second, now=5.0)
    # prompt_tokens excludes the cached ones: 23 cached of 23 + 25 prompt tokens in between
    assert s2.kv_cache_hit_rate == pytest.approx(23 / (23 + 25))
    assert s2.tpot_count == 600  # 620 - 20: the three requests' tokens, counted when they released their slots
    assert s2.tpot_mean_s == pytest.approx((12.0083 - 0.192875) / 600)
    assert (s2.tpot_p50_s, s2.tpot_p99_s, s2.ttft_count) == (None, None, None)  # no histogram to read them from
    assert (s2.running_requests, s2.queue_length) == (0, 0)
    assert decode_telemetry(encode_sample(s2)) == s2
    # nothing finished and no prompt since: no tokens, so no time per token and no hit rate (unknown, not 0)
    [s3] = scraper.map(second, now=10.0)
    assert (s3.tpot_count, s3.tpot_mean_s, s3.kv_cache_hit_rate) == (0, None, None)
    # the server restarted: its counters began again, and what they hold is the interval
    restarted = set_value(set_value(second, "llamacpp:tokens_predicted_total", 64),
                          "llamacpp:tokens_predicted_seconds_total", 1.28)
    [s4] = scraper.map(restarted, now=15.0)
    assert (s4.tpot_count, s4.tpot_mean_s) == (64, pytest.approx(0.02))


def test_vllm_v0_hit_rate_of_minus_one_means_prefix_caching_off() -> None:
    text = set_value(fixture_text("vllm_v0.6.txt"), "vllm:gpu_prefix_cache_hit_rate{", -1)
    [sample] = map_exposition(text, ENGINE_MAPS["vllm"], CounterTracker(), ts=1.0, replica="r")
    assert sample.kv_cache_hit_rate is None and sample.kv_cache_usage == pytest.approx(0.6843)


def test_dcgm_ecc_counter_reset_keeps_the_total_growing() -> None:
    engine, tracker = ENGINE_MAPS["dcgm"], CounterTracker()
    text = fixture_text("dcgm_3.3.txt")
    ecc1 = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1"'
    totals = []
    for value in (2, 5, 1):  # 2 -> 5 (+3) -> driver reload, volatile counter back to 1 (+1)
        samples = map_exposition(set_value(text, ecc1, value), engine, tracker, ts=1.0, replica=None)
        totals.append(samples[1].ecc_uncorrected_total)
    assert totals == [2, 5, 6]


def test_counter_tracker_deltas_resets_and_pruning() -> None:
    tracker = CounterTracker()
    assert tracker.observe("a", 10.0) is None
    assert tracker.observe("a", 10.0) == 0.0
    assert tracker.observe("a", 25.0) == 15.0
    assert tracker.observe("a", 3.0) == 3.0  # reset: the counter restarted at 0
    assert tracker.total("a") == 28.0
    tracker.observe("b", 1.0)
    tracker.retain(["a"])
    assert len(tracker) == 1
    assert tracker.observe("b", 5.0) is None  # forgotten: starts over


def test_names_compare_without_total_suffix_typed_or_untyped() -> None:
    assert normalize_name("vllm:num_preemptions_total") == "vllm:num_preemptions"
    untyped = 'vllm:num_preemptions_total{model_name="m"} 7\nvllm:num_requests_waiting{model_name="m"} 2\n'
    [sample] = map_exposition(untyped, ENGINE_MAPS["vllm"], CounterTracker(), ts=1.0, replica="r")
    assert (sample.preemptions_total, sample.queue_length) == (7, 2)


def test_wrong_kind_yields_no_sample() -> None:
    text = fixture_text("tgi_v2.txt")
    assert map_exposition(text, ENGINE_MAPS["vllm"], CounterTracker(), ts=1.0, replica="r") == []


def test_every_table_rule_names_a_sample_field() -> None:
    fields = set(TelemetrySample.__dataclass_fields__)
    for engine in ENGINE_MAPS.values():
        assert engine.source in ("vllm", "sglang", "tgi", "llamacpp", "dcgm")
        for rule in engine.rules:
            assert rule.field in fields


# --------------------------------------------------------------------------- failures and the command
async def test_scrape_errors_are_one_line_and_the_loop_keeps_going(server: ExpositionServer) -> None:
    url = server.serve("/metrics", "oops", status=500)
    scraper = Scraper(url, "tgi", replica="r", timeout_s=2.0)
    with pytest.raises(ScrapeError, match="HTTP 500"):
        await scrape(scraper)
    server.serve("/metrics", "this is { not an exposition\n")
    with pytest.raises(ScrapeError, match="not a Prometheus text exposition"):
        await scrape(scraper)
    with pytest.raises(ScrapeError, match="127.0.0.1:1"):
        await scrape(Scraper("http://127.0.0.1:1/metrics", "tgi", replica="r", timeout_s=2.0))

    # run_bridge: a failing round publishes nothing and the loop goes on; the next round works again
    published: list[TelemetrySample] = []
    server.serve("/metrics", "down", status=503)

    async def recover_later() -> None:
        await asyncio.sleep(0.15)
        server.serve("/metrics", fixture_text("tgi_v2.txt"))

    recovery = asyncio.create_task(recover_later())
    rounds = await run_bridge(scraper, published.append, interval_s=0.1, max_rounds=4)
    await recovery
    assert rounds == 4
    assert 1 <= len(published) <= 3 and all(s.queue_length == 11 for s in published)


def test_scrape_once_command_prints_samples(server: ExpositionServer) -> None:
    url = server.serve("/metrics", fixture_text("sglang_v0.4.txt"))
    result = CliRunner().invoke(scrape_command, ["--target", url, "--kind", "sglang", "--replica", "s1", "--once"])
    assert result.exit_code == 0, result.output
    [line] = result.stdout.strip().splitlines()
    wire = orjson.loads(line)
    assert (wire["replica"], wire["source"], wire["queue_length"]) == ("s1", "sglang", 6)


def test_scrape_once_command_with_batch_capacity(server: ExpositionServer) -> None:
    url = server.serve("/metrics", fixture_text("vllm_v0.10.txt"))
    result = CliRunner().invoke(scrape_command, ["--target", url, "--kind", "vllm", "--replica", "v1",
                                                 "--batch-capacity", "256", "--once"])
    assert result.exit_code == 0, result.output
    wire = orjson.loads(result.stdout.strip())
    assert (wire["replica"], wire["batch_capacity"], wire["running_requests"]) == ("v1", 256, 60)


def test_scrape_command_needs_a_replica_for_engines() -> None:
    result = CliRunner().invoke(scrape_command, ["--target", "http://127.0.0.1:1", "--kind", "vllm", "--once"])
    assert result.exit_code == 2 and "--replica is required" in result.output


# --------------------------------------------------------------------------- live latency histograms
def _histogram(name: str, engines: dict[str, tuple[list[float], float]], bounds: tuple[float, ...]) -> str:
    """A Prometheus histogram as vLLM's prometheus_client writes it: per engine, cumulative bucket
    counts at ``bounds`` then +Inf, and the sum."""
    gauge = name.split(":")[0] + (":num_requests_running" if name.startswith("vllm") else ":num_running_reqs")
    lines = [f"# TYPE {gauge} gauge", f'{gauge}{{model_name="m"}} 3', f"# HELP {name} latency",
             f"# TYPE {name} histogram"]
    for engine, (cumulative, total) in engines.items():
        labels = f'engine="{engine}",model_name="m"'
        for bound, count in zip([*map(str, bounds), "+Inf"], cumulative, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}')
        lines.append(f"{name}_count{{{labels}}} {cumulative[-1]}")
        lines.append(f"{name}_sum{{{labels}}} {total}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"])
def test_vllm_per_token_latency_is_the_histograms_delta_between_scrapes(name: str) -> None:
    bounds = (0.025, 0.05, 0.1, 0.5)
    scraper = Scraper("http://unused", "vllm", replica="r")
    first = _histogram(name, {"0": ([10, 50, 60, 60, 60], 2.0), "1": ([0, 20, 20, 20, 20], 0.8)}, bounds)
    [sample] = scraper.map(first, now=1.0)
    assert sample.tpot_count is None  # one scrape is no interval: unknown, not zero
    # 100 more tokens: engine 0 gives 40 in (0.025, 0.05] and 10 in (0.1, 0.5]; engine 1 gives 50 in (0, 0.025]
    second = _histogram(name, {"0": ([10, 90, 100, 110, 110], 2.0 + 40 * 0.04 + 10 * 0.3),
                               "1": ([50, 70, 70, 70, 70], 0.8 + 50 * 0.02)}, bounds)
    [sample] = scraper.map(second, now=6.0)
    assert sample.tpot_count == 100
    assert sample.tpot_mean_s == pytest.approx((40 * 0.04 + 10 * 0.3 + 50 * 0.02) / 100)
    # per bucket: 50 | 40 | 0 | 10 | 0 -> the median at rank 50 is the first bucket's upper bound,
    # P99 at rank 99 inside (0.1, 0.5], 9/10 of the way
    assert sample.tpot_p50_s == pytest.approx(0.025)
    assert sample.tpot_p99_s == pytest.approx(0.1 + 0.4 * 9 / 10)
    assert decode_telemetry(encode_sample(sample)) == sample
    [quiet] = scraper.map(second, now=11.0)  # nothing produced since: 0 tokens, no latency to report
    assert (quiet.tpot_count, quiet.tpot_mean_s, quiet.tpot_p50_s) == (0, None, None)


def test_sglang_first_token_latency_from_its_histogram_and_across_a_reset() -> None:
    name = "sglang:time_to_first_token_seconds"
    bounds = (0.1, 0.5, 1.0)
    scraper = Scraper("http://unused", "sglang", replica="r")
    scraper.map(_histogram(name, {"0": ([5, 8, 9, 10], 3.0)}, bounds), now=1.0)
    [sample] = scraper.map(_histogram(name, {"0": ([5, 12, 13, 14], 4.6)}, bounds), now=6.0)
    assert (sample.ttft_count, sample.ttft_mean_s) == (4, pytest.approx(0.4))
    # the engine restarted: its counters began again from zero, and what they hold is the interval
    [after] = scraper.map(_histogram(name, {"0": ([1, 2, 2, 2], 0.35)}, bounds), now=11.0)
    assert (after.ttft_count, after.ttft_mean_s, after.ttft_p50_s) == (2, pytest.approx(0.175), pytest.approx(0.1))
