# corral: `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# llama-cpp-python compiles llama.cpp once (about 5 minutes on 2 cores); pip caches the wheel.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: install serve test soak typecheck lint bench clean chromium

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[engine,test]'
	$(PY) -c "from corral.store.embedded import embedded_model_path; print('default model:', embedded_model_path())"
	touch $@

install: $(VENV)/.installed

serve: install
	$(VENV)/bin/corral serve --host $(HOST) --port $(PORT)

# The web page's tests drive Debian's chromium (Playwright's own download is not used).
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || { \
	  echo "installing chromium (apt) for the browser tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium; fi; }

test: install chromium
	$(PY) -m pytest -q -ra --durations=30

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
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
