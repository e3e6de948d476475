# corral: `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# llama-cpp-python compiles llama.cpp once (about 5 minutes on 2 cores); pip caches the wheel.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
HOST ?= 127.0.0.1
PORT ?= 8080
# The llama.cpp backend `make serve` runs workers on: cpu (the bindings' own build in the venv),
# vulkan or cuda: the same llama-cpp-python version built for it once per machine, its
# libraries beside the CPU ones in $(VENV)/llama-cpp-BACKEND/ and loaded through LLAMA_CPP_LIB_PATH
# (bench/gpu/install_backend.sh). `make install BACKEND=vulkan` remembers the choice.
export CORRAL_GPU_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/corral-gpu
BACKEND ?= $(shell cat $(VENV)/corral-backend 2>/dev/null || echo cpu)
GPU_ENV = $(VENV)/llama-cpp-$(BACKEND)/env.sh

.PHONY: install serve test soak typecheck lint bench clean chromium backend vulkan

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[engine,test]'
	$(PY) -c "from corral.store.embedded import embedded_model_path; print('default model:', embedded_model_path())"
	touch $@

# A GPU build (Vulkan: 307 s on a fresh 2-core machine, shaders included), kept outside the checkout
# as pip keeps the CPU wheel: in $(CORRAL_GPU_CACHE)/whl/ (never in pip's cache, which does not key
# on CMAKE_ARGS), with Mesa's lavapipe and its shader cache beside it (bench/gpu/build_wheel.sh)
$(VENV)/llama-cpp-%/.installed: $(VENV)/.installed bench/gpu/build_wheel.sh bench/gpu/install_backend.sh
	PY=$(PY) bench/gpu/install_backend.sh $* $(VENV)/llama-cpp-$*
	touch $@

backend: $(VENV)/.installed
ifneq ($(BACKEND),cpu)
backend: $(VENV)/llama-cpp-$(BACKEND)/.installed
endif

install: $(VENV)/.installed backend
	echo $(BACKEND) > $(VENV)/corral-backend

serve: install
ifeq ($(BACKEND),cpu)
	$(VENV)/bin/corral serve --host $(HOST) --port $(PORT)
else
	. $(GPU_ENV) && $(VENV)/bin/corral serve --host $(HOST) --port $(PORT)
endif

# The GPU test group (tests/gpu) runs on the GPU_BACKEND build: Vulkan (on Mesa's lavapipe where
# there is no GPU), or cuda on a machine with one
GPU_BACKEND ?= vulkan
vulkan: $(VENV)/llama-cpp-vulkan/.installed

# The web page's tests drive Debian's chromium (Playwright's own download is not used).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || { \
	  echo "installing chromium (apt) for the browser tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium; fi; }

test: install chromium $(VENV)/llama-cpp-$(GPU_BACKEND)/.installed
	CORRAL_GPU_BACKEND=$(GPU_BACKEND) $(PY) -m pytest -q -ra --durations=30

# The long reliability run (30 minutes, two models, faults under load; see tests/reliability/soak.py).
soak: install
	$(PY) tests/reliability/soak.py $(SOAK_ARGS)

# mypy --strict on src/corral (settings in pyproject.toml [tool.mypy])
typecheck: install
	$(PY) -m mypy

# ruff on src/, tests/, bench/ and testkit/ (settings in pyproject.toml [tool.ruff])
lint: install
	$(PY) -m ruff check src tests bench testkit

bench: install
	$(PY) -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache  # $(CORRAL_GPU_CACHE) (the GPU builds) stays
