"""Collecting telemetry for ``llm.gpu-telemetry``: the programs that run beside the GPUs and engines.

* :mod:`skewwatch.collect.nvml_collector` reads NVML on a GPU node (or simulates it);
  :mod:`skewwatch.collect.collect_gpu_command` is the ``skewwatch collect-gpu`` command around it.
* :mod:`skewwatch.collect.engine_maps` maps Prometheus expositions (vLLM, SGLang, TGI, DCGM
  exporter) to :class:`~skewwatch.schemas.telemetry_sample.TelemetrySample` through one data table
  per engine; :mod:`skewwatch.collect.scrape_command` is the ``skewwatch scrape`` command.
* :mod:`skewwatch.collect.histogram` reads an engine's latency histograms between two scrapes (the
  live ``tpot_*`` / ``ttft_*`` fields, contract v1.3); the fleet simulator's engines report through it.
* Everything is published through :class:`skewwatch.client.bounded_producer.BoundedProducer`,
  key = replica id, so a broker outage costs a counter, never a stalled sampling loop.

The worker's side of telemetry is elsewhere: the record (``schemas/telemetry_sample.py``, decoded by
``schemas/telemetry.py``), its pacing against the requests (``pipeline/telemetry_pacing.py``) and its
join to the replica steps (``pipeline/telemetry_join.py``).
"""
