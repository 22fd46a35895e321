"""`autotune loop`: the RL loop, a trainer stand-in beside the rollouts."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

from autotune.cli.common import (
    REPORTS,
    ROLLOUTS_FILE,
    add_json,
    add_output_dir,
    add_quiet,
    epilog,
    new_run_dir,
    positive_int,
    print_result,
)
from autotune.cli.options import add_options, spec_of
from autotune.cli.run_args import (
    RUN_DEFAULTS,
    add_metrics_arguments,
    add_target_arguments,
    add_workload_arguments,
    run_config,
)
from autotune.config.rl_specs import LoopSpec
from autotune.errors import AutotuneError, UsageError
from autotune.results.codec import machine_identity, to_json
from autotune.results.runs import LoopResult


def add_parser(commands: Any) -> None:
    loop = commands.add_parser(
        "loop",
        help="run the RL loop: a trainer stand-in beside the rollouts (sync, colocated, async)",
        description="A trainer stand-in takes --batch-groups groups of --num-repeats samples "
        "a step, trains for --train-s (or runs --train-command), then syncs weights: pause "
        "generation, the transfer, the prefix cache cleared, resume. It reports trained "
        "samples/s, where the time went and how stale the trained samples were.",
        epilog=epilog(),
    )
    add_workload_arguments(loop)
    add_target_arguments(loop)
    group = loop.add_argument_group("the trainer and its weight syncs")
    add_options(group, LoopSpec, *LoopSpec.model_fields)
    run = loop.add_argument_group("run")
    run.add_argument(
        "--parallelism",
        type=positive_int,
        default=RUN_DEFAULTS.parallelism,
        help="samples in flight at once, at most (default: every sample of the groups "
        "started, as a trainer sends them)",
    )
    add_output_dir(
        run,
        f"a new {REPORTS}/loop-<date>-<time>; it holds {ROLLOUTS_FILE}, its failures, "
        "groups.jsonl (each group's fate), loop.json and its page, index.html",
    )
    run.add_argument(
        "--no-output", action="store_true", help="measure only: keep no rollout (nothing written)"
    )
    add_metrics_arguments(run, "the loop")
    add_json(run, "the loop's summary")
    add_quiet(run)
    loop.set_defaults(
        handler=run_command,
        output=None,
        resume=False,
        adaptive_concurrency=False,
        max_failure_rate=RUN_DEFAULTS.max_failure_rate,
    )


def run_command(args: argparse.Namespace) -> int:
    from autotune.report.loop_report import RESULT_FILE, write_outputs
    from autotune.report.terminal import loop_summary_text
    from autotune.rl.loop_job import run_loop

    spec = spec_of(args, LoopSpec)
    if args.num_repeats < 2:
        raise UsageError(
            "a trainer takes GRPO groups: pass --num-repeats N (N samples a prompt, at least 2)."
        )
    if not args.no_output:
        args.output_dir = args.output_dir or new_run_dir("loop")
        args.output = args.output_dir / ROLLOUTS_FILE
    live = replace(
        RUN_DEFAULTS.live, metrics_port=args.metrics_port, metrics_host=args.metrics_host
    )
    config = replace(run_config(args), live=live)
    summary = run_loop(config, spec)
    if args.output_dir is not None and not args.no_output:
        result = LoopResult(
            created_at=time.time(),
            summary=summary,
            settings=spec.model_dump(mode="json"),
            machine=machine_identity(),
        )
        try:
            write_outputs(result, args.output_dir)
        except OSError as error:
            raise AutotuneError(
                f"could not write {args.output_dir / RESULT_FILE} or its page "
                f"({error.strerror}); the rollouts are kept and the summary below is the "
                "same figures."
            ) from None
    if args.json:
        print_result(to_json(summary).decode())
    else:
        print_result(loop_summary_text(summary))
        if args.output_dir is not None and not args.no_output and not args.quiet:
            print(f"files: {args.output_dir}/", file=sys.stderr)
    return 0
