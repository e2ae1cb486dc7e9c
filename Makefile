# `make build`: install ggml-bridge into a virtual environment and build llama-server on the defaults.
# `make test`:  install with the test extras, lint (ruff, ruff format, mypy) and run every test (slow ones fetch
#               and build the real llama.cpp; gpu-marked ones skip without a GPU).
# Inside an active virtualenv that one is used; otherwise .venv is created.

PYTHON ?= python3
VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The slow tests share one cache across runs (real builds take minutes); delete it to start from scratch.
export GGML_BRIDGE_TEST_CACHE_DIR ?= $(CURDIR)/.cache-test

.PHONY: help install build lint lint-workflows test test-fast clean

help:
	@echo "make build      install and run 'ggml-bridge build' (prints the llama-server path)"
	@echo "make test       install with test extras and run all tests (incl. slow; gpu ones skip without a GPU)"
	@echo "make test-fast  only the fast tests (-m 'not slow'), on FAST_JOBS=4 pytest-xdist workers"
	@echo "make lint       ruff check, ruff format --check, mypy (strict on ggml_bridge/); make test runs it first"
	@echo "make lint-workflows  actionlint + zizmor --offline on .github/workflows, shellcheck on the scripts (part of make test)"
	@echo "make clean      remove .venv and the test cache"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip runs again only when pyproject.toml changed (the install is editable: code changes need none); the stamp
# lives in the environment, so a new one installs afresh. ~10 s saved on every `make test-fast`.
INSTALLED := $(VENV)/.ggml-bridge-installed
install: $(INSTALLED)

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

build: install
	$(BIN)/ggml-bridge build

# The same checks as .pre-commit-config.yaml; `make test` fails on any of them.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# pytest exits 5 when it collects nothing: make fails on that like on any other non-zero status.
test: install lint lint-workflows
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# GitHub workflows: actionlint (syntax, contexts, action runtimes) and zizmor's offline security audit (pinned
# actions, persisted credentials, template injection): a broken workflow fails here, not first on GitHub. Then the
# shell scripts (CI's, the GPU machine's, the helpers'): shellcheck at warning level, sourced files followed.
lint-workflows: install
	$(BIN)/actionlint .github/workflows/*.yml
	$(BIN)/zizmor --offline .github/workflows/
	$(BIN)/shellcheck -x -S warning .ci/run scripts/*.sh scripts/gpu/*.sh

# The fast tests start many small processes (git, fake llama-servers, cmake) and wait on some: FAST_JOBS
# pytest-xdist workers. Four measured best on 2 cores, idle: 45-65 s wall, median 57 s in ten runs, against 64 s
# with two (2026-12-07, a 2-core AMD EPYC VM; 59-64 s against 73 s on the VM of 2026-12-06; 39.8-47.8 s in twelve
# runs on a 2-core Intel Xeon VM later that day, 67 CPU-s for 42 s of wall time): the waits on started
# processes overlap, and each worker also collects the whole suite (~1.5 CPU-s with bytecode). `--dist worksteal`
# was no faster beyond the runs' spread (44-52 s in four runs).
FAST_JOBS ?= 4
# Bytecode even where PYTHONDONTWRITEBYTECODE is set, kept out of the tree: without it each xdist worker rewrites
# every test module's asserts (~5 CPU-s) and each Python the tests start compiles ggml_bridge again. An absolute
# path: the tests change into scratch folders (a relative prefix wrote bytecode there, and the sweep's check that
# nothing lands in the current folder failed).
TEST_PYCACHE ?= $(abspath $(GGML_BRIDGE_TEST_CACHE_DIR))/pycache
test-fast: install
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(TEST_PYCACHE) $(BIN)/python -m pytest -m "not slow" -n $(FAST_JOBS) $(PYTEST_ARGS)

clean:
	rm -rf .venv .cache-test .pytest_cache
