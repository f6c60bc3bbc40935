"""The feature vector is declared once (``schemas/feature_spec.py``): the shipped JSON Schema, the
``FeatureVector`` dataclass and the windows' feature columns all say what ``FEATURE_FIELDS`` say."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
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
