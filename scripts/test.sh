#!/usr/bin/env bash
# The whole test suite: installs what it needs (.venv), fetches Apache Kafka from Maven Central
# (cached), and runs pytest; tests/conftest.py starts the broker on loopback, once per run.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -c "from skewwatch.broker import ensure_kafka_jars; ensure_kafka_jars()"  # fetch Kafka once, outside test timeouts
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
