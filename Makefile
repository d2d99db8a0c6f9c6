# Two entry points, each setting itself up (idempotently) in .venv:
#   make lab   -> JupyterLab on the walkthrough
#   make test  -> lint + the whole CPU test suite, notebooks included
# GPU machines: make lab TORCH_SPEC=torch TORCH_INDEX= EXTRAS=dev,gpu  (a CUDA build of torch,
# and CuPy). LAB_ARGS: more options for `jupyter lab`, e.g. LAB_ARGS="--port 8890 --no-browser".

PYTHON ?= python3
VENV ?= .venv
# torch's CPU build (Linux: "+cpu" from PyTorch's CPU index; PyPI's Linux wheel is the multi-GB
# CUDA build), installed before kvlab so that nothing pulls the CUDA build in.
TORCH_SPEC ?= $(if $(filter Linux,$(shell uname -s)),torch==2.13.0+cpu,torch==2.13.0)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
EXTRAS ?= dev
BIN := $(VENV)/bin
# Jupyter refuses to run as root unless told; containers and CI machines often are root.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
LAB_ARGS ?=
SOURCES := $(shell find kvlab kernels benchmarks/results -type f -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: lab test setup clean

setup: $(VENV)/.kvlab

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first: the CPU wheel, so that no multi-GB CUDA build is downloaded.
$(VENV)/.deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-deps "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"  # its dependencies, from PyPI
	$(BIN)/python -m pip install -q ".[$(EXTRAS)]"
	touch $@

# kvlab itself, installed as a user gets it (not editable), again whenever a source changes.
$(VENV)/.kvlab: $(VENV)/.deps $(SOURCES)
	$(BIN)/python -m pip install -q --no-deps --force-reinstall .
	touch $@

lab: setup
	$(BIN)/jupyter lab $(ROOT_ARGS) $(LAB_ARGS) notebooks/walkthrough.ipynb

test: setup
	$(BIN)/ruff check kvlab tests
	$(BIN)/pytest -q tests notebooks --nbmake

clean:
	rm -rf $(VENV) build dist
