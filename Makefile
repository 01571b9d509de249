# The two commands of the README:
#   make demo   set up and run the fan-out example on the embedded plane
#   make test   set up and run the tests (ruff, mypy and pytest)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test setup setup-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/python -m pip install -q -e .

setup-dev: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'

demo: setup
	$(BIN)/python examples/fan_out.py

test: setup-dev
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .ruff_cache .pytest_cache build *.egg-info
