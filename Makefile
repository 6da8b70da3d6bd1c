# Set-up lives here: `make demo` and `make test` each build the virtual environment first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TESTED := $(VENV)/.installed-test
# The GPU extra (CuPy and cuDNN, about 2 GB of NVIDIA wheels) only where an NVIDIA GPU
# answers; cuda12 runs on CUDA 12 and 13 drivers. `make demo` needs nothing else. The test
# extra adds the tools and the cuDNN library alone (no CuPy): the binding's tests and the
# stand-in GPU make real cuDNN descriptors, which need no GPU.
GPU_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo '[cuda12]')

.PHONY: demo test bench docs notebooks personas gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.$(GPU_EXTRA)'
	touch $(STAMP)

$(TESTED): $(STAMP)
	# torch 2.13.0 first: on this project's machines that release is a CPU build on disk.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(TESTED)

demo: $(STAMP)
	$(PY) -m pycudnnrnn check --direction bidirectional

test: $(TESTED)
	$(PY) -m pytest -q

# Every row of docs/performance.md, ours beside each framework's own RNN, each side in a
# process of its own (several hours on 2 cores); `make bench BENCH=--quick` for LSTM
# alone (about 10 minutes).
BENCH ?=
bench: $(TESTED)
	$(PY) benchmarks/peers.py $(BENCH)

docs: $(TESTED)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The example notebooks run top to bottom and stored with their outputs, as GitHub shows
# them (about a minute on 2 cores); run it after changing a notebook.
notebooks: $(TESTED)
	$(PY) tools/run_notebooks.py

# Slow, and not part of `make test`: for each page that names an install line, a fresh
# virtual environment built with exactly that line, then the page's blocks in order, one
# line per page. It installs each framework from the package index (minutes each; hours
# in all). One page: `make personas PAGE=docs/jax.md`.
PAGE ?=
personas: $(STAMP)
	$(PY) tools/personas.py $(if $(PAGE),--page $(PAGE))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site

# On a machine with an NVIDIA GPU: its own python3 and packages, no virtual environment.
gpu-check:
	PYTHONPATH=. python3 benchmarks/gpu_check.py
