# imagenet-train: `make demo` runs the main job on the embedded digits; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed

.PHONY: help venv system-deps demo test lint bench clean

help:
	@echo "make demo   - set up, shard the embedded digits, serve with nginx, train with torchrun (2 CPU procs)"
	@echo "make test   - set up and run the test suite"
	@echo "make lint   - ruff"

# Debian packages the demo and tests run for real: nginx (shard server).
system-deps:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
	  else echo "nginx is missing: sudo apt-get install -y nginx" >&2; exit 1; fi; }

# torch is installed first and pinned by constraints.txt so no resolver swaps it for a CUDA build.
# The registry's torchvision is a CUDA build; --no-deps keeps it from pulling anything, and
# imagenet_train.compat makes it import next to CPU torch.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q --no-deps torchvision==0.28.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,demo]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv system-deps
	$(BIN)/python tools/demo.py --workdir demo

test: venv system-deps
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check app tests tools
	$(BIN)/ruff format --check app tests tools

clean:
	rm -rf demo runs .pytest_cache
