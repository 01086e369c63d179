# The two commands the README starts with, and the checks CI runs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TS := tests/ts
NPM_STAMP := $(TS)/node_modules/.installed

.PHONY: run test lint typecheck check bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	@touch $(STAMP)

# The Node peers of the tests (the ACP TypeScript SDK, acpx), exactly as locked: installed
# once here, before pytest's workers start (two workers running npm ci at once collide).
$(NPM_STAMP): $(TS)/package-lock.json $(TS)/package.json
	@command -v npm >/dev/null 2>&1 || { echo "need Node.js and npm (tests run the ACP TypeScript SDK and acpx)"; exit 1; }
	cd $(TS) && npm ci --no-audit --no-fund
	@touch $(NPM_STAMP)

## Start a broker on the embedded store with the demo agent: ws://127.0.0.1:8765/acp
run: $(STAMP)
	$(BIN)/acp-broker serve

## Run the whole test suite (starts its own redis-server processes) on two pytest-xdist
## workers; tests/conftest.py's XDIST_GROUPS keeps the fault and load tests apart.
test: $(STAMP) $(NPM_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=15

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
