"""The feature vector is declared once (``schemas/feature_spec.py``): the shipped JSON Schema, the
``FeatureVector`` dataclass and the windows' feature columns all say what ``FEATURE_FIELDS`` say."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import orjson

import skewwatch.schemas
from skewwatch.schemas import load_schema
from skewwatch.schemas.feature_spec import FEATURE_FIELDS, FEATURE_NAMES, features_schema
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.features import encode_features


def test_the_features_schema_file_is_the_one_the_feature_spec_makes() -> None:
    """features.v1.json says what FEATURE_FIELDS say (types, ranges, required, descriptions), byte for
    byte. After changing the spec, regenerate the file:
    ``python -m skewwatch.schemas.feature_spec > skewwatch/schemas/features.v1.json``."""
    shipped, made = load_schema("features.v1"), features_schema()
    assert {k: v for k, v in shipped.items() if k != "properties"} == {k: v for k, v in made.items()
                                                                        if k != "properties"}
    assert list(shipped["properties"]) == list(made["properties"])
    for name, rule in made["properties"].items():
        assert shipped["properties"][name] == rule, name
    text = Path(skewwatch.schemas.__file__).with_name("features.v1.json").read_text(encoding="utf-8")
    assert text == json.dumps(made, indent=2, ensure_ascii=False) + "\n"


def test_the_feature_vector_declares_the_spec_fields_in_order_with_their_types_and_defaults() -> None:
    declared = dataclasses.fields(FeatureVector)
    assert tuple(f.name for f in declared) == FEATURE_NAMES
    for spec, f in zip(FEATURE_FIELDS, declared, strict=True):
        assert f.type == spec.annotation, spec.name
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        assert has_default == spec.has_default, spec.name
    vector = FeatureVector(model="m", replica=None, window_start=0.0, window_end=60.0, count=0)
    for spec in FEATURE_FIELDS:
        if spec.has_default:
            assert getattr(vector, spec.name) == spec.default(), spec.name


def test_every_field_of_a_default_vector_validates_and_nullable_ones_accept_null() -> None:
    validator = jsonschema.Draft202012Validator(features_schema())
    vector = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=0)
    validator.validate(orjson.loads(encode_features(vector)))
    for spec in FEATURE_FIELDS:
        record = {**orjson.loads(encode_features(vector)), spec.name: None}
        assert validator.is_valid(record) == spec.nullable, spec.name


def _same(a: object, b: object) -> bool:
    """Equal values of one type (a float where the other path gave a numpy scalar would differ)."""
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def test_a_steps_columns_and_each_rows_summary_give_every_declared_field_alike() -> None:
    """The two ways to a vector (a step's columns for every key; one summary, e.g. a model's merged
    one) fill every field of the spec with the same value and type, on windows with every optional
    field sometimes missing."""
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.model_merge import merge_model_features
    from skewwatch.pipeline.window import PartitionWindows, WindowSummary
    from tests.unit.test_window import feed, random_events

    settings = WindowSettings()
    replicas = [("m", "r1"), ("m", "r2"), ("m", "r3"), ("n", "r4")]
    events = random_events(np.random.default_rng(7), 1500, 100.0, 260.0, replicas, batch_missing=0.3)
    steps = feed(PartitionWindows(settings), sorted(events, key=lambda e: e["ts"]), 200)
    assert len(steps) > 50
    for step in steps:
        for name in FEATURE_NAMES:
            column, summary = getattr(step.features, name), getattr(step.summary.features(), name)
            assert _same(column, summary), (name, column, summary)
    # a model's vector (its replicas' summaries merged, then the one-row path): every field of its type
    by_step: dict[tuple[str, float], list[WindowSummary]] = {}
    for step in steps:
        by_step.setdefault((step.summary.model, step.summary.window_end), []).append(step.summary)
    python_types = {"string": str, "number": float, "integer": int, "counts": dict, "version": int}
    for (model, end), summaries in by_step.items():
        vector = merge_model_features(model, end, summaries, settings)
        assert vector.replicas == len(summaries)
        for spec in FEATURE_FIELDS:
            value = getattr(vector, spec.name)
            assert (value is None and spec.nullable) or type(value) is python_types[spec.kind], (spec.name, value)
