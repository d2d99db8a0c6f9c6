# Two entry points, each setting itself up (idempotently) in .venv:
#   make lab   -> JupyterLab on the walkthrough
#   make test  -> lint + the whole CPU test suite, notebooks included
# GPU machines: make lab TORCH_SPEC=torch EXTRAS=dev,gpu  (a CUDA build of torch, and CuPy)

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
BIN := $(VENV)/bin
# Jupyter refuses to run as root unless told; containers and CI machines often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
SOURCES := $(shell find kvlab kernels -type f -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: lab test setup clean

setup: $(VENV)/.kvlab

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first: the CPU wheel, so that no multi-GB CUDA build is downloaded.
$(VENV)/.deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q ".[$(EXTRAS)]"
	touch $@

# kvlab itself, installed as a user gets it (not editable), again whenever a source changes.
$(VENV)/.kvlab: $(VENV)/.deps $(SOURCES)
	$(BIN)/python -m pip install -q --no-deps --force-reinstall .
	touch $@

lab: setup
	$(BIN)/jupyter lab $(LAB_ARGS) notebooks/walkthrough.ipynb

test: setup
	$(BIN)/ruff check kvlab tests
	$(BIN)/pytest -q tests notebooks --nbmake

clean:
	rm -rf $(VENV) build dist
