# bkaio developer loop. Every install step lives here: CI runs `make test` on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TEST_STAMP := $(VENV)/.test-installed-stamp
PYTEST_ARGS ?=
# make test runs test files on this many pytest-xdist workers: most integration and fault tests
# wait on real processes, disks and timeouts, so two of them share two cores well (the serial
# run took 18 minutes). A module's tests stay on one worker (--dist loadfile), with its fixtures.
TEST_WORKERS ?= 2

# Targets that are not files.
.PHONY: bytecode sim soak fuzz selfcheck run stop test test-unit lint fmt bench bench-quick bench-ab bench-micro bench-codec bench-journal bench-bookie bench-meta bench-spark bench-reads bench-replay bench-idle clean system-deps venv

venv: $(STAMP)

# The venv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# The tests also need the Spark and bench extras (pyspark is large, so `make run` skips them).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,spark,bench]'
	@touch $(TEST_STAMP)

# Debian packages the tests use: etcd-server (the integration tests start real etcd), etcd-client
# (etcdctl sets up users and roles for the etcd-auth test), a Java runtime for Spark and nftables
# (`nft`: partitions inside network namespaces, tests/faults/harness/netns.py; only asked for as
# root, since those tests skip without root). Installed when missing and root; otherwise the one
# command to run is printed.
# systemd (for `systemd-analyze verify` of deploy/systemd/bkaio-bookie.service) likewise.
SYSTEM_PACKAGES := etcd-server etcd-client default-jre-headless nftables systemd
system-deps:
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	[ "$$(id -u)" != 0 ] || command -v nft >/dev/null 2>&1 || missing="$$missing nftables"; \
	[ "$$(id -u)" != 0 ] || command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	if [ -z "$$missing" ]; then \
		true; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "missing:$$missing; run: sudo apt-get update && sudo apt-get install -y$$missing"; \
		exit 1; \
	fi

# Compiled once here, the package's bytecode is read by every process the tests start (hundreds
# of bookies, CLI commands); where PYTHONDONTWRITEBYTECODE is set (some CI images and sandboxes)
# each of them would otherwise compile every bkaio module again: about a quarter of the CPU of
# the integration tests. compileall writes only what is stale.
bytecode: venv
	$(PY) -m compileall -q -j 0 bkaio tests

test: $(TEST_STAMP) system-deps bytecode
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check bkaio tests benchmarks examples
	$(VENV)/bin/ruff format --check bkaio tests benchmarks examples
	$(VENV)/bin/mypy bkaio tests benchmarks examples

fmt: venv
	$(VENV)/bin/ruff check --fix bkaio tests benchmarks examples
	$(VENV)/bin/ruff format bkaio tests benchmarks examples

run: venv bytecode
	@bash scripts/run-demo.sh

selfcheck: venv
	$(PY) -m bkaio.protocol.selfcheck

# The benchmark extra: NATS JetStream (the peer), py-spy, matplotlib.
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

# Everything, unattended (about 22 minutes; docs/benchmarks.md): bkaio against NATS JetStream,
# every append workload 3 times (under 15 minutes), then the read benchmarks (`bench-reads`).
bench: $(BENCH_STAMP)
	$(VENV)/bin/bkaio bench --suite full
	$(MAKE) bench-reads

# About a minute: CI's smoke test runs a part of it.
bench-quick: $(BENCH_STAMP)
	$(VENV)/bin/bkaio bench --suite quick

# Before/after in one run: this checkout against another one (with its own .venv), alternated.
BEFORE ?=
AB_ARGS ?= --only closed100 --only open5000 --only serial --rounds 3
bench-ab: $(BENCH_STAMP)
	@test -n "$(BEFORE)" || { echo "usage: make bench-ab BEFORE=DIR (a checkout with its own .venv)"; exit 2; }
	$(PY) benchmarks/ab_compare.py --before $(BEFORE) --after . $(AB_ARGS)

# Component micro-benchmarks.
bench-micro: bench-codec bench-journal

bench-codec: venv
	$(PY) benchmarks/codec_bench.py

bench-journal: venv
	$(PY) benchmarks/journal_bench.py

bench-bookie: venv
	$(PY) benchmarks/bookie_bench.py

bench-meta: venv system-deps
	$(PY) benchmarks/meta_bench.py

bench-spark: $(TEST_STAMP)
	$(PY) benchmarks/spark_bench.py

# Deterministic simulation of the real bookie and client code (docs/faults.md): `make sim
# SEEDS=N` runs seeds 0..N-1 (every one must pass), then checks that each deliberately broken
# part is caught within 1000 seeds; `make sim SEED=S` replays one seed and prints its report;
# MUTATION=name runs with that broken part (with SEEDS: until a seed catches it); SCENARIO=name
# runs only that scenario. JOBS workers.
SEEDS ?= 1000
SEED ?=
MUTATION ?=
SCENARIO ?=
JOBS ?= 2
sim: venv
	PYTHONHASHSEED=0 $(PY) -m bkaio.testing.sim --jobs $(JOBS) \
		$(if $(SEED),--seed $(SEED),--seeds $(SEEDS) $(if $(MUTATION),,--mutation-checks 1000)) \
		$(if $(MUTATION),--mutation $(MUTATION)) $(if $(SCENARIO),--scenario $(SCENARIO))

# The read targets (docs/benchmarks.md, "Reads"), about 8 minutes: sequential reads of a closed
# 200k x 1 KiB ledger (E3/Qw3 and E5/Qw2), tailing at 5k/s, a 1M catch-up read under 5k/s
# writes, then Spark count() of a 1M x 100 B stream (cold and warm).
bench-reads: $(TEST_STAMP)
	$(PY) benchmarks/read_bench.py all
	$(PY) benchmarks/spark_bench.py --entries 1000000

# RSS of a shard replaying a 2 GiB journal, above an idle one (target <= 256 MiB); ~4 GiB of disk.
bench-replay: venv
	$(PY) benchmarks/replay_memory_bench.py

# CPU of an idle 3-bookie standalone cluster per process, over 20 s (target < 1 % each).
bench-idle: venv
	$(PY) benchmarks/idle_cpu_bench.py
	$(PY) benchmarks/idle_cpu_bench.py --etcd

# Every fault scenario, with longer schedules and many seeds; prints the lost/violations table.
# Then the 30-minute autorecovery soak (tests/soak; BKAIO_SOAK_MINUTES changes its length).
SOAK_ARGS ?=
soak: venv system-deps
	BKAIO_SOAK=1 $(PY) scripts/soak.py $(SOAK_ARGS)
	BKAIO_SOAK=1 $(PY) -m pytest tests/soak -q -s -p no:cacheprovider

# Coverage-guided fuzzing of the frame decoder (atheris); `make test` runs a 10 s pass.
FUZZ_SECONDS ?= 300
fuzz: venv
	mkdir -p .fuzz/corpus && cp -n tests/fuzz/corpus/decoder/* .fuzz/corpus/
	$(PY) tests/fuzz/fuzz_decoder.py -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=.fuzz/ \
		.fuzz/corpus tests/fuzz/corpus/decoder

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache benchmarks/results
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
