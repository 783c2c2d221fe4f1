# The two set-up commands of the README. Both create (or reuse) .venv and install what they need.
# torch is installed first, pinned, so that pip does not pull a newer CUDA build through the package's
# own `torch>=2.5` requirement. Override with `make test TORCH=torch==2.5.1` etc.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.debertakit-installed

.PHONY: demo test lint format clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m debertakit demo

test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 8 --dist worksteal  # a worker per core (pytest-xdist), 8 at most

lint: $(STAMP)
	$(PY) -m ruff check debertakit tests benchmarks
	$(PY) -m ruff format --check debertakit tests benchmarks

format: $(STAMP)
	$(PY) -m ruff format debertakit tests benchmarks
	$(PY) -m ruff check --fix debertakit tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
