# bkaio developer loop. Every install step lives here: CI runs `make test` on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

# Targets that are not files.
.PHONY: selfcheck run stop test test-unit lint fmt bench bench-codec bench-journal bench-bookie bench-meta clean etcd venv

venv: $(STAMP)

# The venv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# Debian's etcd-server is what the integration tests start; install it when missing and root.
etcd:
	@if command -v etcd >/dev/null 2>&1; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's etcd-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
	else \
		echo "etcd is missing; run: sudo apt-get update && sudo apt-get install -y etcd-server"; \
		exit 1; \
	fi

test: venv etcd
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check bkaio tests benchmarks examples
	$(VENV)/bin/ruff format --check bkaio tests benchmarks examples
	$(VENV)/bin/mypy bkaio tests benchmarks examples

fmt: venv
	$(VENV)/bin/ruff check --fix bkaio tests benchmarks examples
	$(VENV)/bin/ruff format bkaio tests benchmarks examples

run: venv
	@bash scripts/run-demo.sh

selfcheck: venv
	$(PY) -m bkaio.protocol.selfcheck

bench: bench-codec bench-journal

bench-codec: venv
	$(PY) benchmarks/codec_bench.py

bench-journal: venv
	$(PY) benchmarks/journal_bench.py

bench-bookie: venv
	$(PY) benchmarks/bookie_bench.py

bench-meta: venv etcd
	$(PY) benchmarks/meta_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache benchmarks/results
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
