# make test | make demo | make bench | make lint   (each creates .venv by itself)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck imports pytest demo bench clean proto

$(STAMP): pyproject.toml testkit/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./testkit -e '.[test,demo]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

# in parallel (pytest-xdist, a test module per unit: --dist loadscope in pyproject.toml), one worker more
# than cores (many tests wait on processes and sockets); PYTEST_WORKERS=N to choose
PYTEST_WORKERS ?= $(shell expr $$(nproc) + 1)
pytest: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS)

test: lint typecheck imports pytest

# `make demo --keep`: make reads --keep as its own --keep-going (k in MAKEFLAGS); hand it on to the demo.
# Any other demo flags go in ARGS, e.g. a cluster file and a directory of pod manifests (copy and edit these):
#   make demo ARGS="--nodes testkit/hami_testkit/cluster.yaml --examples examples/ --timeout 300"
DEMO_KEEP := $(if $(findstring k,$(firstword -$(MAKEFLAGS))),--keep)

demo: $(STAMP)
	$(BIN)/hami demo $(DEMO_KEEP) $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
