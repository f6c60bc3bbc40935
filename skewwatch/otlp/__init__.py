"""OTLP in: OpenTelemetry request spans from vLLM / the OTel Collector as request events.

``decode`` turns an OTLP trace payload (protobuf or JSON) into contract-v1 request events,
``attribute_map`` is the data-driven table saying which span attribute becomes which field, and
``receiver`` is the ``skewwatch otlp-receiver`` OTLP/HTTP endpoint that publishes them.
"""

from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap, FieldRule, SpanView
from skewwatch.otlp.decode import MALFORMED_OTLP, OtlpDecodeResult, decode_otlp_traces

__all__ = ["DEFAULT_ATTRIBUTE_MAP", "MALFORMED_OTLP", "AttributeMap", "FieldRule", "OtlpDecodeResult",
           "SpanView", "decode_otlp_traces"]
