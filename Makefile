# One task runner. Every target first builds .venv if it is missing or older than
# pyproject.toml, so `make run` and `make test` work on a fresh machine as they are.
PYTHON ?= python3
VENV ?= .venv
# torch goes in first and pinned: a plain `torch` requirement would pull the newest
# CUDA build (gigabytes). On a GPU machine, pick the wheel you need, e.g.
#   make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
REPO ?= .
ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install run test lint

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(INSTALLED)

run: $(INSTALLED)
	$(BIN)/python run_pipeline.py --repo "$(REPO)" $(ARGS)

test: $(INSTALLED)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(BIN)/ruff check .
