# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint bench-overhead bench-rss bench-diagnose clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	rm -f reports/demo/rollouts.jsonl reports/demo/rollouts_failures.jsonl
	$(BIN)/autotune collect --output reports/demo/rollouts.jsonl --parallelism 64
	$(BIN)/autotune diagnose --report reports/demo/diagnose

lint: setup
	$(BIN)/ruff check autotune tests benchmarks
	$(BIN)/ruff format --check autotune tests benchmarks

test: setup lint
	$(BIN)/python -m pytest -q

bench-overhead: setup
	$(BIN)/python benchmarks/overhead.py

bench-rss: setup
	$(BIN)/python benchmarks/peak_rss.py

bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose_time.py

clean:
	rm -rf $(VENV) reports/demo .pytest_cache .ruff_cache
