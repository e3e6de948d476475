#!/usr/bin/env bash
# corral on a CUDA GPU, side by side with llama-server: one table (issue 13, part 2).
#
# The GPU machine reaches no registry and no network: everything comes from .gpu/, made
# HERE beforehand by `bash bench/gpu/prepare.sh` (llama.cpp's sources stripped to ~26 MB,
# the bindings, gguf-py, a few wheels; ~31 MiB in all). On the device:
#
#     bash bench/gpu/run.sh            # carry: [".gpu"]; prints the table, copies it to $OUT
#
# Steps: (1) install the wheels and the bindings into a private site dir; (2) build
# llama.cpp ONCE for this card's architecture only (shared libraries for corral's workers
# + llama-server from the same sources); (3) write a random-weight TinyLlama-1.1B-shaped
# GGUF (speed does not depend on the weights' values); (4) run python -m bench.run: the seed's
# case (two model ids on one GPU, concurrent streaming: no crash), corral vs llama-server
# with full offload at c=1, 8, 32, 64 (llama-server -np 64; LLAMA_KVU=on adds -kvu), corral's
# default slots ("auto", sized from the GPU's memory) vs 4 at c=64, two instances of one model
# on one GPU, the router's own ceiling over workers that answer at once (scenario router_ceiling,
# 16 cores: the router is the limit, not the clients), one KV stream a slot vs a unified cache
# at batch 8 and 64 (bench/probes/kv_unified.py), and where corral
# says the layers and KV went next to what llama.cpp logged allocating (bench/probes/placement_check.py,
# 0, 12 and all layers, q8_0 KV cache); (5) sampling
# threads (bench/probes/sampling_threads.py): c=32 tok/s with sampling_threads 1 vs auto on that
# model and on a Gemma-3-270M-sized one (262k vocabulary: sampling costs ~0.3 ms per slot
# per step on the CPU), and the per-step draw time with 1, 2, 4, 8 threads, and with 1 and 8 over
# the whole vocabulary instead of the short candidate list ("1full", "8full"). SAMPLING=0 skips it;
# (6) draft-model speculation (scenario speculation-draft) on a generated pair: a TinyLlama-shaped
# target whose layers add little (--layer-scale) and its own first 2 layers as the draft (same
# vocabulary; bench/gpu/make_model.py), corral vs llama-server -md, draft p_min 0. DRAFT=0 skips it.
#
# Then (GPU_TESTS=1, the default) the GPU test group, tests/gpu, on this build and the generated model:
# the placement, two models decoding on the one device at once, the budget's eviction (what
# `make test` runs on Vulkan's lavapipe; the issue 34 checks), with CORRAL_GPU_BACKEND=$BACKEND.
#
# BACKEND picks the backend: cuda (the default) or cpu (every step on a CPU: how this script is
# tested before GPU minutes are spent; CUDA=0 says the same).
set -euo pipefail
cd "$(dirname "$0")/../.."
G=.gpu
OUT=${OUT:-/tmp/corral-gpu-out}
BACKEND=${BACKEND:-cuda}
[ "${CUDA:-1}" = 0 ] && BACKEND=cpu
case "$BACKEND" in cuda) CUDA=1 ;; cpu) CUDA=0 ;; *) echo "run.sh: BACKEND is cuda or cpu (Vulkan: make test)"; exit 2 ;; esac
GPU_TESTS=${GPU_TESTS:-1}
ARCH=${CUDA_ARCH:-native}          # the card's own architecture only (H100/H200: 90)
JOBS=${JOBS:-$(nproc)}
PY=${PY:-python3}
SITE=${SITE:-/tmp/corral-site}
BUILD=${BUILD:-/tmp/corral-build}
MODEL=${MODEL:-/tmp/tinyllama-random.gguf}
MODEL_ARGS=${MODEL_ARGS:-}          # e.g. "--layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2" for a CPU test
GPU_LAYERS=${GPU_LAYERS:-999}
CONCURRENCY=${CONCURRENCY:-1,8,32,64}
LLAMA_KVU=${LLAMA_KVU:-off}         # llama-server -kvu in the throughput scenario (on|off)
THREADS=${THREADS:-4}
ONLY=${ONLY:-throughput,multimodel,instances,router_ceiling}
SAMPLING=${SAMPLING:-1}
DRAFT=${DRAFT:-1}                   # 6/6: draft-model speculation with a generated pair (DRAFT=0 skips it)
PAIR_TARGET=${PAIR_TARGET:-/tmp/pair-target.gguf}
PAIR_DRAFT=${PAIR_DRAFT:-/tmp/pair-draft.gguf}
PAIR_ARGS=${PAIR_ARGS:-"--layer-scale 0.001"}  # + MODEL_ARGS; the draft: the target's first 2 layers
MODEL_262K=${MODEL_262K:-/tmp/gemma-shaped-262k.gguf}
MODEL_262K_ARGS=${MODEL_262K_ARGS:-"--layers 18 --embd 640 --ff 2048 --heads 5 --kv-heads 1"}
mkdir -p "$OUT"
log() { echo "[gpu $(date +%T)] $*" >&2; }
[ -d "$G/llama.cpp" ] || { echo "no $G/llama.cpp: run bench/gpu/prepare.sh first (and carry .gpu)"; exit 2; }

log "1/5 python packages -> $SITE"
rm -rf "$SITE" && mkdir -p "$SITE"
if [ "${SKIP_WHEELS:-0}" != 1 ]; then  # SKIP_WHEELS=1: $PY already has them (a CPU test with corral's venv)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$G"/wheels/*.whl
fi
cp -r "$G/llama_cpp" "$SITE/llama_cpp" && mkdir -p "$SITE/llama_cpp/lib"
export PYTHONPATH="$SITE:$PWD/src"

log "2/5 building llama.cpp (CUDA=$CUDA, arch $ARCH, $JOBS jobs)"
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON
       -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF
       -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON)
[ "$CUDA" = 1 ] && flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH")
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
t0=$(date +%s)
cmake -S "$G/llama.cpp" -B "$BUILD" "${gen[@]}" "${flags[@]}" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
cmake --build "$BUILD" -j "$JOBS" --target llama-server mtmd >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
find "$BUILD" -name 'lib*.so*' -exec cp -a {} "$SITE/llama_cpp/lib/" \;
export CORRAL_BENCH_CACHE=/tmp/corral-bench LLAMA_SERVER="$BUILD/bin/llama-server"
log "   built in $(( $(date +%s) - t0 )) s"
"$PY" - <<'EOF'
import llama_cpp, corral.worker.host.devices as d
from corral.worker.model import _init_backend
_init_backend(False)
for dev in d.list_devices():
    print(f"[gpu] device {dev.name} ({dev.kind}): {dev.free_bytes / 2**30:.1f} of {dev.total_bytes / 2**30:.1f} GiB free")
print("[gpu] llama_supports_gpu_offload:", llama_cpp.llama_supports_gpu_offload())
EOF

log "3/5 model -> $MODEL"
[ -s "$MODEL" ] || PYTHONPATH="$PWD/$G/gguf-py:$PYTHONPATH" "$PY" -m bench.gpu.make_model "$MODEL" $MODEL_ARGS

if [ "$GPU_TESTS" = 1 ] && [ "$BACKEND" = cuda ]; then
  log "GPU test group (tests/gpu) on $BACKEND, $(basename "$MODEL")"
  CORRAL_GPU_BACKEND=$BACKEND CORRAL_GPU_ENV= CORRAL_GPU_MODEL="$(realpath "$MODEL")" "$PY" -m pytest -q -ra -p no:cacheprovider \
    tests/gpu 2>&1 | tee "$OUT/gpu-tests.log" | tail -15 || true
fi

log "4/5 bench ($ONLY)"
set -o pipefail
"$PY" -m bench.run --no-build --model "$MODEL" --threads "$THREADS" --gpu-layers "$GPU_LAYERS" \
  --concurrency "$CONCURRENCY" --llama-kvu "$LLAMA_KVU" --servers llama-server,corral \
  $(printf -- '--only %s ' ${ONLY//,/ }) 2>"$OUT/bench.log" | tee "$OUT/table.md"
echo "#### one KV stream a slot vs a unified KV cache (kv_unified), 64 slots: $(basename "$MODEL")" | tee -a "$OUT/table.md"
"$PY" -m bench.probes.kv_unified --model "$MODEL" --threads "$THREADS" --gpu-layers "$GPU_LAYERS" --reps 2 \
  2>>"$OUT/bench.log" | tee -a "$OUT/table.md" || true
cp bench/results/latest.md "$OUT/results.md" 2>/dev/null || true
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>/dev/null | tee -a "$OUT/table.md" || true
echo "#### where corral says the parts went, next to llama.cpp's buffers: $(basename "$MODEL")" | tee -a "$OUT/table.md"
"$PY" -m bench.probes.placement_check --model "$MODEL" --gpu-layers 0,12,-1 --cache-type q8_0 2>>"$OUT/bench.log" \
  | tee -a "$OUT/table.md" || true

if [ "$SAMPLING" = 1 ]; then
  log "5/5 sampling threads: c=32, 1 vs auto; draw time per step"
  [ -s "$MODEL_262K" ] || PYTHONPATH="$PWD/$G/gguf-py:$PYTHONPATH" "$PY" -m bench.gpu.make_model "$MODEL_262K" $MODEL_262K_ARGS --vocab 262144
  for m in "$MODEL" "$MODEL_262K"; do
    echo "#### sampling_threads 1 vs auto, c=32: $(basename "$m")" | tee -a "$OUT/table.md"
    "$PY" -m bench.probes.sampling_threads ab --model "$m" --threads "$THREADS" --gpu-layers "$GPU_LAYERS" \
      --concurrency 32 --variants 1,auto --rounds 3 --requests 64 2>>"$OUT/bench.log" | tee -a "$OUT/table.md"
  done
  echo "#### draw time per step: $(basename "$MODEL_262K")" | tee -a "$OUT/table.md"
  "$PY" -m bench.probes.sampling_threads step --model "$MODEL_262K" --threads "$THREADS" --gpu-layers "$GPU_LAYERS" \
    --slots 8,32 --variants 1,2,4,8,1full,8full --steps 20 2>>"$OUT/bench.log" | tee -a "$OUT/table.md"
fi

if [ "$DRAFT" = 1 ]; then
  log "6/6 draft model: a generated pair (the target's first 2 layers as its draft), corral vs llama-server -md"
  [ -s "$PAIR_TARGET" ] || PYTHONPATH="$PWD/$G/gguf-py:$PYTHONPATH" "$PY" -m bench.gpu.make_model "$PAIR_TARGET" $MODEL_ARGS $PAIR_ARGS
  [ -s "$PAIR_DRAFT" ] || PYTHONPATH="$PWD/$G/gguf-py:$PYTHONPATH" "$PY" -m bench.gpu.make_model "$PAIR_DRAFT" $MODEL_ARGS $PAIR_ARGS --layers 2
  CORRAL_BENCH_DRAFT="$PAIR_DRAFT" CORRAL_BENCH_DRAFT_P_MIN=0 "$PY" -m bench.run --no-build --model "$PAIR_TARGET" \
    --threads "$THREADS" --gpu-layers "$GPU_LAYERS" --only speculation-draft 2>>"$OUT/bench.log" | tee -a "$OUT/table.md"
fi
