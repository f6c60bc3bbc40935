#!/usr/bin/env bash
# Regenerates the README's "Results": bench/results/quality.json + quality_delays.png (detection
# quality of the real worker on labelled faults, every traffic shape, fit/holdout split) and
# bench/results/routing.json + routing.png + routing_mooncake.png (the seed's routing table on the
# fleet simulator, conv and mooncake traces, the real worker in the loop for the dynamic policies).
#
#   bash scripts/results.sh            # the full suites through the real worker (~1.5 h on 2 cores)
#   bash scripts/results.sh --fast     # quality in-process (minutes), routing as in the full run
#   bash scripts/results.sh --quick    # a smoke run of both (~3 min), written under $TMPDIR instead
#
# Needs Java 17+ and Maven for the embedded Kafka broker (or KAFKA_BOOTSTRAP=host:port of a running one).
set -euo pipefail
cd "$(dirname "$0")/.."
SKEWWATCH_EXTRAS=bench bash scripts/setup.sh
out=bench/results
quality=(--mode worker)
routing=()
case "${1:-}" in
  --quick)
    out=$(mktemp -d "${TMPDIR:-/tmp}/skewwatch-results-XXXXXX")
    quality=(--quick)
    routing=(--quick);;
  --fast)
    quality=(--mode fast);;
  "") ;;
  *) echo "usage: bash scripts/results.sh [--fast | --quick]" >&2; exit 2;;
esac
.venv/bin/python bench/quality.py "${quality[@]}" --out "$out/quality.json" --plot "$out/quality_delays.png"
.venv/bin/python bench/routing.py "${routing[@]}" --out "$out/routing.json" --plot "$out/routing.png"
echo "results in $out"
