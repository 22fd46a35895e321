# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint bench-overhead bench-rss bench-diagnose bench-sweep clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The main jobs on the embedded simulated server: collect, diagnose, sweep (a rerun of the
# sweep resumes its study in studies/demo.db).
demo: setup
	rm -rf reports/collect-demo
	$(BIN)/autotune collect --output reports/collect-demo/rollouts.jsonl --parallelism 64
	$(BIN)/autotune diagnose --report reports/diagnose-demo
	$(BIN)/autotune sweep studies/demo.yaml

lint: setup
	$(BIN)/ruff check autotune tests benchmarks
	$(BIN)/ruff format --check autotune tests benchmarks
	$(BIN)/mypy autotune

test: setup lint
	$(BIN)/python -m pytest -q

bench-overhead: setup
	$(BIN)/python benchmarks/overhead.py

bench-rss: setup
	$(BIN)/python benchmarks/peak_rss.py

bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose_time.py

bench-sweep: setup
	$(BIN)/python benchmarks/sweep_efficiency.py

clean:
	rm -rf $(VENV) reports/demo reports/collect-demo reports/diagnose-demo studies/demo.db .pytest_cache .ruff_cache
