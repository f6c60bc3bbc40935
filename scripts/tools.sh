#!/usr/bin/env bash
# Builds the external tools the tests drive, from their Go modules, into ~/.cache/skewwatch/tools
# (one folder per tool and version; a second run finds them and builds nothing):
#   promtool, prometheus   github.com/prometheus/prometheus   (rules and dashboard queries)
#   alertmanager           github.com/prometheus/alertmanager (the Alertmanager bridge's peer)
#   helm                   helm.sh/helm/v4                    (chart lint and render)
# and fetches HAProxy from Debian's packages (scripts/haproxy.sh). Needs the Go toolchain; the module
# proxy is the only network it uses. Usage: scripts/tools.sh [TOOL...]  (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SKEWWATCH_CACHE:-$HOME/.cache/skewwatch}
PROMETHEUS_VERSION=v0.316.0     # the Go module's version of Prometheus 3.16
ALERTMANAGER_VERSION=v0.35.0
HELM_VERSION=v4.3.2
export GOPATH="$CACHE/go" GOCACHE="$CACHE/go/build-cache" GOMODCACHE="$CACHE/go/pkg/mod"
export GOFLAGS="-mod=mod -trimpath -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0

build() {  # build NAME MODULE_PACKAGE VERSION
  local name=$1 pkg=$2 version=$3 dir="$CACHE/tools/$1-$3"
  if [ -x "$dir/$name" ]; then return 0; fi
  if ! command -v go >/dev/null; then
    echo "tools.sh: building $name needs the Go toolchain (go) on PATH" >&2; return 1
  fi
  local start=$SECONDS
  echo "tools.sh: building $name $version from $pkg (cached in $dir)" >&2
  mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" nice -n 5 go install -ldflags=-s "$pkg@$version"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  echo "tools.sh: built $name in $((SECONDS - start)) s" >&2
}

want=${*:-promtool prometheus alertmanager helm haproxy}
for tool in $want; do
  case $tool in
    promtool)     build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" ;;
    prometheus)   build prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION" ;;
    alertmanager) build alertmanager github.com/prometheus/alertmanager/cmd/alertmanager "$ALERTMANAGER_VERSION" ;;
    helm)         build helm helm.sh/helm/v4/cmd/helm "$HELM_VERSION" ;;
    haproxy)      bash scripts/haproxy.sh ;;
    *) echo "tools.sh: unknown tool $tool" >&2; exit 2 ;;
  esac
done
