"""The package as of an earlier git revision, for benchmarks that run it beside the working tree.

A benchmark's ``--baseline REV`` extracts ``skewwatch/`` of ``REV`` (``git archive``) and runs it in a
child process with that copy first on ``PYTHONPATH``, so the old code runs whole (every module of
its revision, not one file against the current tree's others) while the parent interleaves its rounds with the
current tree's.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def baseline_package(rev: str, into: Path) -> Path:
    """``skewwatch/`` as of git revision ``rev``, extracted under ``into`` (returned: the path entry)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "skewwatch"], check=True,
                             capture_output=True).stdout
    path = into / "baseline.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    path.unlink()
    return into


def child_env(package: Path | None) -> dict[str, str]:
    """The environment of a child that imports ``skewwatch`` from ``package`` (None: the working tree)."""
    first = str(package if package is not None else REPO)
    rest = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=first if not rest else f"{first}{os.pathsep}{rest}")
