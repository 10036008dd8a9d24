#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the llama.cpp sources that the
# PyPI sdist of llama-cpp-python vendors under vendor/llama.cpp.
#
#   bash benchmarks/llama_cpp/build.sh          # -> prints the binary's path last
#
# Everything goes into <repo>/.llama.cpp/ (it carries its own .gitignore "*"):
#   dl/      the pinned sdist (sha256-checked)
#   src/     vendor/llama.cpp unpacked from it
#   build/   the cmake build tree
#   bin/llama-server, BUILD_INFO
# Idempotent: each step is skipped when its stamp matches the pinned inputs.
#
# Environment knobs (all optional):
#   LLAMA_CPP_JOBS     parallel compile jobs            (default 2)
#   LLAMA_CPP_NATIVE   ON/OFF for -DGGML_NATIVE          (default ON)
#   LLAMA_CPP_SDIST    path to an already-downloaded llama_cpp_python-<ver>.tar.gz
#   LLAMA_CPP_DIR      output folder                     (default <repo>/.llama.cpp)
set -euo pipefail

# ---- pins -------------------------------------------------------------------
PKG=llama-cpp-python
PKG_VERSION=0.3.36
SDIST=llama_cpp_python-${PKG_VERSION}.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# llama-cpp-python 0.3.36's CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098"
# = upstream build b11312, commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f (2026-10-01).
LLAMA_BUILD_NUMBER=11312
LLAMA_BUILD_COMMIT=0c1e57098

JOBS=${LLAMA_CPP_JOBS:-2}
NATIVE=${LLAMA_CPP_NATIVE:-ON}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${LLAMA_CPP_DIR:-$ROOT/.llama.cpp}
DL=$OUT/dl
SRC=$OUT/src
BUILD=$OUT/build
BIN=$OUT/bin/llama-server

CMAKE_ARGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF          # one self-contained binary
  -DGGML_NATIVE="$NATIVE"
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF
  -DLLAMA_OPENSSL=OFF              # no HTTPS client (model download); CURL is gone upstream
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF   # no npm, no UI download: server runs without web UI
  -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER"
  -DLLAMA_BUILD_COMMIT="$LLAMA_BUILD_COMMIT"
)
KEY="$PKG==$PKG_VERSION $SDIST_SHA256 ${CMAKE_ARGS[*]}"

log() { echo "[llama.cpp build] $*" >&2; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

for tool in cmake c++ tar sha256sum; do
  command -v "$tool" >/dev/null || { log "missing tool: $tool"; exit 1; }
done

mkdir -p "$OUT"
[ -f "$OUT/.gitignore" ] || echo '*' >"$OUT/.gitignore"

if [ -x "$BIN" ] && [ -f "$OUT/.stamp-bin" ] && [ "$(cat "$OUT/.stamp-bin")" = "$KEY" ]; then
  log "already built ($PKG $PKG_VERSION, llama.cpp b$LLAMA_BUILD_NUMBER)"
  echo "$BIN"
  exit 0
fi

# ---- 1. the pinned sdist --------------------------------------------------------
mkdir -p "$DL"
if [ -n "${LLAMA_CPP_SDIST:-}" ] && [ ! -f "$DL/$SDIST" ]; then
  cp "$LLAMA_CPP_SDIST" "$DL/$SDIST"
fi
if [ -f "$DL/$SDIST" ] && [ "$(sha_of "$DL/$SDIST")" != "$SDIST_SHA256" ]; then
  log "removing $DL/$SDIST: sha256 mismatch"
  rm -f "$DL/$SDIST"
fi
if [ ! -f "$DL/$SDIST" ]; then
  log "downloading $PKG==$PKG_VERSION sdist from PyPI"
  # pip prepares the sdist's metadata (an isolated scikit-build-core env, ~1 min);
  # nothing is installed and nothing is compiled by this step.
  python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
    -d "$DL" "$PKG==$PKG_VERSION" >&2
fi
got=$(sha_of "$DL/$SDIST")
if [ "$got" != "$SDIST_SHA256" ]; then
  log "sha256 mismatch for $SDIST: got $got, want $SDIST_SHA256"
  exit 1
fi

# ---- 2. unpack vendor/llama.cpp -------------------------------------------------
if [ ! -f "$SRC/.stamp" ] || [ "$(cat "$SRC/.stamp")" != "$SDIST_SHA256" ]; then
  log "unpacking vendor/llama.cpp into $SRC"
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar -xzf "$DL/$SDIST" -C "$SRC" --strip-components=3 \
    "llama_cpp_python-${PKG_VERSION}/vendor/llama.cpp"
  test -f "$SRC/tools/server/server.cpp" || { log "no tools/server in the sdist"; exit 1; }
  echo "$SDIST_SHA256" >"$SRC/.stamp"
fi

# ---- 3. cmake configure + build (only the llama-server target) -------------------
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD/.stamp-configure" ] || [ "$(cat "$BUILD/.stamp-configure")" != "$KEY" ]; then
  log "configuring: ${CMAKE_ARGS[*]}"
  rm -rf "$BUILD"
  cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${CMAKE_ARGS[@]}" >&2
  echo "$KEY" >"$BUILD/.stamp-configure"
fi
log "building llama-server with -j$JOBS"
start=$(date +%s)
cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2
secs=$(( $(date +%s) - start ))

mkdir -p "$OUT/bin"
cp -f "$BUILD/bin/llama-server" "$BIN"
{
  echo "package: $PKG==$PKG_VERSION ($SDIST sha256 $SDIST_SHA256)"
  echo "llama.cpp: b$LLAMA_BUILD_NUMBER commit $LLAMA_BUILD_COMMIT (0c1e57098bba43ac29e6e3b677cdceebdd22334f)"
  echo "cmake args: ${CMAKE_ARGS[*]}"
  echo "build seconds (this run, -j$JOBS): $secs"
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$OUT/BUILD_INFO"
echo "$KEY" >"$OUT/.stamp-bin"
log "built in ${secs}s"
echo "$BIN"
