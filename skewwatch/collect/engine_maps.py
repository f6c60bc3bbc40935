"""Prometheus exposition -> TelemetrySample, through one DATA TABLE per engine.

Deployments already expose engine and GPU state on Prometheus endpoints (vLLM, SGLang, TGI,
llama.cpp's server, DCGM exporter); the bridge maps them onto the ``gpu-telemetry`` schema without changing the
servers, whose field names map one to one to what DCGM exporter and vLLM expose (docs/design.md,
"GPU telemetry"). This module is pure (text in, samples out);
the HTTP scraping lives in :mod:`skewwatch.collect.scrape_command`.

A table is a tuple of rules. For each field the FIRST rule that yields a value wins, and
inside a rule the first metric name present wins (current name first, legacy aliases
after), so adding an engine version is adding a name to a tuple. Rule kinds:

* :class:`MetricRule` ``gauge`` -- value x scale; ``ratio`` -- value x scale, must lie in
  0..1 (vLLM 0.6 exports -1 when prefix caching is off: that is unknown, not a ratio);
  ``counter`` -- a running total corrected for counter resets (engine restarts).
* :class:`DeltaRatioRule` -- delta(numerator) / delta(denominator) between two scrapes
  (vLLM prefix-cache hit rate from its hits/queries counters), or delta(numerator) /
  (delta(numerator) + delta(denominator)) when the denominator counts the misses only (llama.cpp's
  cached and processed prompt tokens). Unknown on the first scrape.
* :class:`SumRule` -- the sum of several metrics (DCGM total memory = used + free + reserved).
* :class:`HistogramDeltaRule` -- what a latency histogram observed between two scrapes (vLLM's and
  SGLang's per-token and first-token latency histograms): count, mean, P50 and P99, four fields.
* :class:`DeltaMeanRule` -- the same count and mean from two plain counters, a count and the seconds
  it took (llama.cpp keeps totals, no histogram): two of those fields, no quantiles.

Counter state between scrapes lives in :class:`CounterTracker`, a small pure class.

Names are compared after removing one trailing ``_total``: prometheus_client's parser strips
``_total`` from counter FAMILY names and appends it to counter SAMPLES that lack it (so a
typed DCGM counter ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` comes back as
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total``), while an untyped ``x_total`` keeps its suffix.

>>> text = '''# TYPE vllm:num_requests_waiting gauge
... vllm:num_requests_waiting{model_name="m"} 3.0
... # TYPE vllm:gpu_cache_usage_perc gauge
... vllm:gpu_cache_usage_perc{model_name="m"} 0.25
... '''
>>> [s] = map_exposition(text, ENGINE_MAPS["vllm"], CounterTracker(), ts=1.0, replica="r1")
>>> s.queue_length, s.kv_cache_usage, s.source
(3, 0.25, 'vllm')
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from skewwatch.collect.histogram import histogram_quantile
from skewwatch.schemas.telemetry_sample import TelemetrySample

MIB = 1024.0 * 1024.0

Kind = Literal["gauge", "counter", "ratio"]
Aggregate = Literal["sum", "mean", "max", "bitor"]

_SAMPLE_TYPES = typing.get_type_hints(TelemetrySample)
INT_FIELDS = frozenset(
    name for name, hint in _SAMPLE_TYPES.items() if int in typing.get_args(hint) and name != "gpu_index"
)
MEASURE_FIELDS = frozenset(_SAMPLE_TYPES) - {"ts", "replica", "source", "node", "gpu_index", "gpu_uuid", "v"}
# Fields the contract requires to be >= 1 when present: an exporter's 0 there means "not set".
POSITIVE_FIELDS = frozenset({"batch_capacity"})


def normalize_name(name: str) -> str:
    """Metric name without one trailing ``_total`` (see the module docstring for why).

    >>> normalize_name("vllm:num_preemptions_total"), normalize_name("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total")
    ('vllm:num_preemptions', 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')
    """
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True, slots=True)
class Series:
    """One exposed time series: normalized metric name, its labels, its value."""

    name: str
    labels: Mapping[str, str]
    value: float

    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return self.name, tuple(sorted(self.labels.items()))


Group = Mapping[str, list[Series]]  # normalized metric name -> its series within one group (GPU)


@dataclass(frozen=True, slots=True)
class MetricRule:
    field: str  # TelemetrySample field
    names: tuple[str, ...]  # current name first, then legacy aliases
    kind: Kind = "gauge"
    scale: float = 1.0  # unit conversion: MiB -> bytes, % -> 0..1
    aggregate: Aggregate = "sum"  # how several series in one group combine (DP engines, MIG, xid codes)


@dataclass(frozen=True, slots=True)
class DeltaRatioRule:
    field: str
    numerator: tuple[str, ...]  # counter names (aliases)
    denominator: tuple[str, ...]
    # the denominator counts only what the numerator does not (misses, not queries): the ratio is
    # delta(numerator) / (delta(numerator) + delta(denominator))
    complement: bool = False


@dataclass(frozen=True, slots=True)
class SumRule:
    field: str
    parts: tuple[tuple[str, ...], ...]  # every part must be present (each part: names with aliases)
    optional_parts: tuple[tuple[str, ...], ...] = ()
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class HistogramDeltaRule:
    """What a latency histogram observed between two scrapes, as four fields: ``<prefix>_count``
    (observations), ``<prefix>_mean_s`` (delta sum / delta count), ``<prefix>_p50_s`` and
    ``<prefix>_p99_s`` (from the delta of the buckets, as Prometheus' ``histogram_quantile``).
    Unknown on the first scrape; a count of 0 leaves the quantiles unknown."""

    prefix: str  # "tpot" | "ttft" (contract gpu-telemetry v1.3)
    names: tuple[str, ...]  # histogram family names: current first, then aliases

    @property
    def field(self) -> str:
        return f"{self.prefix}_count"


@dataclass(frozen=True, slots=True)
class DeltaMeanRule:
    """What a count counter and a seconds counter say between two scrapes, as two of
    :class:`HistogramDeltaRule`'s fields: ``<prefix>_count`` (delta count) and ``<prefix>_mean_s``
    (delta seconds / delta count). For an engine that keeps totals rather than a histogram, so there
    are no quantiles. Unknown on the first scrape; a count of 0 leaves the mean unknown."""

    prefix: str  # "tpot" | "ttft" (contract gpu-telemetry v1.3)
    count: tuple[str, ...]  # counter names (aliases)
    seconds: tuple[str, ...]

    @property
    def field(self) -> str:
        return f"{self.prefix}_count"


Rule = MetricRule | DeltaRatioRule | SumRule | HistogramDeltaRule | DeltaMeanRule
Finalizer = Callable[[dict[str, Any], Group], None]


@dataclass(frozen=True, slots=True)
class EngineMap:
    """How one exporter's metrics become samples."""

    source: str  # TelemetrySample.source
    rules: tuple[Rule, ...]
    group_by: tuple[str, ...] = ()  # labels that identify one GPU; () = the whole endpoint is one sample
    identity_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # sample field -> labels
    finalize: Finalizer | None = None  # engine-specific fix-ups after the rules ran


class CounterTracker:
    """Previous raw value of every counter series, to turn counters into deltas and totals.

    A value lower than the previous one means the exporter restarted: Prometheus semantics,
    the counter started again from zero, so the delta is the new value itself.

    >>> t = CounterTracker()
    >>> t.observe("hits", 100.0), t.observe("hits", 130.0), t.observe("hits", 20.0)
    (None, 30.0, 20.0)
    >>> t.total("hits")   # 100 + 30 + 20: keeps growing across the reset
    150.0
    """

    def __init__(self) -> None:
        self._raw: dict[Hashable, float] = {}
        self._total: dict[Hashable, float] = {}

    def observe(self, key: Hashable, raw: float) -> float | None:
        """Record ``raw``; return the increase since the previous observation (None the first time)."""
        previous = self._raw.get(key)
        self._raw[key] = raw
        if previous is None:
            self._total[key] = raw
            return None
        delta = raw if raw < previous else raw - previous
        self._total[key] += delta
        return delta

    def total(self, key: Hashable) -> float:
        """The reset-corrected running total of a series (its first raw value plus every increase)."""
        return self._total[key]

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Forget series no longer exposed, so label churn does not grow the state forever."""
        keep = set(keys)
        for key in [k for k in self._raw if k not in keep]:
            del self._raw[key]
            del self._total[key]

    def __len__(self) -> int:
        return len(self._raw)


# --------------------------------------------------------------------------- the tables
# batch_capacity (the most requests one replica runs at once, contract v1.1): only what an engine
# really exposes. vLLM does not: its only info metric, vllm:cache_config_info, carries CacheConfig
# labels (block_size, num_gpu_blocks, ...) and --max-num-seqs is a SchedulerConfig field. TGI does
# not: it exports tgi_batch_max_total_tokens (a token budget, not a request count) and keeps
# --max-batch-size for its /info route. SGLang's first exporter did (sglang:max_running_requests);
# its current one does not (sglang:max_running_requests_under_SLO is an SLO estimate, not the cap).
# Where nothing is exposed, `skewwatch scrape --batch-capacity N` supplies the engine's setting.
_VLLM = EngineMap(
    source="vllm",
    rules=(
        MetricRule("queue_length", ("vllm:num_requests_waiting",)),
        MetricRule("running_requests", ("vllm:num_requests_running",)),
        # "perc" is a 0..1 fraction in every vLLM version ("1 means 100 percent usage").
        MetricRule("kv_cache_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "ratio",
                   aggregate="mean"),
        # v1 engine: token counters (0.10+: prefix_cache_*, 0.7-0.9: gpu_prefix_cache_*).
        DeltaRatioRule(
            "kv_cache_hit_rate",
            numerator=("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
            denominator=("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        ),
        # v0 engine (<= 0.6): a gauge, -1 when prefix caching is disabled.
        MetricRule("kv_cache_hit_rate", ("vllm:gpu_prefix_cache_hit_rate",), "ratio", aggregate="mean"),
        MetricRule("preemptions_total", ("vllm:num_preemptions",), "counter"),
        # live per-token latencies (observed as tokens are produced, not when requests finish);
        # 0.11+ renamed time_per_output_token to inter_token_latency
        HistogramDeltaRule("tpot", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
        HistogramDeltaRule("ttft", ("vllm:time_to_first_token_seconds",)),
    ),
)

def _sglang_first_exporter(values: dict[str, Any], group: Group) -> None:
    """SGLang's first exporter (``sglang:num_requests_running``, label ``name``) wrote
    ``sglang:cache_hit_rate`` as a percentage (its docs show 10.61), the current one as a 0..1
    ratio. A percentage below 1 would pass as a ratio 100x too high, so from the first exporter
    the hit rate is left unknown rather than guessed."""
    if "sglang:num_requests_running" in group and "sglang:num_running_reqs" not in group:
        values.pop("kv_cache_hit_rate", None)


_SGLANG = EngineMap(
    source="sglang",
    rules=(
        # current names (collector.py, label model_name), then the first exporter's (label name)
        MetricRule("queue_length", ("sglang:num_queue_reqs", "sglang:num_requests_waiting")),
        MetricRule("running_requests", ("sglang:num_running_reqs", "sglang:num_requests_running")),
        MetricRule("kv_cache_usage", ("sglang:token_usage",), "ratio", aggregate="mean"),
        MetricRule("kv_cache_hit_rate", ("sglang:cache_hit_rate",), "ratio", aggregate="mean"),
        # --max-running-requests as the scheduler resolved it; only the first exporter has it
        MetricRule("batch_capacity", ("sglang:max_running_requests",)),
        HistogramDeltaRule("tpot", ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")),
        HistogramDeltaRule("ttft", ("sglang:time_to_first_token_seconds",)),
    ),
    finalize=_sglang_first_exporter,
)

_TGI = EngineMap(
    source="tgi",
    rules=(
        MetricRule("queue_length", ("tgi_queue_size",)),
        MetricRule("running_requests", ("tgi_batch_current_size",)),
    ),
)

# llama.cpp's llama-server (--metrics): unlabelled totals and gauges, no histogram, no KV-cache usage and
# no slot count (-np) on /metrics (docs/telemetry.md, "llama.cpp"). A request waiting for a free slot is
# "deferred"; one holding a slot is "processing".
_LLAMACPP = EngineMap(
    source="llamacpp",
    rules=(
        MetricRule("queue_length", ("llamacpp:requests_deferred",)),
        MetricRule("running_requests", ("llamacpp:requests_processing",)),
        # prompt tokens reused from a slot's cache / all prompt tokens; prompt_tokens excludes the cached
        DeltaRatioRule("kv_cache_hit_rate", numerator=("llamacpp:prompt_tokens_cached",),
                       denominator=("llamacpp:prompt_tokens",), complement=True),
        # generated tokens and their generation time, added when a request releases its slot (not as
        # tokens are produced); the time runs from each request's first token, which the count includes
        DeltaMeanRule("tpot", count=("llamacpp:tokens_predicted",), seconds=("llamacpp:tokens_predicted_seconds",)),
    ),
)


def _dcgm_xid(values: dict[str, Any], group: Group) -> None:
    """DCGM_FI_DEV_XID_ERRORS is LATCHED (the last XID ever seen, 0 = none) while
    DCGM_EXP_XID_ERRORS_COUNT counts XIDs per code (label ``xid``) in the exporter's window
    (5 min by default). ``xid_last`` means "most recent XID within the window", as from the
    NVML collector, so a latched code outside the window is dropped; without the windowed
    count the latched value is passed through (the best DCGM offers)."""
    latched = values.get("xid_last")
    if latched == 0:
        values.pop("xid_last")
        latched = None
    count = values.get("xid_count_5m")
    if count is None:
        return
    recent_codes = {
        int(s.labels["xid"])
        for s in group.get("DCGM_EXP_XID_ERRORS_COUNT", [])
        if s.value > 0 and s.labels.get("xid", "").isdigit() and int(s.labels["xid"]) > 0
    }
    if count == 0:
        values.pop("xid_last", None)
    elif recent_codes:
        # The exporter does not say which code came last: the latched one if it is recent, else the highest.
        values["xid_last"] = latched if latched in recent_codes else max(recent_codes)
    # count > 0 without per-code labels: keep the latched value, the best there is.


_DCGM = EngineMap(
    source="dcgm",
    rules=(
        MetricRule("memory_used_bytes", ("DCGM_FI_DEV_FB_USED",), scale=MIB),
        MetricRule("memory_total_bytes", ("DCGM_FI_DEV_FB_TOTAL",), scale=MIB),
        SumRule(
            "memory_total_bytes",
            parts=(("DCGM_FI_DEV_FB_USED",), ("DCGM_FI_DEV_FB_FREE",)),
            optional_parts=(("DCGM_FI_DEV_FB_RESERVED",),),
            scale=MIB,
        ),
        MetricRule("utilization_gpu", ("DCGM_FI_DEV_GPU_UTIL",), "ratio", scale=0.01, aggregate="mean"),
        MetricRule("power_w", ("DCGM_FI_DEV_POWER_USAGE",)),
        MetricRule("temperature_c", ("DCGM_FI_DEV_GPU_TEMP",), aggregate="max"),
        MetricRule(
            "throttle_reasons",
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
            aggregate="bitor",
        ),
        MetricRule("ecc_uncorrected_total", ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "counter"),
        MetricRule("xid_last", ("DCGM_FI_DEV_XID_ERRORS",), aggregate="max"),
        MetricRule("xid_count_5m", ("DCGM_EXP_XID_ERRORS_COUNT",)),
    ),
    group_by=("UUID", "gpu"),
    identity_labels={
        "gpu_uuid": ("UUID", "uuid"),
        "gpu_index": ("gpu",),
        "node": ("Hostname", "node"),
        "replica": ("pod",),
    },
    finalize=_dcgm_xid,
)

ENGINE_MAPS: dict[str, EngineMap] = {"vllm": _VLLM, "sglang": _SGLANG, "tgi": _TGI, "llamacpp": _LLAMACPP,
                                     "dcgm": _DCGM}


# --------------------------------------------------------------------------- mapping
def parse_series(text: str) -> list[Series]:
    """All finite samples of an exposition, names normalized. Raises ValueError on bad text."""
    out: list[Series] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):  # prometheus_client's counter creation times
                continue
            value = float(sample.value)
            if math.isfinite(value):
                out.append(Series(normalize_name(sample.name), dict(sample.labels), value))
    return out


def _first_present(group: Group, names: tuple[str, ...]) -> list[Series] | None:
    for name in names:
        found = group.get(normalize_name(name))
        if found:
            return found
    return None


def _aggregate(values: list[float], how: Aggregate) -> float:
    if how == "sum":
        return math.fsum(values)
    if how == "mean":
        return math.fsum(values) / len(values)
    if how == "max":
        return max(values)
    bits = 0
    for v in values:
        bits |= int(v)
    return float(bits)


def _as_ratio(value: float) -> float | None:
    if -1e-9 <= value <= 1.0 + 1e-9:
        return min(max(value, 0.0), 1.0)
    return None  # e.g. vLLM's -1 "prefix caching disabled": unknown, not a ratio


def _counter_delta(series: list[Series], group_key: tuple[str, ...], tracker: CounterTracker,
                   seen: list[Hashable]) -> float | None:
    """The increase of a counter's series (summed) since the previous scrape; None on a series' first."""
    deltas = []
    for s in series:
        key = (group_key, s.key())
        deltas.append(tracker.observe(key, s.value))
        seen.append(key)
    known = [d for d in deltas if d is not None]
    return math.fsum(known) if len(known) == len(deltas) else None


def _delta_mean(rule: DeltaMeanRule, group: Group, group_key: tuple[str, ...], tracker: CounterTracker,
                seen: list[Hashable]) -> dict[str, float] | None:
    """``<prefix>_count`` and ``<prefix>_mean_s`` from the rule's two counters (see the rule)."""
    count_series = _first_present(group, rule.count)
    seconds_series = _first_present(group, rule.seconds)
    if count_series is None or seconds_series is None:
        return None
    count = _counter_delta(count_series, group_key, tracker, seen)
    seconds = _counter_delta(seconds_series, group_key, tracker, seen)
    if count is None or seconds is None:
        return None  # the first scrape of a series: no interval yet
    out = {f"{rule.prefix}_count": count}
    if count > 0:
        out[f"{rule.prefix}_mean_s"] = max(seconds, 0.0) / count
    return out


def _apply_rule(rule: MetricRule | DeltaRatioRule | SumRule, group: Group, group_key: tuple[str, ...],
                tracker: CounterTracker, seen: list[Hashable]) -> float | None:
    if isinstance(rule, MetricRule):
        series = _first_present(group, rule.names)
        if series is None:
            return None
        if rule.kind == "counter":
            totals = []
            for s in series:
                key = (group_key, s.key())
                tracker.observe(key, s.value)
                seen.append(key)
                totals.append(tracker.total(key))
            return math.fsum(totals) * rule.scale
        value = _aggregate([s.value for s in series], rule.aggregate) * rule.scale
        return _as_ratio(value) if rule.kind == "ratio" else value
    if isinstance(rule, DeltaRatioRule):
        numerator = _first_present(group, rule.numerator)
        denominator = _first_present(group, rule.denominator)
        if numerator is None or denominator is None:
            return None
        num = _counter_delta(numerator, group_key, tracker, seen)
        den = _counter_delta(denominator, group_key, tracker, seen)
        if num is not None and den is not None and rule.complement:
            den += num
        if num is None or den is None or den <= 0:
            return None  # first scrape, or no queries in between: the hit rate is unknown
        return _as_ratio(num / den) if num <= den else 1.0
    parts = [_first_present(group, names) for names in rule.parts]
    if any(p is None for p in parts):
        return None
    total = math.fsum(s.value for p in parts if p is not None for s in p)
    for names in rule.optional_parts:
        total += math.fsum(s.value for s in _first_present(group, names) or [])
    return total * rule.scale


def _histogram_delta(rule: HistogramDeltaRule, group: Group, group_key: tuple[str, ...],
                     tracker: CounterTracker, seen: list[Hashable]) -> dict[str, float] | None:
    """The observations of ``rule``'s histogram since the previous scrape (see the rule), summed
    over its series (data-parallel engines, one series per label set)."""
    for name in rule.names:
        buckets = group.get(normalize_name(name) + "_bucket")
        if buckets:
            break
    else:
        return None

    def deltas(series: list[Series]) -> list[tuple[Series, float | None]]:
        out = []
        for s in series:
            key = (group_key, s.key())
            out.append((s, tracker.observe(key, s.value)))
            seen.append(key)
        return out

    bucket_deltas = deltas(buckets)
    count_deltas = deltas(group.get(normalize_name(name) + "_count", []))
    sum_deltas = deltas(group.get(normalize_name(name) + "_sum", []))
    if any(d is None for _, d in bucket_deltas + count_deltas + sum_deltas) or not count_deltas:
        return None  # the first scrape of a series: no interval yet
    cumulative: dict[float, float] = {}
    for s, d in bucket_deltas:
        try:
            bound = float(s.labels.get("le", "nan"))
        except ValueError:
            continue
        if not math.isnan(bound):
            cumulative[bound] = cumulative.get(bound, 0.0) + float(d or 0.0)
    count = math.fsum(float(d or 0.0) for _, d in count_deltas)
    total = math.fsum(float(d or 0.0) for _, d in sum_deltas)
    out: dict[str, float] = {f"{rule.prefix}_count": count}
    bounds = sorted(b for b in cumulative if math.isfinite(b))
    if count <= 0 or not bounds:
        return out
    cumulative[math.inf] = max(cumulative.get(math.inf, count), count)
    per_bucket: list[float] = []
    below = 0.0
    for bound in [*bounds, math.inf]:
        here = max(cumulative[bound], below)  # cumulative counts never fall (a reset on one series could)
        per_bucket.append(here - below)
        below = here
    out[f"{rule.prefix}_mean_s"] = max(total, 0.0) / count
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        value = histogram_quantile(bounds, per_bucket, q)
        if value is not None:
            out[f"{rule.prefix}_{key}_s"] = value
    return out


def _identity(group: Group, labels_for: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for series_list in group.values():
        for s in series_list:
            for target, label_names in labels_for.items():
                if target in found:
                    continue
                for label in label_names:
                    if s.labels.get(label):
                        found[target] = s.labels[label]
                        break
    return found


def _group(series: list[Series], group_by: tuple[str, ...]) -> dict[tuple[str, ...], dict[str, list[Series]]]:
    groups: dict[tuple[str, ...], dict[str, list[Series]]] = {}
    for s in series:
        key = tuple(s.labels.get(label, "") for label in group_by)
        groups.setdefault(key, {}).setdefault(s.name, []).append(s)
    if group_by and len(groups) > 1:
        # Series without any GPU label (exporter-level metrics) do not make a GPU of their own.
        groups.pop(tuple("" for _ in group_by), None)
    return groups


def map_series(series: list[Series], engine: EngineMap, tracker: CounterTracker, *, ts: float,
               replica: str | None) -> list[TelemetrySample]:
    """Map parsed series to samples: one per group (GPU for DCGM, the endpoint for engines).

    ``replica`` given: every sample carries it. Otherwise the ``pod`` label, else
    ``<node>-gpu<index>`` (the NVML collector's default naming); a group without any is skipped.
    Groups with no known metric are skipped (a wrong ``--kind`` yields no samples).
    """
    samples: list[TelemetrySample] = []
    seen: list[Hashable] = []
    for group_key, group in sorted(_group(series, engine.group_by).items()):
        values: dict[str, Any] = {}
        for rule in engine.rules:
            if rule.field in values:
                continue
            if isinstance(rule, HistogramDeltaRule):
                values.update(_histogram_delta(rule, group, group_key, tracker, seen) or {})
                continue
            if isinstance(rule, DeltaMeanRule):
                values.update(_delta_mean(rule, group, group_key, tracker, seen) or {})
                continue
            value = _apply_rule(rule, group, group_key, tracker, seen)
            if value is not None:
                values[rule.field] = value
        if engine.finalize is not None:
            engine.finalize(values, group)
        if not values:
            continue
        for name in INT_FIELDS & values.keys():
            values[name] = int(round(values[name]))
        for name in POSITIVE_FIELDS & values.keys():
            if values[name] < 1:
                del values[name]
        if not values:
            continue
        ident = _identity(group, engine.identity_labels)
        gpu_index = int(ident["gpu_index"]) if ident.get("gpu_index", "").isdigit() else None
        node = ident.get("node")
        who = replica or ident.get("replica")
        if who is None and node is not None and gpu_index is not None:
            who = f"{node}-gpu{gpu_index}"
        if who is None:
            continue
        samples.append(
            TelemetrySample(ts=ts, replica=who, source=engine.source, node=node, gpu_index=gpu_index,
                            gpu_uuid=ident.get("gpu_uuid"), **values)
        )
    tracker.retain(seen)
    return samples


def map_exposition(text: str, engine: EngineMap, tracker: CounterTracker, *, ts: float,
                   replica: str | None) -> list[TelemetrySample]:
    """Parse a Prometheus text exposition and map it (see :func:`map_series`)."""
    return map_series(parse_series(text), engine, tracker, ts=ts, replica=replica)
