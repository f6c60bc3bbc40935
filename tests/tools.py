"""Where the external tools the tests drive live: built by scripts/tools.sh into ~/.cache/skewwatch.

A test that needs one that is missing FAILS with the command that installs it: a skip would hide a
broken set-up (scripts/test.sh runs scripts/tools.sh before pytest).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SKEWWATCH_CACHE", Path.home() / ".cache" / "skewwatch"))
_VERSION_VARS = {"promtool": "PROMETHEUS_VERSION", "prometheus": "PROMETHEUS_VERSION",
                 "alertmanager": "ALERTMANAGER_VERSION", "helm": "HELM_VERSION"}


def tool_version(name: str) -> str:
    """The version scripts/tools.sh pins for ``name``."""
    text = (ROOT / "scripts" / "tools.sh").read_text()
    match = re.search(rf"^{_VERSION_VARS[name]}=(\S+)", text, re.M)
    assert match, f"scripts/tools.sh pins no {_VERSION_VARS[name]}"
    return match.group(1)


def tool(name: str) -> Path:
    """The path of ``name`` (promtool, prometheus, alertmanager, helm, k8s-validate, haproxy), or fail the test."""
    if name == "k8s-validate":
        source = ROOT / "tools" / "k8s-validate"
        digest = hashlib.sha1(b"".join((source / f).read_bytes() for f in ("go.mod", "go.sum", "main.go")))
        candidate = CACHE / "tools" / f"k8s-validate-{digest.hexdigest()[:12]}" / name
    elif name == "haproxy":
        found = shutil.which("haproxy")
        candidate = Path(found) if found else CACHE / "haproxy" / "bin" / "haproxy"
    else:
        candidate = CACHE / "tools" / f"{name}-{tool_version(name)}" / name
    if not os.access(candidate, os.X_OK):
        pytest.fail(f"{name} is not installed ({candidate} missing): run `bash scripts/tools.sh {name}` "
                    "(scripts/test.sh does)", pytrace=False)
    return candidate
