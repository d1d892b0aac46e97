# Every target installs what it needs into .venv first (from constraints.txt), so each command
# works on a fresh machine. torch is installed before anything else: an unpinned torch would
# pull a multi-GB CUDA build.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/dagster_home
export LITHI_HOME ?= $(CURDIR)/.lithi

.PHONY: demo test test-fast lint ui bench setup browser clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0 -c constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,demo,ray]'
	touch $@

## The main job end to end: stage digits, local Compute (PARTIAL first), daemon + sensor, chain.
demo: $(STAMP)
	$(BIN)/python -m pipeline.defs.demo

## The whole test suite, linters first (ruff, then the import layering): both tiers, on every
## core (pytest-xdist; -n 0 runs it in one process). On a slow or busy machine,
## LITHI_TEST_TIME_SCALE=2 (or more) stretches every time limit in the tests.
test: $(STAMP) browser lint
	$(BIN)/python -m pytest -q -n auto -m "integration or not integration"

## The inner loop: everything but tests/integration/ (real daemons, torchrun, browsers, SIGKILLed
## children), which pytest's addopts deselect, fewer Hypothesis examples and a quarter of each
## exhaustive matrix, on every core (pytest-xdist). `make test` is what CI runs.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -q -n auto

## Chromium from Debian for the browser test (skipped with a loud reason where it cannot start).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "WARNING: could not install chromium; the browser test will say so"; \
	  else echo "WARNING: chromium not installed and not root; the browser test will say so"; fi; }

## Linters: ruff, the import layering, and mypy over the paths in pyproject's [tool.mypy] files.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

## The Dagster UI on the demo's instance (created and migrated once first, never raced), with
## the chain the last demo declared (LITHI_HOME/chains.yaml) unless LITHI_CHAINS names another.
ui: $(STAMP)
	$(BIN)/python -m pipeline.defs.instance
	LITHI_CHAINS="$${LITHI_CHAINS:-$$(test -f $(LITHI_HOME)/chains.yaml && echo $(LITHI_HOME)/chains.yaml)}" \
		$(BIN)/dagster dev -w workspace.yaml -p 3000

bench: $(STAMP)
	$(BIN)/python bench/verify.py
	$(BIN)/python bench/loader.py
	$(BIN)/python bench/chain.py
	$(BIN)/python bench/s3.py

clean:
	rm -rf .lithi dagster_home/storage dagster_home/history dagster_home/schedules dagster_home/logs
