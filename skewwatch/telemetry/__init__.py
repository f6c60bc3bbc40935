"""Telemetry inputs for ``llm.gpu-telemetry`` (issue 4, DESIGN item 6).

* :mod:`skewwatch.telemetry.nvml_collector` reads NVML on a GPU node (or simulates it);
  :mod:`skewwatch.telemetry.collector` is the ``skewwatch collect-gpu`` command around it.
* :mod:`skewwatch.telemetry.engine_maps` maps Prometheus expositions (vLLM, SGLang, TGI, DCGM
  exporter) to :class:`~skewwatch.schemas.telemetry_sample.TelemetrySample` through one data table
  per engine; :mod:`skewwatch.telemetry.bridges` is the ``skewwatch scrape`` command.
* Everything is published through :class:`skewwatch.bounded_producer.BoundedProducer`,
  key = replica id, so a broker outage costs a counter, never a stalled sampling loop.
"""
