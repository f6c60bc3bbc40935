"""Encode and decode ``llm.features`` records (contract features.v1).

One record per replica and one per model every 5 s of event time (seed §2.5); statistics that are
unknown are ``null``, never NaN (JSON has no NaN, and a consumer must not mistake "no data" for a
number). The key is ``FeatureVector.key``.

>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=0,
...                    latency_p99=float("nan"))
>>> record = encode_features(fv)
>>> b'"latency_p99":null' in record, decode_features(record).latency_p99 is None
(True, True)
"""

from __future__ import annotations

import orjson

from skewwatch.schemas.feature_vector import FeatureVector

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS  # numpy scalars; int cuda codes as keys


def encode_features(fv: FeatureVector) -> bytes:
    """The ``llm.features`` value of one feature vector (UTF-8 JSON, NaN/inf never emitted)."""
    # orjson serialises the dataclass itself (no intermediate dict) and writes NaN/inf as null
    return orjson.dumps(fv, option=_OPTIONS)


def decode_features(value: bytes) -> FeatureVector:
    """A feature vector from its ``llm.features`` value; unknown fields are ignored.

    Raises ValueError naming the problem when the record is not a features.v1 object.
    """
    data = orjson.loads(value)
    if not isinstance(data, dict):
        raise ValueError("features record must be a JSON object")
    if data.get("v", 1) != 1:
        raise ValueError(f"features record: unsupported schema version {data.get('v')!r}")
    missing = [name for name in ("model", "window_start", "window_end", "count") if name not in data]
    if missing:
        raise ValueError(f"features record: missing {', '.join(missing)}")
    return FeatureVector.from_dict(data)


__all__ = ["decode_features", "encode_features"]
