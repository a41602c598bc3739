#!/usr/bin/env bash
# Build (once per machine) llama.cpp's CPU binaries from the sources vendored in the PyPI
# sdist llama-cpp-python==0.3.36, for tests/interop/test_llamacpp_*.py and
# `dspark bench llamacpp`. Idempotent: a build whose ready marker names this sdist's sha256
# and whose binaries run is reused as is. Release, CPU only, static, no tests/examples
# beyond the targets listed; more targets as arguments (`bash .ci/llamacpp_build.sh llama-server`:
# CI does not build the server, which would add minutes). -DGGML_NATIVE=ON because the cache is
# per machine. Ninja when present, make otherwise.
# Prints the bin directory on its last line.
set -euo pipefail
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ROOT="${DSPARK_LLAMACPP_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark/llama.cpp-$VERSION}"
BIN="$ROOT/build/bin"
MARKER="$ROOT/.dspark-ready"
TARGETS=(llama-completion llama-speculative-simple llama-bench llama-quantize llama-tokenize "$@")
ready() {
  [[ -f "$MARKER" ]] && grep -qx "$SHA256" "$MARKER" || return 1
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || return 1; done
  "$BIN/llama-completion" --version >/dev/null 2>&1
}
if ready; then
  echo "llama.cpp: reusing $BIN" >&2
  echo "$BIN"
  exit 0
fi
started=$(date +%s)
mkdir -p "$ROOT"
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
if ! echo "$SHA256  $SDIST" | sha256sum -c --status 2>/dev/null; then
  pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$ROOT" >&2
  echo "$SHA256  $SDIST" | sha256sum -c --status
fi
if [[ ! -f "$ROOT/src/CMakeLists.txt" ]]; then
  rm -rf "$ROOT/src" "$ROOT/unpack"
  mkdir -p "$ROOT/unpack"
  tar xzf "$SDIST" -C "$ROOT/unpack" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  mv "$ROOT/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp" "$ROOT/src"
  rm -rf "$ROOT/unpack"
fi
JOBS="$(nproc)"
GENERATOR=()
if [[ ! -f "$ROOT/build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
cmake -S "$ROOT/src" -B "$ROOT/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF >&2
cmake --build "$ROOT/build" -j "$JOBS" --target "${TARGETS[@]}" >&2
echo "$SHA256" > "$MARKER"
ready
echo "llama.cpp: built $BIN in $(( $(date +%s) - started )) s" >&2
echo "$BIN"
