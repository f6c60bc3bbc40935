#!/usr/bin/env bash
# The demo: installs what it needs (.venv), starts a real Kafka broker, a worker and the
# generator, and shows the feature vectors live. Ctrl-C stops everything.
# Options go to `skewwatch demo` (e.g. --duration 60, --inject "long_tail --replica llama-70b-0 --at 30 --for 90").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/skewwatch demo "$@"
