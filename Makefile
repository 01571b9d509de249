# The two commands of the README:
#   make demo   set up and run the fan-out example on the embedded plane
#   make test   set up and run the tests (ruff, mypy and pytest)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test setup setup-dev constraints clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e .

setup-dev: $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'

# Re-pin constraints.txt from the current environment (after a deliberate upgrade).
constraints: setup-dev
	{ head -3 constraints.txt; $(BIN)/python -m pip freeze | grep -v '^-e' | grep -vi '^dreamlake'; } > constraints.new
	mv constraints.new constraints.txt

demo: setup
	$(BIN)/python examples/fan_out.py

test: setup-dev
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .ruff_cache .pytest_cache build *.egg-info
