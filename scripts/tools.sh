#!/usr/bin/env bash
# Builds the external tools the tests drive, from their Go modules, into ~/.cache/skewwatch/tools
# (one folder per tool and version; a second run finds them and builds nothing):
#   promtool, prometheus   github.com/prometheus/prometheus   (rules and dashboard queries)
#   alertmanager           github.com/prometheus/alertmanager (the Alertmanager bridge's peer)
#   helm                   helm.sh/helm/v4                    (chart lint and render)
#   k8s-validate           tools/k8s-validate (client-go)     (rendered manifests vs the Kubernetes API types)
# and fetches HAProxy from Debian's packages (scripts/haproxy.sh). Needs the Go toolchain; the module
# proxy is the only network it uses. Usage: scripts/tools.sh [TOOL...]  (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SKEWWATCH_CACHE:-$HOME/.cache/skewwatch}
PROMETHEUS_VERSION=v0.316.0     # the Go module's version of Prometheus 3.16
ALERTMANAGER_VERSION=v0.35.0
HELM_VERSION=v4.3.2
# the Go toolchain's usual place when it is not on PATH (a login shell adds it, CI's environment may not)
command -v go >/dev/null || { [ -x /usr/local/go/bin/go ] && PATH="$PATH:/usr/local/go/bin"; }
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

build_alertmanager() {
  # Alertmanager's web UI is built with npm and embedded from ui/app/dist, which its Go module does not
  # ship: build from a copy of the module with an empty placeholder UI (the v2 API, all the tests
  # use, is unaffected).
  local version=$ALERTMANAGER_VERSION dir="$CACHE/tools/alertmanager-$ALERTMANAGER_VERSION"
  if [ -x "$dir/alertmanager" ]; then return 0; fi
  if ! command -v go >/dev/null; then
    echo "tools.sh: building alertmanager needs the Go toolchain (go) on PATH" >&2; return 1
  fi
  local start=$SECONDS src work
  echo "tools.sh: building alertmanager $version from github.com/prometheus/alertmanager (cached in $dir)" >&2
  src=$(go mod download -json "github.com/prometheus/alertmanager@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d)
  cp -r "$src/." "$work/"; chmod -R u+w "$work"
  for ui in elm mantine; do
    mkdir -p "$work/ui/app/dist/$ui"
    echo "<html><body>Alertmanager built without its web UI; use the API under /api/v2/.</body></html>" \
      > "$work/ui/app/dist/$ui/index.html"
  done
  mkdir -p "$dir.tmp"
  (cd "$work" && nice -n 5 go build -ldflags=-s -o "$dir.tmp/alertmanager" ./cmd/alertmanager)
  rm -rf "$work" "$dir"; mv "$dir.tmp" "$dir"
  echo "tools.sh: built alertmanager in $((SECONDS - start)) s" >&2
}

build_k8s_validate() {
  # tools/k8s-validate: the rendered chart checked against the Kubernetes API's Go types (strict decoding)
  local hash dir
  hash=$(cat tools/k8s-validate/go.mod tools/k8s-validate/go.sum tools/k8s-validate/main.go | sha1sum | cut -c1-12)
  dir="$CACHE/tools/k8s-validate-$hash"
  if [ -x "$dir/k8s-validate" ]; then return 0; fi
  local start=$SECONDS
  echo "tools.sh: building k8s-validate (cached in $dir)" >&2
  mkdir -p "$dir.tmp"
  (cd tools/k8s-validate && nice -n 5 go build -ldflags=-s -o "$dir.tmp/k8s-validate" .)
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  echo "tools.sh: built k8s-validate in $((SECONDS - start)) s" >&2
}

want=${*:-promtool prometheus alertmanager helm k8s-validate haproxy}
for tool in $want; do
  case $tool in
    promtool)     build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" ;;
    prometheus)   build prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION" ;;
    alertmanager) build_alertmanager ;;
    helm)         build helm helm.sh/helm/v4/cmd/helm "$HELM_VERSION" ;;
    k8s-validate) build_k8s_validate ;;
    haproxy)      bash scripts/haproxy.sh >/dev/null ;;
    *) echo "tools.sh: unknown tool $tool" >&2; exit 2 ;;
  esac
done
