"""`autotune bench`: tuned settings turned into a regression test that CI runs (`bench run`,
`compare`, `update-baseline`, `ab`). Exit codes: 0 no regression, 1 regression, 2 usage
error, 3 baseline missing or not comparable, 4 the benchmark could not run.
How a suite flows from YAML to a verdict: docs/design/bench.md.
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
