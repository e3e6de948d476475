#!/usr/bin/env bash
# Build llama-cpp-python, at the version pyproject.toml pins, for one GPU backend, once per machine:
# the wheel lands in $CORRAL_GPU_CACHE/whl/<backend>-<version>/ (default ~/.cache/corral-gpu, outside
# the checkout, where pip keeps the CPU wheel: a fresh clone in CI finds it) and is reused from there
# by path. pip's wheel cache does not key on CMAKE_ARGS, so it is never read or written here
# (--no-cache-dir, --no-binary).
# Usage: bench/gpu/build_wheel.sh BACKEND    (vulkan | cuda); prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
BACKEND=${1:?usage: build_wheel.sh vulkan|cuda}
PY=${PY:-.venv/bin/python}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
CACHE=${CORRAL_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral-gpu}
OUT=$CACHE/whl/$BACKEND-$VERSION
wheel() { ls "$OUT"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -1; }
if [ -n "$(wheel)" ]; then wheel; exit 0; fi
case "$BACKEND" in
  vulkan)
    bench/gpu/vulkan_debs.sh "$CACHE/vulkan" >&2
    # shellcheck source=/dev/null
    . "$CACHE/vulkan/env.sh"
    GL=$CACHE/vulkan/usr
    CMAKE_ARGS="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$GL/include -DCMAKE_PREFIX_PATH=$GL"
    CMAKE_ARGS+=" -DVulkan_LIBRARY=$GL/lib/x86_64-linux-gnu/libvulkan.so -DVulkan_GLSLC_EXECUTABLE=$GL/bin/glslc"
    ;;
  cuda) CMAKE_ARGS="-DGGML_CUDA=on" ;;
  *) echo "build_wheel.sh: unknown backend '$BACKEND' (vulkan or cuda)" >&2; exit 2 ;;
esac
export CMAKE_ARGS
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
rm -rf "$OUT.partial" && mkdir -p "$OUT.partial"
echo "building llama-cpp-python $VERSION for $BACKEND (CMAKE_ARGS=$CMAKE_ARGS); log: $OUT.log" >&2
start=$(date +%s)
nice "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$OUT.partial" \
  "llama-cpp-python==$VERSION" > "$OUT.log" 2>&1 || { tail -40 "$OUT.log" >&2; exit 1; }
echo "built in $(( $(date +%s) - start )) s" >> "$OUT.log"
rm -rf "$OUT" && mv "$OUT.partial" "$OUT"
wheel
