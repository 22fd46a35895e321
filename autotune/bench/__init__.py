"""`autotune bench`: tuned settings turned into a regression test that CI runs.

    autotune bench run SUITE --output-dir DIR               measure every case
    autotune bench compare results.json --baseline B.json   judge, write the outputs
    autotune bench update-baseline results.json --baseline B.json --reason "..."

suite.py reads the YAML suite → runner.py measures it (probes, or the engine against a
bare loop on the null server: overhead.py) → results.py saves raw samples with
fingerprint.py's environment → compare.py judges them with stats.py (exact Mann-Whitney
U and a bootstrap interval against a saved baseline; a paired t test on the pairs'
ratios for `bench ab`) → outputs.py writes JUnit XML, Markdown and HTML.

Exit codes: 0 no regression, 1 regression, 2 usage error, 3 baseline missing or not
comparable, 4 the benchmark could not run.
"""

from autotune.bench.compare import (
    EXIT_CANNOT_RUN,
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    Comparison,
    Verdict,
    compare_files,
)
from autotune.bench.records import BenchResults, CaseResult, Metric, load, save, write_baseline
from autotune.bench.runner import run_suite
from autotune.bench.suite import Suite, load_suite
from autotune.errors import BaselineUnavailable

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_NOT_COMPARABLE",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "BaselineUnavailable",
    "BenchResults",
    "CaseResult",
    "Comparison",
    "Metric",
    "Suite",
    "Verdict",
    "compare_files",
    "load",
    "load_suite",
    "run_suite",
    "save",
    "write_baseline",
]
