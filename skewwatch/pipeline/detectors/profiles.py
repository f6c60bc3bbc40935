"""Detector profiles: named sets of defaults under which a user's own settings apply.

* ``default``: every rule judges only with enough evidence, against the replica's peers or its own
  past, with a bounded false-alarm probability (docs/detectors.md). The detectors' ``Config``
  defaults *are* this profile.
* ``seed``: the original design's rules as written (P99 > 3 x P50 for 3 steps, std(batch) > 2 with
  fill < 30 %, variance growth > 400 % on prompts above 2,048 tokens, KV hit rate < 0.65 / > 0.85),
  for comparison and for fleets that want them; ``bench/quality.py`` measures both profiles side
  by side across traffic shapes (the README's Results). Each detector module states its seed values beside its rules
  (``PROFILE_SEED``).

Select one with ``[detectors] profile = "seed"`` in the TOML file,
``SKEWWATCH_DETECTORS__PROFILE=seed`` or ``skewwatch worker --profile seed``; keys set in
``[detectors.<name>]`` still win over the profile's.

>>> with_profile({"profile": "seed", "long_tail": {"ratio": 4}})["long_tail"]["ratio"]
4
>>> with_profile({"profile": "seed"})["long_tail"]["seed_rule"]
True
>>> with_profile({"long_tail": {"ratio": 4}})
{'long_tail': {'ratio': 4}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from skewwatch.pipeline.detectors.batch_collapse import PROFILE_SEED as BATCH_COLLAPSE_SEED
from skewwatch.pipeline.detectors.context_burst import PROFILE_SEED as CONTEXT_BURST_SEED
from skewwatch.pipeline.detectors.kv_pressure import PROFILE_SEED as KV_PRESSURE_SEED
from skewwatch.pipeline.detectors.long_tail_config import PROFILE_SEED as LONG_TAIL_SEED
from skewwatch.pipeline.detectors.slow_replica import PROFILE_SEED as SLOW_REPLICA_SEED

PROFILE_KEY = "profile"  # the [detectors] key that names the profile
ProfileName = Literal["default", "seed"]

PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "default": {},
    "seed": {
        "long_tail": LONG_TAIL_SEED,
        "slow_replica": SLOW_REPLICA_SEED,  # the seed had no such rule: off
        "batch_collapse": BATCH_COLLAPSE_SEED,
        "context_burst": CONTEXT_BURST_SEED,
        "kv_pressure": KV_PRESSURE_SEED,
        # the seed's weights: its formula alone (an open alert does not move them, nor a replica's speed)
        "weights": {"formula": "seed", "demote_on_alert": False, "relative_speed": False},
    },
}


def with_profile(detectors: Mapping[str, Any], sources: dict[tuple[str, ...], str] | None = None,
                 path: tuple[str, ...] = ()) -> dict[str, Any]:
    """The raw ``[detectors]`` table with its profile's values beneath the user's own; an unknown
    profile name is left for the settings' check to refuse. ``sources`` (key path -> where its value
    came from) records the profile's values as ``profile <name>``, under ``path``."""
    name = detectors.get(PROFILE_KEY)
    merged: dict[str, Any] = {key: dict(value) if isinstance(value, Mapping) else value
                              for key, value in detectors.items()}
    profile = PROFILES.get(name.strip().lower()) if isinstance(name, str) else None
    for section, values in (profile or {}).items():
        table = merged.get(section)
        if table is not None and not isinstance(table, dict):
            continue  # not a table: the settings' check names it
        own = table or {}
        merged[section] = {**values, **own}
        if sources is not None:
            for key in values.keys() - own.keys():
                sources[(*path, section, key)] = f"profile {name}"
    return merged


__all__ = ["PROFILES", "PROFILE_KEY", "ProfileName", "with_profile"]
