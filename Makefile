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
	@# the dashboard's browser tests drive Debian's chromium (Playwright's download is not used)
	test -x /usr/bin/chromium || { apt-get update && apt-get install -y chromium; }

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

# --- AWS Lambda (template.yaml: BuildMethod: makefile) --------------------------------------
# `sam build` runs `make build-<LogicalId>` with ARTIFACTS_DIR set, for each function. The
# artifact is the package as Lambda imports it: lakeshore/ → dreamlake/lakeshore/, handlers/ →
# dreamlake/lakeshore/handlers/ (and worker/, which the package's __init__ imports; not cli/),
# plus the runtime dependencies built for Lambda's arm64 Python 3.12. boto3 is in the runtime.
LAMBDA_DEPS := cloudpickle msgpack aws-lambda-powertools
LAMBDA_PLATFORM := --platform manylinux2014_aarch64 --implementation cp --python-version 3.12 \
	--only-binary=:all:
LAMBDA_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))

.PHONY: build-ApiFunction build-SweeperFunction lambda-code lambda-deps

build-ApiFunction build-SweeperFunction: lambda-code lambda-deps

lambda-code:
	@test -n "$(ARTIFACTS_DIR)" || { echo "make $@: set ARTIFACTS_DIR (sam build does)" >&2; exit 2; }
	rm -rf "$(ARTIFACTS_DIR)/dreamlake"
	mkdir -p "$(ARTIFACTS_DIR)/dreamlake/lakeshore/handlers" "$(ARTIFACTS_DIR)/dreamlake/lakeshore/worker"
	tar -C lakeshore --exclude=__pycache__ -cf - . | tar -C "$(ARTIFACTS_DIR)/dreamlake/lakeshore" -xf -
	tar -C handlers --exclude=__pycache__ -cf - . | tar -C "$(ARTIFACTS_DIR)/dreamlake/lakeshore/handlers" -xf -
	tar -C worker --exclude=__pycache__ -cf - . | tar -C "$(ARTIFACTS_DIR)/dreamlake/lakeshore/worker" -xf -

lambda-deps:
	@test -n "$(ARTIFACTS_DIR)" || { echo "make $@: set ARTIFACTS_DIR (sam build does)" >&2; exit 2; }
	$(LAMBDA_PYTHON) -m pip install -q --disable-pip-version-check --no-compile $(LAMBDA_PLATFORM) \
		-c constraints.txt --target "$(ARTIFACTS_DIR)" $(LAMBDA_DEPS)
	rm -rf "$(ARTIFACTS_DIR)/bin"
