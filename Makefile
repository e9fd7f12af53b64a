# CodeParrot: every set-up step lives here. `make demo` and `make test` are all a user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and pinned: an unpinned torch (and a pinned one from the default index on Linux)
# pulls a multi-GB CUDA build. CUDA picks the build: `cpu` (the default) or a CUDA tag of PyTorch's wheel index
# that the pinned release is published for (2.13: cu130, cu126; cu128 was dropped in 2.12). The wheels carry
# their CUDA runtime; only the NVIDIA driver is needed, at least the one of that CUDA major version:
#   make install CUDA=cu130                          torch 2.13.0 for CUDA 13.0 (PyTorch's default; driver >= 580)
#   make install CUDA=cu126                          for CUDA 12.6: older drivers (>= 525); announced to go
#   make install CUDA=cu128 TORCH="torch==2.9.1"     another release (>= 2.6: transformers 5 and FSDP2 need it)
#   make install TORCH_INDEX="--index-url URL"       any other wheel source (TORCH_INDEX= : pip's default index)
# The CPU build comes from a local wheel folder when it holds one for the default pin, else from PyTorch's CPU index.
# $(VENV)/.torch-request holds the request (TORCH and where it comes from): a different request reinstalls torch.
TORCH ?= torch==2.13.0
CUDA ?= cpu
TORCH_FLOOR := 2.6
PYTORCH_INDEX := https://download.pytorch.org/whl
WHEEL_DIRS := $(wildcard /opt/wheels)
FIND_LINKS := $(foreach d,$(WHEEL_DIRS),--find-links $(d))
LOCAL_TORCH := $(wildcard $(addsuffix /torch-*+cpu-*.whl,$(WHEEL_DIRS)))
ifneq ($(origin TORCH_INDEX),undefined)
TORCH_SOURCE := $(TORCH_INDEX)
TORCH_BUILD := any
else ifeq ($(CUDA),cpu)
# the local folder for the default pin (offline CI); any other request goes to the CPU index
TORCH_SOURCE := $(FIND_LINKS) $(if $(and $(LOCAL_TORCH),$(filter file,$(origin TORCH))),,--index-url $(PYTORCH_INDEX)/cpu)
TORCH_BUILD := cpu
else
# never the local folder: it holds CPU wheels, which pip would take for a CUDA request of the same version
TORCH_SOURCE := --index-url $(PYTORCH_INDEX)/$(CUDA)
TORCH_BUILD := $(CUDA)
endif
TORCH_REQUEST := $(strip $(TORCH) $(TORCH_BUILD) $(TORCH_SOURCE))
TORCH_STAMP := $(VENV)/.torch-request
# A stamp whose content differs from this request is out of date (make decides on times, so say it here).
ifneq ($(strip $(file < $(TORCH_STAMP))),$(TORCH_REQUEST))
.PHONY: $(TORCH_STAMP)
endif
# olah (a self-hosted Hub mirror) lets the tests exercise the Hub backend's read side offline. It lives in
# its own venv because its pinned dependencies conflict with the project's; if it cannot be installed the
# test that needs it is skipped with that reason.
OLAH_VENV ?= .venv-olah
DEMO_DIR ?= demo_output
FRESH ?= 0
APP_PORT ?= 7860
# parallel test processes of `make test` (pytest-xdist); 0 runs the suite in one process
TEST_WORKERS ?= 2
# make gpu-data: the codeparrot-small repository and tokens the GPU commands use (GPU_DATA_SOURCES: source trees to
# export instead of this virtualenv's site-packages)
GPU_DATA ?= gpu_data
GPU_DATA_SOURCES ?=
export HF_HUB_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test demo bench app gpu-data gpu-check clean help

help:
	@echo "make install   create $(VENV) and install the project (TORCH=$(TORCH), CUDA=$(CUDA): cpu, cu130 or cu126)"
	@echo "make demo      run the whole pipeline on the embedded default corpus into $(DEMO_DIR)/ (FRESH=1 redoes every stage)"
	@echo "make test      run the test suite on TEST_WORKERS=$(TEST_WORKERS) processes (0: one), slowest tests last"
	@echo "make bench     print the benchmark table (also written to bench/results.md)"
	@echo "make gpu-check what the recipe gets on this GPU (scripts/gpu_check.py; results in gpu_check/)"
	@echo "make gpu-data  build the codeparrot-small repository and tokens the GPU commands train on into $(GPU_DATA)/"
	@echo "make app       serve the web app on the demo's model repository (after make demo; APP_PORT=$(APP_PORT))"

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch alone, first: uninstalled when the installed one does not meet the request (version and build), since
# pip would keep a CPU 2.13.0 for a CUDA 2.13.0 request; the stamp is removed first and written last, once the
# install succeeded (a failed install is retried by the next make, whatever the request).
$(TORCH_STAMP): | $(PY)
	rm -f $@
	$(PY) -W ignore codeparrot/tools/torch_request.py "$(TORCH)" $(TORCH_BUILD) || $(PY) -m pip uninstall --quiet --yes torch
	$(PY) -m pip install --quiet $(TORCH_SOURCE) "$(TORCH)"
	$(PY) -W ignore codeparrot/tools/torch_request.py "$(TORCH)" $(TORCH_BUILD) --floor $(TORCH_FLOOR)
	printf '%s\n' '$(TORCH_REQUEST)' > $@

# the project, with torch held at the installed build (a constraint: pip may not swap it for another); then the
# serving tests' text_generation client without its dependencies: it pins huggingface-hub<1.0, which transformers 5
# rules out (pyproject.toml's dev extra lists the dependencies it does use)
$(VENV)/.installed: pyproject.toml $(TORCH_STAMP)
	$(PY) -W ignore -c 'import torch; print("torch==" + torch.__version__)' > $(VENV)/.torch-constraint
	$(PY) -m pip install --quiet $(FIND_LINKS) -c $(VENV)/.torch-constraint -e ".[dev,distributed]"
	$(PY) -m pip install --quiet $(FIND_LINKS) --no-deps "text-generation==0.7.0"
	@$(PY) -c 'from codeparrot.training.launch_checks import torch_build_report; print(torch_build_report())'
	@touch $@  # silent: the torch report above stays the last line

install: $(VENV)/.installed

$(OLAH_VENV)/.installed:
	@($(PYTHON) -m venv $(OLAH_VENV) && $(OLAH_VENV)/bin/pip install --quiet olah && touch $@) \
		|| echo "warning: olah could not be installed; the Hub mirror test will be skipped"

# The suite runs on TEST_WORKERS pytest-xdist processes (TEST_WORKERS=0: one process, as plain pytest);
# --dist loadscope gives each test module to one worker whole (its module fixtures are built once), modules
# handed out in the order tests/conftest.py sorts them (slow first: --no-loadscope-reorder); not loadgroup:
# pytest-xdist 3.8 groups by rewriting item._nodeid, which pytest 9.2 no longer reads. Slowest tests at the end.
test: $(VENV)/.installed $(OLAH_VENV)/.installed
	CODEPARROT_OLAH=$(if $(wildcard $(OLAH_VENV)/.installed),$(abspath $(OLAH_VENV))/bin/olah-cli,) \
		$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder) tests

demo: $(VENV)/.installed
	$(PY) scripts/demo.py --output-dir $(DEMO_DIR) $(if $(filter 1,$(FRESH)),--fresh,)

app: $(VENV)/.installed
	@test -d $(DEMO_DIR)/model-repo || { echo "error: $(DEMO_DIR)/model-repo not found; run make demo first"; exit 2; }
	$(PY) scripts/app.py --model $(DEMO_DIR)/model-repo --revision demo-tiny --data-dir $(DEMO_DIR)/clean \
		--runs-dir $(DEMO_DIR)/runs --port $(APP_PORT)

gpu-data: $(VENV)/.installed
	$(PY) scripts/gpu_data.py --output-dir $(GPU_DATA) $(if $(GPU_DATA_SOURCES),--sources $(GPU_DATA_SOURCES),) \
		$(if $(filter 1,$(FRESH)),--fresh,)

bench: $(VENV)/.installed
	$(PY) scripts/bench.py --output bench/results.md

gpu-check: $(VENV)/.installed
	$(PY) scripts/gpu_check.py --output-dir gpu_check

clean:
	rm -rf $(VENV) $(OLAH_VENV) $(DEMO_DIR) $(GPU_DATA) .pytest_cache
