# CodeParrot: every set-up step lives here. `make demo` and `make test` are all a user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and pinned: an unpinned torch (and a pinned one from the default index on Linux)
# pulls a multi-GB CUDA build. Where a local folder carries a CPU torch wheel it is used; otherwise the CPU
# builds come from PyTorch's own CPU wheel index.
# GPU users: make install TORCH="torch==2.5.1" TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu124"
TORCH ?= torch==2.13.0
WHEEL_DIRS := $(wildcard /opt/wheels)
FIND_LINKS := $(foreach d,$(WHEEL_DIRS),--find-links $(d))
LOCAL_TORCH := $(wildcard $(addsuffix /torch-*.whl,$(WHEEL_DIRS)))
TORCH_INDEX ?= $(if $(LOCAL_TORCH),,--index-url https://download.pytorch.org/whl/cpu)
# olah (a self-hosted Hub mirror) lets the tests exercise the Hub backend's read side offline. It lives in
# its own venv because its pinned dependencies conflict with the project's; if it cannot be installed the
# test that needs it is skipped with that reason.
OLAH_VENV ?= .venv-olah
DEMO_DIR ?= demo_output
FRESH ?= 0
APP_PORT ?= 7860
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test demo bench gpu-check app clean help

help:
	@echo "make install   create $(VENV) and install the project (TORCH=$(TORCH))"
	@echo "make demo      run the whole pipeline on the embedded default corpus into $(DEMO_DIR)/ (FRESH=1 redoes every stage)"
	@echo "make test      run the test suite"
	@echo "make bench     print the benchmark table (also written to bench/results.md)"
	@echo "make gpu-check what the recipe gets on this GPU (scripts/gpu_check.py; results in gpu_check/)"
	@echo "make app       serve the web app on the demo's model repository (after make demo; APP_PORT=$(APP_PORT))"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(FIND_LINKS) $(TORCH_INDEX) "$(TORCH)"
	$(PY) -m pip install --quiet $(FIND_LINKS) -e ".[dev,distributed]"
	touch $@

install: $(VENV)/.installed

$(OLAH_VENV)/.installed:
	@($(PYTHON) -m venv $(OLAH_VENV) && $(OLAH_VENV)/bin/pip install --quiet olah && touch $@) \
		|| echo "warning: olah could not be installed; the Hub mirror test will be skipped"

test: $(VENV)/.installed $(OLAH_VENV)/.installed
	CODEPARROT_OLAH=$(if $(wildcard $(OLAH_VENV)/.installed),$(abspath $(OLAH_VENV))/bin/olah-cli,) $(PY) -m pytest -q tests

demo: $(VENV)/.installed
	$(PY) scripts/demo.py --output-dir $(DEMO_DIR) $(if $(filter 1,$(FRESH)),--fresh,)

app: $(VENV)/.installed
	@test -d $(DEMO_DIR)/model-repo || { echo "error: $(DEMO_DIR)/model-repo not found; run make demo first"; exit 2; }
	$(PY) scripts/app.py --model $(DEMO_DIR)/model-repo --revision demo-tiny --data-dir $(DEMO_DIR)/clean \
		--runs-dir $(DEMO_DIR)/runs --port $(APP_PORT)

bench: $(VENV)/.installed
	$(PY) scripts/bench.py --output bench/results.md

gpu-check: $(VENV)/.installed
	$(PY) scripts/gpu_check.py --output-dir gpu_check

clean:
	rm -rf $(VENV) $(OLAH_VENV) $(DEMO_DIR) .pytest_cache
