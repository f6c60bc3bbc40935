#!/usr/bin/env bash
# Regenerates the README's "Results": bench/results/quality.json + quality_delays.png (detection
# quality of the real worker on labelled faults) and bench/results/routing.json + routing.png (the
# seed's routing table on the fleet simulator, the real worker in the loop for `dynamic`).
#
#   bash scripts/results.sh            # the full suites (~15 min on 2 cores)
#   bash scripts/results.sh --quick    # a smoke run of both (~3 min), written under $TMPDIR instead
#
# Needs Java 17+ and Maven for the embedded Kafka broker (or KAFKA_BOOTSTRAP=host:port of a running one).
set -euo pipefail
cd "$(dirname "$0")/.."
SKEWWATCH_EXTRAS=bench bash scripts/setup.sh
out=bench/results
extra=()
if [ "${1:-}" = "--quick" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/skewwatch-results-XXXXXX")
  extra=(--quick)
fi
.venv/bin/python bench/quality.py "${extra[@]}" --out "$out/quality.json" --plot "$out/quality_delays.png"
.venv/bin/python bench/routing.py "${extra[@]}" --out "$out/routing.json" --plot "$out/routing.png"
echo "results in $out"
