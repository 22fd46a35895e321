"""`autotune collect`: rollouts from tasks, the engine on its own."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    EXIT_GATE,
    REPORTS,
    ROLLOUTS_FILE,
    SUMMARY_FILE,
    add_json,
    add_output_dir,
    add_quiet,
    check_writable_dir,
    deprecated,
    epilog,
    new_run_dir,
    positive_int,
    print_result,
    share,
)
from autotune.cli.run_args import (
    RUN_DEFAULTS,
    add_batch_arguments,
    add_live_arguments,
    add_target_arguments,
    add_workload_arguments,
    live_config,
    run_config,
)
from autotune.errors import AutotuneError, UsageError
from autotune.results.codec import to_json


def add_parser(commands: Any) -> None:
    collect = commands.add_parser(
        "collect",
        help="collect rollouts (the engine on its own)",
        epilog=epilog(
            "the run finished, but no rollout succeeded or a larger share failed than "
            "--max-failure-rate, or throughput drifted under --fail-on drift (the rollouts "
            "collected are kept)"
        ),
    )
    add_workload_arguments(collect)
    add_target_arguments(collect)
    add_batch_arguments(collect)
    run = collect.add_argument_group("run")
    run.add_argument(
        "--parallelism",
        "--num-samples-in-parallel",
        type=positive_int,
        default=RUN_DEFAULTS.parallelism,
        help="rollouts in flight at once (default: unlimited, as in NeMo Gym)",
    )
    add_output_dir(
        run,
        f"a new {REPORTS}/collect-<date>-<time>; it holds {ROLLOUTS_FILE}, its failures and "
        f"run record, and {SUMMARY_FILE}",
    )
    run.add_argument(
        "--no-output",
        action="store_true",
        help="measure only: keep no rollout (nothing is written)",
    )
    run.add_argument(
        "--output", "-o", type=Path, metavar="FILE",
        help="deprecated: the rollout JSONL to append to (use --output-dir)",
    )  # fmt: skip
    run.add_argument(
        "--resume", action="store_true", help="continue the run in --output-dir where it stopped"
    )
    run.add_argument(
        "--max-failure-rate",
        type=share,
        default=RUN_DEFAULTS.max_failure_rate,
        metavar="SHARE",
        help="exit 3 when a larger share of rollouts fails (default: 0.05)",
    )
    run.add_argument(
        "--fail-on",
        choices=["drift"],
        action="append",
        default=[],
        help="exit 3 when the drift watch (--expect, --expect-rate) warned of drift on the "
        "expectation's own workload",
    )
    run.add_argument(
        "--no-adaptive-concurrency",
        dest="adaptive_concurrency",
        action="store_false",
        help="keep --parallelism in flight even when the server answers 429/503",
    )
    add_json(run, "the closing summary")
    add_quiet(run)
    add_live_arguments(collect)
    collect.set_defaults(handler=run_command)


def _outputs(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """(the rollout file, the summary file): DIR/rollouts.jsonl and DIR/summary.json of
    --output-dir (default: a new folder under reports/), the deprecated --output FILE as
    given (no summary file, as before), or neither with --no-output."""
    if args.output is not None:
        if args.output_dir is not None or args.no_output:
            raise UsageError("--output is the old spelling of --output-dir; pass only one.")
        deprecated("--output FILE", f"--output-dir DIR (rollouts go to DIR/{ROLLOUTS_FILE})")
        return Path(args.output), None
    if args.no_output:
        if args.output_dir is not None or args.resume:
            raise UsageError(
                "--no-output keeps nothing, so it takes no --output-dir or --resume; drop one."
            )
        return None, None
    if args.output_dir is None:
        if args.resume:
            raise UsageError(
                "--resume needs the folder of the run to continue; pass its --output-dir, "
                f"e.g. --output-dir {REPORTS}/collect-20260101-120000."
            )
        args.output_dir = new_run_dir("collect")
    return args.output_dir / ROLLOUTS_FILE, args.output_dir / SUMMARY_FILE


def kept_on_interrupt(args: argparse.Namespace) -> str:
    """Where an interrupted collect's rollouts are, and how to go on from there."""
    directory = getattr(args, "output_dir", None)
    if getattr(args, "no_output", False):
        return "nothing was kept (--no-output)"
    if directory is None:
        return "every finished rollout is on disk (rerun with --resume)"
    if not directory.exists():
        return "no rollout had finished"
    return (
        f"every finished rollout is in {directory}/ (rerun with --output-dir {directory} --resume)"
    )


def _remove_if_unused(directory: Path) -> None:
    """The run's own new folder, gone if it failed before its first row (a wrong URL, a
    bad flag), so that a mistake leaves no litter; anything collected stays."""
    from autotune.rollout.store import failures_path

    rows = directory / ROLLOUTS_FILE
    if failures_path(rows).exists() or (rows.exists() and rows.stat().st_size):
        return
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):  # reports/ too, when this run made it and it is empty
        directory.parent.rmdir()


def run_command(args: argparse.Namespace) -> int:
    from autotune.collector.collect_job import failure_gate, run_collect
    from autotune.report.terminal import collect_summary_text, progress_bar

    defaulted = args.output_dir is None and args.output is None and not args.no_output
    args.output, summary_file = _outputs(args)
    if args.report is True:
        if args.output_dir is None:
            raise UsageError(
                "--report without DIR goes in --output-dir, and this run has none "
                "(--no-output or --output FILE); pass --report DIR."
            )
        args.report = args.output_dir
    config = replace(run_config(args), live=live_config(args))
    if args.fail_on and not config.live.drift_watch:
        raise UsageError(
            "--fail-on drift needs the drift watch's expectation; pass --expect "
            "RECOMMENDATION or --expect-rate R."
        )
    if config.live.report is not None:
        check_writable_dir(config.live.report, f"--report {config.live.report}")
    if defaulted:
        logging.getLogger("autotune").info(
            "rollouts go to %s/ (to resume it: --output-dir %s --resume)",
            args.output_dir,
            args.output_dir,
        )
    try:
        with progress_bar(enabled=config.progress, unit="rollout") as bar:
            summary = run_collect(config, progress=bar)
    except BaseException:
        if defaulted:
            _remove_if_unused(args.output_dir)
        raise
    if args.json:
        print_result(to_json(summary).decode())
    else:
        print_result(collect_summary_text(summary))
    if config.live.report is not None and not args.quiet:
        print(f"report: {config.live.report / 'index.html'}", file=sys.stderr)
    if summary_file is not None:
        try:
            summary_file.write_bytes(to_json(summary) + b"\n")
        except OSError as error:
            raise AutotuneError(
                f"could not write {summary_file} ({error.strerror}); the rollouts are kept "
                "and the summary above is the same figures."
            ) from None
    failed = failure_gate(summary, config.max_failure_rate)
    if failed is not None:
        print(f"autotune: error: {failed}", file=sys.stderr)
        return EXIT_GATE
    drift = summary.drift
    if "drift" in args.fail_on and drift is not None and not drift.workload_differs:
        print(
            f"autotune: error: throughput drifted below the expectation {drift.t_s:.0f} s "
            "into the run, which --fail-on drift fails; the warning above says where and "
            "what to run next.",
            file=sys.stderr,
        )
        return EXIT_GATE
    return 0
