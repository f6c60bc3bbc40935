#!/usr/bin/env bash
# Creates .venv and installs skewwatch with its test extras. Idempotent: re-running only
# installs what changed. Java 17+ and Maven are needed later, by `skewwatch broker`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "skewwatch needs Python >= 3.11 (found: $("$PY" --version 2>&1 || echo none)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.installed-$( (cat pyproject.toml; echo "${SKEWWATCH_EXTRAS:-}") | sha1sum | cut -c1-12)  # extras asked for count too
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test${SKEWWATCH_EXTRAS:+,$SKEWWATCH_EXTRAS}]"
  rm -f .venv/.installed-*; touch "$stamp"
fi
