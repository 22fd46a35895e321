"""`autotune bench ab`: the baseline measured beside the candidate, in one run, interleaved
pair by pair and judged by a paired test on the pairs' ratios, stopping once every verdict
is clear. Why: docs/design/bench.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from autotune.bench.compare import (
    COULD_NOT_RUN,
    NOT_COMPARABLE,
    REGRESSION,
    AbRecord,
    Comparison,
    check_options,
    compare_results,
)
from autotune.bench.records import BenchResults, CaseResult, Metric, load, save
from autotune.errors import CollectionError, UsageError
from autotune.files import write_whole
from autotune.servers.launcher import PACKAGE_ROOT

MIN_PAIRS = 5  # fewer pairs' spread is too poorly known to end an A/B on
MAX_PAIRS = 12
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Side:
    """One side of the A/B: how to run `autotune bench run` for it."""

    describe: str  # for the reader: "git main (3f2a...)", "server: python -m ..."
    python: str
    env: Mapping[str, str] = field(default_factory=dict)
    run_args: tuple[str, ...] = ()  # extra `bench run` flags (a server command)


def this_side(describe: str = "this autotune", run_args: tuple[str, ...] = ()) -> Side:
    """The code running now (the candidate unless told otherwise)."""
    return Side(describe, sys.executable, {"PYTHONPATH": str(PACKAGE_ROOT)}, run_args)


def command_side(command: str) -> Side:
    """This autotune, every probe case against the server `command` starts."""
    return this_side(f"server: {command}", ("--launch", command))


def python_side(python: str) -> Side:
    """A second install of autotune, run by its own interpreter."""
    path = shutil.which(python) or python
    if not Path(path).exists():
        raise UsageError(f"--baseline-python {python} does not exist; pass an interpreter path.")
    return Side(f"python: {path}", path, {"PYTHONPATH": ""})


def ref_side(ref: str, repo: Path, cache: Path) -> Side:
    """The code of git `ref` in `repo`, in a cached folder with a virtualenv of its own."""
    sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha is None:
        raise UsageError(
            f"--baseline-ref {ref} is not a commit of the repository at {repo}; fetch it "
            "(a shallow clone lacks history) or pass a commit that exists."
        )
    root = cache / "ab" / sha
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f"{sha}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another bench ab may be preparing the same commit
        if not (root / ".ready").exists():
            _prepare(repo, sha, root)
        _share_packages(root, sha)
    return Side(
        f"git {ref} ({sha[:12]})", str(root / "venv" / "bin" / "python"), {"PYTHONPATH": ""}
    )


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    except OSError:
        raise UsageError("--baseline-ref needs git on PATH; install git.") from None
    return done.stdout.strip() if done.returncode == 0 else None


def _prepare(repo: Path, sha: str, root: Path) -> None:
    """Export the commit's tree and make its environment; `.ready` marks a finished one."""
    shutil.rmtree(root, ignore_errors=True)
    source = root / "src"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha], cwd=repo, capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise CollectionError(f"git archive {sha[:12]} failed: {archive.stderr.decode()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    (root / ".ready").touch()


def _share_packages(root: Path, sha: str) -> None:
    """Point the cached baseline at this environment's packages, on every use.

    The cache outlives the environment that made it (a CI clone's venv is deleted after
    the run), so the link is written afresh each time, and whatever the baseline needs
    that this environment lacks is installed into its own venv.
    """
    source, venv = root / "src", root / "venv"
    # The baseline's code first, then this environment's packages (never its autotune: a
    # path line does not run the editable install's hook, and the code comes first).
    shared = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = "\n".join([str(source), *shared]) + "\n"
    write_whole(_site_packages(venv) / "autotune-ab.pth", lines.encode())  # a run may read it
    missing = _missing_requirements(source / "pyproject.toml")
    if missing:
        install = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
        done = subprocess.run([*install, "install", "-q", *missing], capture_output=True)
        if done.returncode != 0:
            raise CollectionError(
                f"the baseline {sha[:12]} needs {', '.join(missing)}, which could not be "
                f"installed ({done.stderr.decode(errors='replace').strip()[-200:]})."
            )


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _missing_requirements(pyproject: Path) -> list[str]:
    """The baseline's dependencies this environment does not satisfy."""
    from packaging.requirements import Requirement

    project = tomllib.loads(pyproject.read_text()).get("project", {})
    missing = []
    for text in project.get("dependencies", []):
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if installed not in requirement.specifier and requirement.specifier:
            missing.append(text)
    return missing


@dataclass(frozen=True, slots=True)
class Settings:
    min_pairs: int = MIN_PAIRS
    max_pairs: int = MAX_PAIRS
    threshold: float | None = None  # None: each case's own
    alpha: float | None = None  # None: the suite's
    ignore: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.min_pairs <= self.max_pairs:
            raise UsageError(
                f"--min-pairs {self.min_pairs} must be at least 1 and at most --max-pairs "
                f"{self.max_pairs}."
            )
        check_options(self.threshold, self.alpha, self.ignore)


def run_ab(
    suite: Path,
    baseline: Side,
    candidate: Side,
    settings: Settings,
    workdir: Path,
    report: Callable[[str], None] | None = None,
) -> Comparison:
    """Measure both sides pair by pair until every verdict is clear; returns the comparison."""
    started = time.monotonic()
    runs: dict[str, list[BenchResults]] = {"baseline": [], "candidate": []}
    sides = {"baseline": baseline, "candidate": candidate}
    comparison: Comparison | None = None
    stopped = f"reached the cap of {settings.max_pairs} pairs"
    for pair in range(settings.max_pairs):
        order = ("baseline", "candidate") if pair % 2 == 0 else ("candidate", "baseline")
        for name in order:
            directory = workdir / f"{name}-{pair + 1}"
            runs[name].append(_run_once(sides[name], suite, directory, name))
        comparison = _compare(runs, sides, settings, pair + 1, stopped, started)
        if report is not None:
            report(f"pair {pair + 1}: " + _progress_line(comparison))
        if any(r.failed for side_runs in runs.values() for r in side_runs):
            stopped = f"a case could not run in pair {pair + 1}"
            break
        if pair + 1 >= settings.min_pairs and _clear(comparison):
            stopped = f"every verdict was clear after {pair + 1} pairs"
            break
    assert comparison is not None and comparison.ab is not None
    save(_merged(runs["baseline"]), workdir / "baseline.json")
    save(_merged(runs["candidate"]), workdir / "candidate.json")
    # The last pair's comparison is the result; only why it stopped is known after it.
    return replace(comparison, ab=replace(comparison.ab, stopped=stopped))


def _run_once(side: Side, suite: Path, directory: Path, name: str) -> BenchResults:
    """One `bench run` of the suite, one repetition of each case, no warm-up; its results
    land in `directory`/results.json (each side's code must take `--output-dir`)."""
    out = directory / "results.json"
    command = [side.python, "-m", "autotune", "bench", "run", str(suite)]
    command += ["--output-dir", str(directory)]
    command += ["--repetitions", "1", "--warmup", "0", "--quiet", *side.run_args]
    env = {**os.environ, **side.env}
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise CollectionError(
            f"the {name}'s bench run took over {RUN_TIMEOUT_S:.0f} s ({side.describe}); "
            "run it by hand to see why."
        ) from None
    if not out.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CollectionError(
            f"the {name}'s bench run failed ({side.describe}): {last}; run it by hand: "
            f"{' '.join(command)}"
        )
    return load(out)


def _merged(runs: list[BenchResults]) -> BenchResults:
    """One BenchResults holding every pair's sample of each case and metric."""
    first = runs[0]
    cases = []
    for case in first.cases:
        seen = [r.case(case.name) for r in runs]
        found = [c for c in seen if c is not None]
        error = next((c.error for c in found if c.error is not None), None)
        metrics = {
            name: Metric(
                metric.unit,
                tuple(s for c in found for s in c.metrics.get(name, Metric("", ())).samples),
            )
            for name, metric in case.metrics.items()
        }
        cases.append(
            replace(
                case,
                metrics={} if error else metrics,
                details=tuple(d for c in found for d in c.details),
                wall_s=sum(c.wall_s for c in found),
                error=error,
            )
        )
    return replace(first, cases=tuple(cases))


def _compare(
    runs: dict[str, list[BenchResults]],
    sides: dict[str, Side],
    settings: Settings,
    pairs: int,
    stopped: str,
    started: float,
) -> Comparison:
    baseline, candidate = _merged(runs["baseline"]), _merged(runs["candidate"])
    record = AbRecord(
        baseline=sides["baseline"].describe,
        candidate=sides["candidate"].describe,
        pairs=pairs,
        looks=settings.max_pairs - settings.min_pairs + 1,
        stopped=stopped,
        pair_ratios=_pair_ratios(baseline, candidate),
        wall_s=time.monotonic() - started,
    )
    return compare_results(
        candidate,
        baseline,
        results_name=f"candidate ({record.candidate})",
        baseline_name=f"baseline ({record.baseline})",
        threshold=settings.threshold,
        alpha=settings.alpha,
        ignore=settings.ignore,
        ab=record,
    )


def _pair_ratios(baseline: BenchResults, candidate: BenchResults) -> dict[str, tuple[float, ...]]:
    """Candidate ÷ baseline of each pair (pair i: the i-th sample of each side)."""
    ratios = {}
    for case in candidate.cases:
        base: CaseResult | None = baseline.case(case.name)
        if base is None:
            continue
        for name, metric in case.metrics.items():
            old = base.metrics.get(name)
            if old is not None:
                pairs = zip(metric.samples, old.samples, strict=False)
                ratios[f"{case.name}/{name}"] = tuple(new / was for new, was in pairs)
    return ratios


def _clear(comparison: Comparison) -> bool:
    """Every verdict settled at the corrected level (its interval is at 1 - alpha / looks):
    more pairs could not change it."""
    for verdict in comparison.verdicts:
        if verdict.verdict in (REGRESSION, COULD_NOT_RUN, NOT_COMPARABLE):
            continue
        if verdict.interval is None or verdict.interval[0] < 1 - verdict.threshold:
            return False  # a fall past the threshold is not yet ruled out
    return True


def _progress_line(comparison: Comparison) -> str:
    parts = []
    for v in comparison.verdicts:
        if v.ratio is None:
            parts.append(f"{v.case}/{v.metric} {v.verdict}")
        else:
            low, high = v.interval or (v.ratio, v.ratio)
            parts.append(f"{v.case}/{v.metric} ×{v.ratio:.3f} [{low:.3f}, {high:.3f}]")
    return "; ".join(parts)
