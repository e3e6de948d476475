#!/usr/bin/env bash
# Prepare what bench/gpu/run.sh needs on a GPU machine that reaches no network.
# Run HERE (a machine with PyPI), in the repository root:  bash bench/gpu/prepare.sh
# It fills .gpu/ (git-ignored; carried to the device with `carry: [".gpu"]`, < 40 MiB):
#   .gpu/llama.cpp/           llama.cpp's sources from the llama-cpp-python sdist corral pins,
#                             stripped to what a CPU or CUDA build needs (no models, docs, tests,
#                             other GPU backends, web UI)
#   .gpu/llama_cpp/           llama-cpp-python's Python package (its ctypes bindings; the
#                             libraries are built on the device and copied into lib/)
#   .gpu/gguf-py/             llama.cpp's GGUF writer (makes a random-weight model there)
#   .gpu/wheels/              wheels (CPython 3.12, manylinux x86-64) of corral's dependencies
#                             that the device's image lacks
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
DEST=.gpu
SDIST_DIR=${CORRAL_BENCH_CACHE:-$HOME/.cache/corral-bench}/sdist
mkdir -p "$SDIST_DIR"
if ! ls "$SDIST_DIR"/llama_cpp_python-"$VERSION".tar.gz >/dev/null 2>&1; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$SDIST_DIR"
fi
rm -rf "$DEST" && mkdir -p "$DEST/wheels"
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
tmp=$(mktemp -d)
tar xzf "$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$VERSION"
cp -r "$src/llama_cpp" "$DEST/llama_cpp"
rm -rf "$DEST/llama_cpp/server" "$DEST/llama_cpp/lib"
L="$src/vendor/llama.cpp"
cp -r "$L/gguf-py" "$DEST/gguf-py"
mkdir -p "$DEST/llama.cpp"
for d in CMakeLists.txt cmake common src include ggml vendor tools scripts licenses LICENSE; do
  [ -e "$L/$d" ] && cp -r "$L/$d" "$DEST/llama.cpp/"
done
# a CPU or CUDA build needs none of these
( cd "$DEST/llama.cpp/ggml/src" && rm -rf ggml-metal ggml-hexagon ggml-sycl ggml-vulkan ggml-opencl ggml-et \
    ggml-cann ggml-musa ggml-hip ggml-webgpu ggml-zdnn ggml-rpc/*.md ggml-openvino 2>/dev/null || true )
( cd "$DEST/llama.cpp/tools" && for t in *; do case "$t" in server|mtmd|ui|CMakeLists.txt) ;; *) rm -rf "$t";; esac; done )
# the tools kept: llama-server (with its ui target) and libmtmd (the bindings load it)
cat > "$DEST/llama.cpp/tools/CMakeLists.txt" <<'CMAKE'
find_package(Threads REQUIRED)
llama_add_compile_flags()
if (LLAMA_BUILD_SERVER)
    add_subdirectory(ui)
    add_subdirectory(server)
endif()
add_subdirectory(mtmd)
CMAKE
rm -rf "$DEST/llama.cpp/tools/server/public" "$DEST/llama.cpp/tools/server/webui" "$DEST/llama.cpp/tools/server/tests"
rm -rf "$tmp"
# wheels the device image lacks (its list: the device tool's KINDS.md); pure-Python ones are any-platform
# the versions this venv resolved (pydantic and pydantic-core must match each other)
PINS=$("$PY" -m pip freeze 2>/dev/null | grep -i -E '^(fastapi|starlette|uvicorn|httptools|msgspec|pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|diskcache|sniffio|pytest[-_]asyncio)==' || true)
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST/wheels" $PINS diskcache
du -sh "$DEST" "$DEST"/*
echo "prepared $DEST; on the device: bash bench/gpu/run.sh (carry .gpu)"
