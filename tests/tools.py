"""Where the external tools the tests drive live: built by scripts/tools.sh (and the llama.cpp engine and
its model by scripts/engines.sh) into ~/.cache/skewwatch.

A test that needs one that is missing FAILS with the command that installs it: a skip would hide a
broken set-up (scripts/test.sh runs scripts/tools.sh and scripts/engines.sh before pytest).
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
# name -> (the script that installs it, the variable there that pins its version)
_VERSION_VARS = {"promtool": ("tools.sh", "PROMETHEUS_VERSION"), "prometheus": ("tools.sh", "PROMETHEUS_VERSION"),
                 "alertmanager": ("tools.sh", "ALERTMANAGER_VERSION"), "helm": ("tools.sh", "HELM_VERSION"),
                 "llama-server": ("engines.sh", "LLAMA_CPP_PYTHON_VERSION"),
                 "smollm2": ("engines.sh", "SMOLLM2_VERSION")}
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def tool_version(name: str) -> str:
    """The version scripts/tools.sh (or scripts/engines.sh) pins for ``name``."""
    script, variable = _VERSION_VARS[name]
    text = (ROOT / "scripts" / script).read_text()
    match = re.search(rf"^{variable}=(\S+)", text, re.M)
    assert match, f"scripts/{script} pins no {variable}"
    return match.group(1)


def _installs(name: str) -> str:
    script = _VERSION_VARS.get(name, ("tools.sh", ""))[0]
    return f"bash scripts/{script} {name}"


def tool(name: str) -> Path:
    """The path of ``name`` (promtool, prometheus, alertmanager, helm, k8s-validate, haproxy, llama-server), or
    fail the test."""
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
        pytest.fail(f"{name} is not installed ({candidate} missing): run `{_installs(name)}` "
                    "(scripts/test.sh does)", pytrace=False)
    return candidate


def smollm2_model() -> Path:
    """The GGUF model llama-server serves in the tests (SmolLM2-135M-Instruct, Q4_1), or fail the test."""
    candidate = CACHE / "tools" / f"smollm2-{tool_version('smollm2')}" / SMOLLM2_FILE
    if not candidate.is_file() or candidate.stat().st_size == 0:
        pytest.fail(f"the smollm2 model is not installed ({candidate} missing): run `{_installs('smollm2')}` "
                    "(scripts/test.sh does)", pytrace=False)
    return candidate
