# Set-up lives here: `make demo` and `make test` each build the virtual environment first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench docs gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch 2.13.0 first: on this project's machines that release is a CPU build on disk.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m pycudnnrnn check

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/cpu_bench.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache site

# On a machine with an NVIDIA GPU: its own python3 and packages, no virtual environment.
gpu-check:
	PYTHONPATH=. python3 benchmarks/gpu_check.py
