"""Print the runtime dependency closure of the installed skewwatch as pip constraints (docker/constraints.txt).

Run with the project's venv: ``.venv/bin/python scripts/lock_runtime.py > docker/constraints.txt``.
Test extras are left out: the image installs only what skewwatch needs to run.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re

from packaging.requirements import Requirement

HEADER = """\
# The runtime dependency closure of skewwatch at the versions its tests run with; docker/Dockerfile
# installs exactly these (pip --constraint). Regenerate after changing pyproject.toml's dependencies:
#   .venv/bin/python scripts/lock_runtime.py > docker/constraints.txt"""


def closure(name: str, seen: dict[str, str]) -> None:
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:  # a dependency for another platform or Python
        return
    seen[key] = dist.version
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            closure(requirement.name, seen)


def main() -> None:
    seen: dict[str, str] = {}
    closure("skewwatch", seen)
    seen.pop("skewwatch")
    print(HEADER)
    for name, version in sorted(seen.items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
