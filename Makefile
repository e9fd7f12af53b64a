# CodeParrot: every set-up step lives here. `make demo` and `make test` are all a user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build on a CPU machine.
# GPU users: make install TORCH="torch==2.5.1" (optionally TORCH_INDEX="--index-url <your wheel index>").
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# Local wheel folders (a machine may carry a CPU torch wheel on disk) are searched when present.
FIND_LINKS := $(foreach d,$(wildcard /opt/wheels),--find-links $(d))
DEMO_DIR ?= demo_output
FRESH ?= 0
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test demo bench clean help

help:
	@echo "make install   create $(VENV) and install the project (TORCH=$(TORCH))"
	@echo "make demo      run the whole pipeline on the embedded default corpus into $(DEMO_DIR)/ (FRESH=1 redoes every stage)"
	@echo "make test      run the test suite"
	@echo "make bench     print the benchmark table (also written to bench/results.md)"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(FIND_LINKS) $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet $(FIND_LINKS) -e ".[dev]"
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

demo: $(VENV)/.installed
	$(PY) scripts/demo.py --output-dir $(DEMO_DIR) $(if $(filter 1,$(FRESH)),--fresh,)

bench: $(VENV)/.installed
	$(PY) scripts/bench.py --output bench/results.md

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
