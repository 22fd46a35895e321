"""CPU per rollout of the progress display, ours vs rich; target: ours <= 1% of the engine's.
How it measures, and why: docs/design/benchmarks.md.

    python benchmarks/progress_cost.py [--calls 300000] [--rounds 5] [--paced-s 2]
                                       [--requests 20000] [--concurrency 64] [--e2e-rounds 3]
                                       [--no-e2e] [--rate 5000] [--json] [--check]

Targets: our terminal bar costs at most 1% of the engine's CPU per rollout at the
engine's pace, and the engine keeps 95% of its -q rate with it on (end to end, unless
--no-e2e). Exit status is 0 unless --check is given and a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

import autotune.collector.collect_job
from autotune.bench.overhead import engine_run
from autotune.report.terminal import BAR_EVERY_S, LINE_EVERY_S, progress_bar

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

try:
    import rich
    import rich.console
    import rich.progress
    import rich.text

    RICH_VERSION: str | None = importlib.metadata.version("rich")
except ImportError:
    rich = None  # type: ignore[assignment]
    RICH_VERSION = None

MAX_SHARE_OF_ENGINE_CPU = 0.01  # our bar: at most 1% of the engine's CPU per rollout
MIN_E2E_RATIO = 0.95  # the engine with our bar on keeps 95% of its -q rate
TICK_S = 0.01  # the paced loop finishes a batch of rollouts every 10 ms, then sleeps
DRAWS = 300  # draws timed one after another, to price one draw
TIMINGS: dict[str, float | None] = {"queued": 0.0, "generated": 0.1, "verified": 0.2}

Observer = Any  # rollout_done/rollout_failed/set_total/write: collect.Progress
Display = Callable[[TextIO], AbstractContextManager[Observer]]


# --- the displays -------------------------------------------------------------------------


class _TtyFile(io.TextIOWrapper):
    """A file that says it is a terminal: our bar draws in place on it, as on a TTY."""

    def isatty(self) -> bool:
        return True


@contextmanager
def _sink(path: Path, tty: bool) -> Iterator[TextIO]:
    """Where a display writes: a file, TTY-like or plain (what a pipe or a log looks like)."""
    with open(path, "wb") as raw:
        wrapper = (_TtyFile if tty else io.TextIOWrapper)(raw, encoding="utf-8")
        try:
            yield wrapper
        finally:
            wrapper.flush()
            wrapper.detach()


class _Noop:
    """The baseline: an observer that does nothing."""

    draws_per_s = 0.0

    @property
    def observer(self) -> _Noop:
        return self

    def draw(self) -> None:
        pass

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        pass

    def rollout_failed(self, failure_class: str) -> None:
        pass

    def set_total(self, total: int) -> None:
        pass

    def write(self, line: str) -> None:
        pass


@contextmanager
def noop(stream: TextIO) -> Iterator[Observer]:
    yield _Noop()


class _Ours:
    """Our bar (autotune.report.terminal.Progress) as collect sees it, and how to price a
    draw: `set_total` draws the status at once, as a due tick does."""

    def __init__(self, bar: Any, draws_per_s: float) -> None:
        self._bar = bar
        self.observer = bar  # what collect is given
        self.draws_per_s = draws_per_s
        self.rollout_done = bar.rollout_done
        self.rollout_failed = bar.rollout_failed
        self.set_total = bar.set_total
        self.write = bar.write

    def draw(self) -> None:
        self._bar.set_total(self._bar.total)


@contextmanager
def ours(stream: TextIO) -> Iterator[Observer]:
    """Our bar as `autotune collect` makes it, its stderr being `stream`: redrawn at most
    every BAR_EVERY_S on a terminal, a line every LINE_EVERY_S otherwise."""
    every = BAR_EVERY_S if stream.isatty() else LINE_EVERY_S
    with contextlib.redirect_stderr(stream), progress_bar(enabled=True, unit="rollout") as bar:
        yield _Ours(bar, 1 / every)


@contextmanager
def ours_quiet(stream: TextIO) -> Iterator[Observer]:
    """`autotune collect -q`: our bar disabled, still counting."""
    with progress_bar(enabled=False, unit="rollout") as bar:
        yield _Ours(bar, 0.0)


class RichBar:
    """collect's Progress protocol over a rich.progress.Progress task."""

    def __init__(self, progress: Any, unit: str) -> None:
        self.progress = progress
        self.observer = self
        self._task = progress.add_task(unit, total=None)
        self.failed = 0
        self.draws_per_s = float(progress.live.refresh_per_second)  # its refresh thread's

    def draw(self) -> None:
        """What the refresh thread does each time: render the table (and write it on a
        terminal)."""
        self.progress.refresh()

    def rollout_done(self, timings: dict[str, float | None], output_tokens: int) -> None:
        self.progress.advance(self._task)

    def rollout_failed(self, failure_class: str) -> None:
        self.failed += 1
        self.progress.advance(self._task)

    def set_total(self, total: int) -> None:
        self.progress.reset(self._task, total=total)

    def write(self, line: str) -> None:
        self.progress.console.print(line, markup=False, highlight=False)


def _rich_columns(unit: str) -> list[Any]:
    """Our bar's columns in rich: count, percentage, bar, rate, ETA, elapsed."""
    progress = rich.progress

    class RateColumn(progress.ProgressColumn):
        def render(self, task: Any) -> Any:
            return rich.text.Text(f"{task.speed or 0:,.2f} {unit}s/s")

    return [
        progress.MofNCompleteColumn(),
        progress.TaskProgressColumn(),
        progress.BarColumn(bar_width=20),
        RateColumn(),
        progress.TextColumn("ETA"),
        progress.TimeRemainingColumn(),
        progress.TextColumn("elapsed"),
        progress.TimeElapsedColumn(),
    ]


def rich_display(terminal: bool) -> Display:
    """rich.progress.Progress at its defaults (refresh thread, 10 per second) on a file
    console, `force_terminal` as asked: a TTY's live display, or what a pipe gets."""

    @contextmanager
    def display(stream: TextIO) -> Iterator[Observer]:
        console = rich.console.Console(file=stream, force_terminal=terminal)
        with rich.progress.Progress(*_rich_columns("rollout"), console=console) as progress:
            yield RichBar(progress, "rollout")

    return display


def displays() -> dict[str, tuple[Display, bool]]:
    """Each arm: its display and whether its stream is TTY-like."""
    arms: dict[str, tuple[Display, bool]] = {
        "noop": (noop, False),
        "ours quiet (-q)": (ours_quiet, False),
        "ours tty": (ours, True),
        "ours pipe": (ours, False),
    }
    if rich is not None:
        arms["rich tty"] = (rich_display(terminal=True), True)
        arms["rich pipe"] = (rich_display(terminal=False), False)
    return arms


# --- measures -----------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, Any]:
    med = harness.median(values)
    half = (max(values) - min(values)) / 2
    return {"median": med, "spread": half / med if med else 0.0, "values": values}


def back_to_back(display: Display, tty: bool, calls: int, path: Path) -> dict[str, float]:
    """`calls` updates as fast as they go: wall and CPU µs per update, bytes written."""
    with _sink(path, tty) as stream, display(stream) as bar:
        bar.set_total(calls)
        done = bar.rollout_done
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            done(TIMINGS, 100)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"wall_us": wall / calls * 1e6, "cpu_us": cpu / calls * 1e6}


def draw_cost(display: Display, tty: bool, path: Path) -> dict[str, float]:
    """The wall and CPU µs of one draw (DRAWS timed back to back), and how many a second
    the display makes while rollouts finish."""
    with _sink(path, tty) as stream, display(stream) as bar:
        bar.set_total(1_000_000)
        for _ in range(1000):
            bar.rollout_done(TIMINGS, 100)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(DRAWS):
            bar.draw()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        draws_per_s = bar.draws_per_s
    return {"wall_us": wall / DRAWS * 1e6, "cpu_us": cpu / DRAWS * 1e6, "per_s": draws_per_s}


def paced(display: Display, tty: bool, rate: float, seconds: float, path: Path) -> dict[str, float]:
    """Updates at `rate` a second for `seconds` (a batch every TICK_S, sleeping between):
    this process's CPU µs per update, every thread's (rich's refresh thread) included,
    and the bytes the display wrote a second. A cross-check of the model (the sleeps'
    own CPU, in the no-op's figure too, is noisy next to a fraction of a µs)."""
    per_tick = max(1, round(rate * TICK_S))
    ticks = max(1, round(seconds / TICK_S))
    calls = per_tick * ticks
    with _sink(path, tty) as stream, display(stream) as bar:
        bar.set_total(calls)
        done = bar.rollout_done
        cpu0, t0 = time.process_time(), time.perf_counter()
        due = t0
        for _ in range(ticks):
            for _ in range(per_tick):
                done(TIMINGS, 100)
            due += TICK_S
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stream.flush()
        written = path.stat().st_size
    return {"cpu_us": cpu / calls * 1e6, "rate": calls / wall, "bytes_per_s": written / wall}


def micro(args: argparse.Namespace, rate: float, tmp: Path) -> dict[str, Any]:
    """Per update: back to back, a draw's price, the model at `rate`, the paced check.

    Modelled CPU µs a rollout = an update back to back, less the no-op's (the call
    itself, which any observer costs), plus a draw's CPU × draws a second / `rate`."""
    arms = displays()
    names = list(arms)
    tight: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    draws: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    pace: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for display, tty in arms.values():  # warm-up: imports, first draws
        back_to_back(display, tty, min(args.calls, 20_000), tmp / "warm.out")
    for index, order in enumerate(harness.rotations(names, args.rounds)):
        for name in order:
            display, tty = arms[name]
            tight[name].append(back_to_back(display, tty, args.calls, tmp / "tight.out"))
            draws[name].append(draw_cost(display, tty, tmp / "draw.out"))
            pace[name].append(paced(display, tty, rate, args.paced_s, tmp / "paced.out"))
        harness.log(f"  micro round {index + 1}/{args.rounds} done")
    noop_tight = harness.median([r["cpu_us"] for r in tight["noop"]])
    noop_paced = harness.median([r["cpu_us"] for r in pace["noop"]])
    result: dict[str, Any] = {"back_to_back": {}, "draw": {}, "model": {}, "paced": {}}
    for name in names:
        result["back_to_back"][name] = {
            "wall_us": _spread([r["wall_us"] for r in tight[name]]),
            "cpu_us": _spread([r["cpu_us"] for r in tight[name]]),
        }
        draw_cpu = _spread([r["cpu_us"] for r in draws[name]])
        draws_per_s = draws[name][0]["per_s"]
        result["draw"][name] = {
            "wall_us": _spread([r["wall_us"] for r in draws[name]]),
            "cpu_us": draw_cpu,
            "per_s": draws_per_s,
        }
        update = result["back_to_back"][name]["cpu_us"]["median"] - noop_tight
        drawing = draw_cpu["median"] * draws_per_s / rate
        result["model"][name] = {
            "update_us": update,
            "drawing_us": drawing,
            "cpu_us_per_rollout": update + drawing,
        }
        above = [r["cpu_us"] - noop_paced for r in pace[name]]
        result["paced"][name] = {
            "cpu_us": _spread([r["cpu_us"] for r in pace[name]]),
            "cpu_us_above_noop": harness.median(above),
            "cpu_us_above_noop_values": above,
            "rate": harness.median([r["rate"] for r in pace[name]]),
            "bytes_per_s": harness.median([r["bytes_per_s"] for r in pace[name]]),
        }
    return result


_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def _top_level_imports(code: str) -> list[tuple[str, int]]:
    """(module, cumulative µs) of each import `code` makes at the top level, from
    `python -X importtime` (what Python's own start-up imports comes before them)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=harness.REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    found = []
    for line in done.stderr.splitlines():
        match = _IMPORTTIME.match(line)
        if match and not match.group(3):
            found.append((match.group(4), int(match.group(2))))
    return found


def import_times(runs: int) -> dict[str, Any]:
    """ms to import our module, rich.progress alone, and rich.progress after ours (shared
    modules already loaded: what collect would pay); plus the wall time of a whole
    `python -c` of each, less that of `python -c pass`."""
    ours_ms, rich_ms, rich_after_ours_ms = [], [], []
    walls: dict[str, list[float]] = {"pass": [], "ours": [], "rich": []}
    codes = {"pass": "pass", "ours": "import autotune.report.terminal"}
    if rich is not None:
        codes["rich"] = "import rich.progress"
    for order in harness.rotations(list(codes), runs):
        for name in order:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", codes[name]], cwd=harness.REPO, check=True)
            walls[name].append((time.perf_counter() - t0) * 1e3)
        both = _top_level_imports(
            "import autotune.report.terminal" + ("; import rich.progress" if rich else "")
        )
        if rich is None:
            ours_ms.append(sum(us for mod, us in both if mod.startswith("autotune")) / 1e3)
            continue
        first = next(i for i, (mod, _) in enumerate(both) if mod.startswith("autotune"))
        cut = next(i for i, (mod, _) in enumerate(both) if mod.startswith("rich"))
        ours_ms.append(sum(us for _, us in both[first:cut]) / 1e3)
        rich_after_ours_ms.append(sum(us for _, us in both[cut:]) / 1e3)
        alone = _top_level_imports("import rich.progress")
        start = next(i for i, (mod, _) in enumerate(alone) if mod.startswith("rich"))
        rich_ms.append(sum(us for _, us in alone[start:]) / 1e3)
    base = harness.median(walls["pass"])
    result: dict[str, Any] = {
        "runs": runs,
        "ours_ms": _spread(ours_ms),
        "python_c_pass_ms": base,
        "ours_wall_ms_above_pass": harness.median(walls["ours"]) - base,
    }
    if rich is not None:
        result["rich_ms"] = _spread(rich_ms)
        result["rich_after_ours_ms"] = _spread(rich_after_ours_ms)
        result["rich_wall_ms_above_pass"] = harness.median(walls["rich"]) - base
    return result


def _installed(name: str, seen: dict[str, dict[str, Any]]) -> None:
    """`name` and what it requires (no extras), with installed sizes, into `seen`."""
    from packaging.requirements import Requirement

    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    size = sum(os.path.getsize(p) for f in dist.files or [] if os.path.isfile(p := f.locate()))
    requires = []
    for text in dist.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requires.append(requirement.name)
    seen[key] = {"version": dist.version, "mb": size / 1e6, "requires": requires}
    for requirement_name in requires:
        _installed(requirement_name, seen)


def rich_weight() -> dict[str, Any] | None:
    """What `pip install rich` brings: packages, versions, installed size; and which of them
    autotune's own dependencies already need."""
    if rich is None:
        return None
    packages: dict[str, dict[str, Any]] = {}
    _installed("rich", packages)
    ours: dict[str, dict[str, Any]] = {}
    _installed("rollout-autotune", ours)
    new = {name: p for name, p in packages.items() if name not in ours}
    return {
        "packages": packages,
        "new_to_autotune": sorted(new),
        "new_mb": sum(p["mb"] for p in new.values()),
    }


def end_to_end(
    args: argparse.Namespace, tmp: Path, client_core: int | None, server_core: int | None
) -> dict[str, Any]:
    """engine_run (the engine of `autotune collect`, null server on its own core) with each
    display as collect's progress; rollouts/s and this process's CPU µs a rollout."""
    arms = {name: arm for name, arm in displays().items() if name != "noop"}
    real_run_collect = autotune.collector.collect_job.run_collect
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    with harness.null_server(server_core) as server:

        def collect_with(display: Display, tty: bool, total: int) -> Any:
            used = []
            with _sink(tmp / "e2e.out", tty) as stream, display(stream) as bar:

                def run_collect(config: Any, progress: Any = None) -> Any:
                    used.append(bar)
                    return real_run_collect(config, progress=bar.observer)

                # engine_run imports run_collect when called: this hands it our display.
                with mock.patch.object(autotune.collector.collect_job, "run_collect", run_collect):
                    run = engine_run(server.base_url, args.concurrency, total, tmp)
            if not used:
                raise RuntimeError(
                    "engine_run did not go through autotune.collector.collect_job.run_collect"
                )
            return run

        collect_with(ours_quiet, False, args.warmup)
        for index, order in enumerate(harness.rotations(list(arms), args.e2e_rounds)):
            for name in order:
                run = collect_with(*arms[name], args.requests)
                runs[name].append(asdict(run))
                harness.log(
                    f"  e2e round {index + 1}/{args.e2e_rounds}: {name:16} {run.per_s:8,.0f}/s"
                    f"  cpu {run.cpu_s / run.requests * 1e6:6.1f} µs/rollout  failed {run.failed}"
                )
    result: dict[str, Any] = {
        "client_core": client_core,
        "server_core": server_core,
        "requests_per_run": args.requests,
        "concurrency": args.concurrency,
        "rounds": args.e2e_rounds,
        "arms": {},
    }
    quiet = harness.median([r["per_s"] for r in runs["ours quiet (-q)"]])
    quiet_cpu = harness.median([r["cpu_s"] / r["requests"] * 1e6 for r in runs["ours quiet (-q)"]])
    for name, arm_runs in runs.items():
        rate = _spread([r["per_s"] for r in arm_runs])
        cpu = _spread([r["cpu_s"] / r["requests"] * 1e6 for r in arm_runs])
        result["arms"][name] = {
            "rollouts_per_s": rate,
            "cpu_us_per_rollout": cpu,
            "rate_vs_quiet": rate["median"] / quiet,
            "cpu_vs_quiet": cpu["median"] / quiet_cpu,
            "failed": sum(r["failed"] for r in arm_runs),
        }
    result["engine_cpu_us_per_rollout"] = quiet_cpu
    result["engine_rollouts_per_s"] = quiet
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    client_core, server_core = harness.pin_client()
    if rich is None:
        harness.log("rich is not installed: measuring autotune's own display only")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        e2e = None if args.no_e2e else end_to_end(args, tmp, client_core, server_core)
        rate = e2e["engine_rollouts_per_s"] if e2e else args.rate
        engine_cpu_us = e2e["engine_cpu_us_per_rollout"] if e2e else 1e6 / args.rate
        micro_result = micro(args, rate, tmp)
    imports = import_times(args.import_runs)
    shares = {
        name: figures["cpu_us_per_rollout"] / engine_cpu_us
        for name, figures in micro_result["model"].items()
    }
    return {
        "benchmark": "progress_cost",
        "schema_version": 1,
        "machine": harness.machine(),
        "client_core": client_core,
        "rich": RICH_VERSION,
        "env": {key: os.environ.get(key) for key in ("TERM", "NO_COLOR", "COLUMNS")},
        "calls": args.calls,
        "rounds": args.rounds,
        "paced_s": args.paced_s,
        "paced_rate": rate,
        "engine_cpu_us_per_rollout": engine_cpu_us,
        "engine_cpu_measured": e2e is not None,
        "micro": micro_result,
        "share_of_engine_cpu": shares,
        "imports": imports,
        "rich_weight": rich_weight(),
        "end_to_end": e2e,
    }


def targets(result: dict[str, Any]) -> list[harness.Target]:
    """Our terminal bar's modelled share of the engine's CPU, and (where measured) the
    engine's rate with it on against -q."""
    share = result["share_of_engine_cpu"]["ours tty"]
    found = [
        harness.Target(
            "our tty bar / the engine's CPU a rollout",
            share,
            MAX_SHARE_OF_ENGINE_CPU,
            "<=",
            "%",
            ".2%",
        )
    ]
    if result["end_to_end"] is not None:
        ratio = result["end_to_end"]["arms"]["ours tty"]["rate_vs_quiet"]
        found.append(
            harness.Target("engine rollouts/s, tty bar / -q", ratio, MIN_E2E_RATIO, ">=", "%")
        )
    return found


MICRO_TABLE = harness.Table(
    "µs:<18 | wall:8.3f | CPU:8.3f | ±:8.0% | CPU:10.1f | ±:6.0% | /s:6.1f | model CPU:12.3f "
    "| engine share:14.2% | paced:12.2f | bytes/s:10,.0f"
)
E2E_TABLE = harness.Table(
    ":<18 | rollouts/s:12,.0f | ±:6.0% | vs -q:8.1% | CPU µs/rollout:16.1f | ±:6.0% | vs -q:8.1%"
)


def render(result: dict[str, Any]) -> str:
    """The figures as small tables."""
    micro_result = result["micro"]
    engine_us = result["engine_cpu_us_per_rollout"]
    source = "measured, -q" if result["engine_cpu_measured"] else "assumed from --rate"
    lines = [
        f"progress display cost: autotune's bar vs rich {result['rich'] or '(not installed)'}, "
        f"one core (core {result['client_core']})",
        f"engine CPU per rollout: {engine_us:.1f} µs ({source}); "
        f"displays priced at {result['paced_rate']:,.0f} rollouts/s",
        "",
        f"{'':18}{'one update':>24}{'one draw':>22}{'per rollout at that rate':>38}",
    ]
    rows = []
    for name, tight in micro_result["back_to_back"].items():
        draw = micro_result["draw"][name]
        paced_figures = micro_result["paced"][name]
        rows.append(
            (
                name,
                tight["wall_us"]["median"],
                tight["cpu_us"]["median"],
                tight["cpu_us"]["spread"],
                draw["cpu_us"]["median"],
                draw["cpu_us"]["spread"],
                draw["per_s"],
                micro_result["model"][name]["cpu_us_per_rollout"],
                result["share_of_engine_cpu"][name],
                paced_figures["cpu_us_above_noop"],
                paced_figures["bytes_per_s"],
            )
        )
    lines += MICRO_TABLE.lines(rows)
    lines.append(
        "model CPU: one update less the no-op's + one draw × draws/s ÷ rate; paced: CPU µs a "
        f"rollout above the no-op, {result['paced_s']:g} s at that rate (threads included)"
    )
    imports = result["imports"]
    lines += ["", f"import (python -X importtime, median of {imports['runs']}):"]
    lines.append(
        f"  autotune.report.terminal {imports['ours_ms']['median']:6.1f} ms"
        f"  (python -c: +{imports['ours_wall_ms_above_pass']:.0f} ms over `pass`)"
    )
    if "rich_ms" in imports:
        lines.append(
            f"  rich.progress alone      {imports['rich_ms']['median']:6.1f} ms"
            f"  (python -c: +{imports['rich_wall_ms_above_pass']:.0f} ms over `pass`)"
        )
        lines.append(
            f"  rich.progress after ours {imports['rich_after_ours_ms']['median']:6.1f} ms"
            "  (what collect would add)"
        )
    weight = result["rich_weight"]
    if weight is None:
        lines.append("rich is not installed: only autotune's own display was measured")
    else:
        packages = ", ".join(
            f"{name} {p['version']} ({p['mb']:.1f} MB)" for name, p in weight["packages"].items()
        )
        lines += [
            f"rich installs: {packages}",
            f"  new to autotune's dependencies: {', '.join(weight['new_to_autotune'])} "
            f"({weight['new_mb']:.1f} MB)",
        ]
    e2e = result["end_to_end"]
    if e2e is not None:
        lines += [
            "",
            f"end to end: engine_run on the null server, {e2e['requests_per_run']:,} rollouts, "
            f"concurrency {e2e['concurrency']}, {e2e['rounds']} rounds",
        ]
        rows = [
            (
                name,
                arm["rollouts_per_s"]["median"],
                arm["rollouts_per_s"]["spread"],
                arm["rate_vs_quiet"],
                arm["cpu_us_per_rollout"]["median"],
                arm["cpu_us_per_rollout"]["spread"],
                arm["cpu_vs_quiet"],
            )
            for name, arm in e2e["arms"].items()
        ]
        lines += E2E_TABLE.lines(rows)
    else:
        lines.append("\nend to end: not measured (--no-e2e)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__, rounds=5)  # rounds of the per-update runs
    count, positive = harness.count, harness.positive
    parser.add_argument("--calls", type=count, default=300_000, help="updates a back-to-back run")
    parser.add_argument("--paced-s", type=positive, default=2.0, help="seconds a paced run")
    parser.add_argument(
        "--rate",
        type=positive,
        default=5000.0,
        help="paced updates/s when --no-e2e (else measured)",
    )
    parser.add_argument("--requests", type=count, default=20_000, help="rollouts an e2e run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--e2e-rounds", type=count, default=3)
    parser.add_argument("--warmup", type=count, default=2_000, help="rollouts before e2e round 1")
    parser.add_argument("--import-runs", type=count, default=7)
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end runs")
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
