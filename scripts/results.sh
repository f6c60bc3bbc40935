#!/usr/bin/env bash
# Regenerates the README's "Results": bench/results/quality.json + quality_delays.png (detection
# quality of the real worker on labelled faults, every traffic shape, fit/holdout split) and
# bench/results/routing.json + routing.png + routing_mooncake.png (the seed's routing table on the
# fleet simulator, conv and mooncake traces, the real worker in the loop for the dynamic policies),
# and bench/results/real_loop.json + real_loop.png (llama.cpp replicas behind HAProxy, real faults, the
# corrections applied against HAProxy alone: ~1 h of wall time, it runs in real time).
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
real=(--rate 2.0)
case "${1:-}" in
  --quick)
    out=$(mktemp -d "${TMPDIR:-/tmp}/skewwatch-results-XXXXXX")
    quality=(--quick)
    routing=(--quick)
    real=(--fault throttle --policy leastconn --policy leastconn+skewwatch --warmup-s 45 --fault-for 60 --after-s 30);;
  --fast)
    quality=(--mode fast);;
  "") ;;
  *) echo "usage: bash scripts/results.sh [--fast | --quick]" >&2; exit 2;;
esac
.venv/bin/python bench/quality.py "${quality[@]}" --out "$out/quality.json" --plot "$out/quality_delays.png"
.venv/bin/python bench/routing.py "${routing[@]}" --out "$out/routing.json" --plot "$out/routing.png"
bash scripts/engines.sh && bash scripts/haproxy.sh >/dev/null  # llama-server, its model, HAProxy (cached)
.venv/bin/python bench/real_loop.py "${real[@]}" --out "$out/real_loop.json" --plot "$out/real_loop.png"
echo "results in $out"
