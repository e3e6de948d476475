#!/usr/bin/env bash
# Fetch and unpack what the Vulkan backend needs on Debian 12, into a private prefix (default
# ~/.cache/corral-gpu/vulkan: $CORRAL_GPU_CACHE/vulkan, as bench/gpu/build_wheel.sh passes it),
# without touching the machine's own apt sources or dpkg database:
#   - Debian 13's libvulkan-dev 1.4.309 headers (the vendored llama.cpp needs vk::LayerSettingEXT,
#     which Debian 12's 1.3.239 headers lack) and Debian 12's loader, libvulkan1 (13's needs glibc 2.38),
#   - Debian 13's spirv-headers (header-only) beside them,
#   - Debian 12's glslc (and its libshaderc1) to compile ggml's shaders,
#   - Mesa 25.0.7's lavapipe from bookworm-backports (Debian 12's Mesa 22.3.6 segfaults under ggml).
# The .debs are fetched by `apt-get download` under a throwaway apt configuration and unpacked with
# `dpkg-deb -x`. Idempotent: a finished prefix (its .done stamp) is left as it is.
# Usage: bench/gpu/vulkan_debs.sh [PREFIX]    then source PREFIX/env.sh
set -euo pipefail
CACHE=${CORRAL_GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral-gpu}
PREFIX=$(realpath -m "${1:-$CACHE/vulkan}")
[ -f "$PREFIX/.done" ] && exit 0
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
APT=$(mktemp -d)
trap 'rm -rf "$APT"' EXIT
mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/prefs.d" "$APT/debs" "$PREFIX"
cat > "$APT/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-trixie-stable.gpg] $MIRROR trixie main
SRC
: > "$APT/status"
apt_opts=(
  -o Dir::Etc::sourcelist="$APT/sources.list" -o Dir::Etc::sourceparts=-
  -o Dir::Etc::preferencesparts="$APT/prefs.d" -o Dir::State="$APT" -o Dir::State::Lists="$APT/lists"
  -o Dir::State::status="$APT/status" -o Dir::Cache="$APT" -o Dir::Cache::archives="$APT/archives"
  -o APT::Sandbox::User=root -o Debug::NoLocking=true
)
apt-get "${apt_opts[@]}" -qq update
# package=suite: each one from the release named above
pkgs=(
  libvulkan-dev/trixie spirv-headers/trixie libvulkan1/bookworm glslc/bookworm libshaderc1/bookworm
  mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports
  libdrm-common/bookworm-backports
)
(cd "$APT/debs" && apt-get "${apt_opts[@]}" -qq download "${pkgs[@]}")
for deb in "$APT/debs"/*.deb; do
  echo "unpacking $(basename "$deb")"
  dpkg-deb -x "$deb" "$PREFIX"
done
# the ICD manifest names the driver by its bare name; name it by its path in the prefix
lib="$PREFIX/usr/lib/x86_64-linux-gnu"
sed "s#\"libvulkan_lvp.so\"#\"$lib/libvulkan_lvp.so\"#" \
  "$PREFIX/usr/share/vulkan/icd.d/lvp_icd.json" > "$PREFIX/lavapipe_icd.json"
cat > "$PREFIX/env.sh" <<ENV
# Vulkan on Mesa's lavapipe from $PREFIX (written by bench/gpu/vulkan_debs.sh)
export PATH="$PREFIX/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export VK_ICD_FILENAMES="$PREFIX/lavapipe_icd.json"
export GGML_VK_VISIBLE_DEVICES="\${GGML_VK_VISIBLE_DEVICES:-0}"
# the shader pipelines ggml builds at a worker's first decode (minutes on lavapipe), kept across runs
export MESA_SHADER_CACHE_DIR="\${MESA_SHADER_CACHE_DIR:-$(dirname "$PREFIX")/mesa-shader-cache}"
export MESA_SHADER_CACHE_MAX_SIZE="\${MESA_SHADER_CACHE_MAX_SIZE:-4G}"
ENV
ls "$APT/debs" > "$PREFIX/debs.txt"
missing() { LD_LIBRARY_PATH="$lib" ldd "$lib/libvulkan_lvp.so" "$PREFIX/usr/bin/glslc" | grep 'not found' || true; }
# what lavapipe and glslc load from the system (Debian 12's packages; chromium's dependencies
# bring most of them): installed through apt, as the Makefile installs chromium
runtime=(libllvm15 libz3-4 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0
         libx11-xcb1 libxshmfence1 libwayland-client0 libzstd1 libexpat1)
if [ -n "$(missing)" ]; then
  echo "installing lavapipe's libraries (apt): ${runtime[*]}" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${runtime[@]}" >&2 || true
  else sudo -n apt-get update -qq && sudo -n apt-get install -y -qq "${runtime[@]}" >&2 || true; fi
fi
missing=$(missing)
if [ -n "$missing" ]; then
  echo "vulkan_debs.sh: libraries the unpacked packages need are not installed:" >&2
  echo "$missing" >&2
  exit 1
fi
touch "$PREFIX/.done"
