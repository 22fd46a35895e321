"""`autotune sweep`: an Optuna study over parallelism and server knobs → a recommendation."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    REPORTS,
    add_json,
    add_output_dir,
    add_quiet,
    check_writable_dir,
    deprecated,
    epilog,
    positive_int,
    print_result,
)
from autotune.errors import AutotuneError, UsageError
from autotune.results.codec import to_json


def add_parser(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="an Optuna study over parallelism and server knobs → a recommendation",
        epilog=epilog(),
    )
    sweep.add_argument("study", type=Path, nargs="?", help="study YAML (examples in studies/)")
    sweep.add_argument(
        "--schema",
        action="store_true",
        help="print the JSON Schema of a study file (every field, its default) and exit",
    )
    sweep.add_argument(
        "--storage",
        help="Optuna storage URL (default: sqlite studies/NAME.db; "
        "a PostgreSQL URL lets several machines share one study)",
    )
    sweep.add_argument(
        "--studies-dir",
        type=Path,
        default=Path("studies"),
        metavar="DIR",
        help="where the default SQLite storage (NAME.db) and --command runs are kept",
    )
    add_output_dir(
        sweep,
        f"{REPORTS}/NAME, NAME the study's; it gets sweep.json, index.html, trials.csv and "
        "recommendation.json/.yaml",
    )
    sweep.add_argument(
        "--reports-dir",
        type=Path,
        metavar="DIR",
        help="deprecated: the folder above the report folder (use --output-dir DIR/NAME)",
    )
    sweep.add_argument(
        "--num-repeats",
        type=positive_int,
        metavar="N",
        help="rollouts per task, one after another (GRPO groups sharing a prompt), instead of "
        "the study's workload.num_repeats; the study is then NAME-xN, apart from NAME's trials",
    )
    add_json(sweep, "the recommendation")
    add_quiet(sweep)
    sweep.set_defaults(handler=run_command)


def _with_repeats(study: Any, repeats: int | None) -> Any:
    """The study with `--num-repeats`: a workload of other groups is another study, so it
    gets its own name (its own storage and reports) rather than resuming this one's trials."""
    if repeats is None or repeats == study.workload.num_repeats:
        return study
    workload = study.workload.model_copy(update={"num_repeats": repeats})
    return study.model_copy(update={"workload": workload, "name": f"{study.name}-x{repeats}"})


def run_command(args: argparse.Namespace) -> int:
    from autotune.config.study import Study, load_study
    from autotune.probe.launchers import study_launcher
    from autotune.processes.event_loop import run_async
    from autotune.report.terminal import progress_bar, sweep_text, trial_line
    from autotune.results.trials import SweepResult, TrialOutcome
    from autotune.sweep.objectives import objective_for
    from autotune.sweep.sweep_job import check_storage, recommend, run_sweep, write_outputs

    if args.schema:
        print_result(to_json(Study.model_json_schema()).decode())
        return 0
    if args.study is None:
        raise UsageError("autotune sweep needs a study file; pass e.g. studies/demo.yaml.")
    study = _with_repeats(load_study(args.study), args.num_repeats)
    objective = objective_for(study.objective.metric)
    directory, flag = args.output_dir, f"--output-dir {args.output_dir}"
    if args.reports_dir is not None:
        if directory is not None:
            raise UsageError("--reports-dir is the old spelling of --output-dir; pass only one.")
        deprecated("--reports-dir DIR", f"--output-dir DIR/{study.name}")
        directory, flag = args.reports_dir / study.name, f"--reports-dir {args.reports_dir}"
    elif directory is None:
        directory, flag = REPORTS / study.name, f"the report folder {REPORTS / study.name}"
    check_storage(args.storage)
    # Checked now: the reports are written only after every trial has run.
    check_writable_dir(directory, flag)
    if args.storage is None or study.target.kind == "command":  # where studies_dir is used
        check_writable_dir(args.studies_dir, f"--studies-dir {args.studies_dir}")
    with progress_bar(enabled=not args.quiet, unit="trial") as bar:
        bar.set_total(study.budget.trials)

        def on_trial(number: int, outcome: TrialOutcome) -> None:
            if not args.quiet:
                bar.write(trial_line(number, outcome, objective))
            if outcome.copied_from is None:  # a copy is not a trial of the budget
                bar.rollout_done({}, 0)  # after its line, so that a log reads in order

        async def sweep() -> SweepResult:
            async with study_launcher(study, args.studies_dir) as launcher:
                return await run_sweep(
                    study,
                    launcher,
                    storage=args.storage,
                    studies_dir=args.studies_dir,
                    on_trial=on_trial,
                )

        result = run_async(sweep())
    try:
        write_outputs(result, directory)
    except OSError as error:
        raise AutotuneError(
            f"could not write the reports in {directory} ({error.strerror}); the study "
            "storage keeps every trial: rerun the same command with another --output-dir."
        ) from None
    recommended = recommend(result)
    if args.json:
        print_result(to_json(recommended).decode() if recommended else "null")
    else:
        print_result(sweep_text(result, recommended, directory, objective))
    return 0
