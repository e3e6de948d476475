#!/usr/bin/env bash
# Install a GPU build of llama-cpp-python's libraries beside the CPU one (`make install BACKEND=...`):
# the wheel bench/gpu/build_wheel.sh built once per machine, its llama_cpp/lib/ unpacked into DEST,
# and DEST/env.sh, which a shell sources to run workers on that build. The venv's own llama_cpp
# (the CPU build the test suite uses) is left as it is: the bindings load libllama (and so ggml)
# from LLAMA_CPP_LIB_PATH, libmtmd from MTMD_CPP_LIB, and corral's device API follows the same
# variable (src/corral/worker/host/devices.py).
# Vulkan on a machine without a Vulkan driver (no ICD manifest under /usr/share/vulkan or
# /etc/vulkan; LAVAPIPE=1 forces it): Mesa's lavapipe from ~/.cache/corral-gpu/vulkan (bench/gpu/vulkan_debs.sh), a
# CPU-type device that ggml uses only when GGML_VK_VISIBLE_DEVICES names it.
# Usage: bench/gpu/install_backend.sh BACKEND DEST
set -euo pipefail
cd "$(dirname "$0")/../.."
BACKEND=${1:?usage: install_backend.sh vulkan|cuda DEST}
DEST=$(realpath -m "${2:?usage: install_backend.sh vulkan|cuda DEST}")
WHEEL=$(bench/gpu/build_wheel.sh "$BACKEND")
CACHE=${CORRAL_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral-gpu}
rm -rf "$DEST" && mkdir -p "$DEST"
"${PY:-.venv/bin/python}" - "$WHEEL" "$DEST/lib" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
dest.mkdir(parents=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("llama_cpp/lib/") and not name.endswith("/"):
            (dest / name.rsplit("/", 1)[1]).write_bytes(z.read(name))
for p in dest.iterdir():
    p.chmod(0o755)
PY
{
  echo "# llama-cpp-python's $BACKEND build ($(basename "$WHEEL")), written by bench/gpu/install_backend.sh"
  echo "export CORRAL_BACKEND=$BACKEND"
  echo "export LLAMA_CPP_LIB_PATH=$DEST/lib MTMD_CPP_LIB=$DEST/lib"
} > "$DEST/env.sh"
if [ "$BACKEND" = vulkan ]; then
  lavapipe=${LAVAPIPE:-auto}
  if [ "$lavapipe" = auto ]; then
    lavapipe=1
    ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1 && lavapipe=0
  fi
  if [ "$lavapipe" = 1 ]; then
    bench/gpu/vulkan_debs.sh "$CACHE/vulkan" >&2
    echo "# no Vulkan driver here: Mesa's lavapipe (a CPU-type device) from $CACHE/vulkan" >> "$DEST/env.sh"
    cat "$CACHE/vulkan/env.sh" >> "$DEST/env.sh"
  elif ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
    echo "export LD_LIBRARY_PATH=\"$CACHE/vulkan/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" >> "$DEST/env.sh"
  fi
fi
echo "installed the $BACKEND build in $DEST (source $DEST/env.sh to use it)"
