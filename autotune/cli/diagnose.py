"""`autotune diagnose`: paired low/high parallelism probes → a bottleneck verdict."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cli.common import (
    EXIT_GATE,
    add_json,
    add_output_dir,
    add_quiet,
    check_writable_dir,
    deprecated,
    epilog,
    json_choice,
    positive_int,
    print_result,
)
from autotune.cli.options import add_options
from autotune.cli.run_args import (
    RUN_DEFAULTS,
    add_batch_arguments,
    add_target_arguments,
    add_workload_arguments,
    run_config,
)
from autotune.config.collection import HIGH_PARALLELISM, LOW_PARALLELISM, ProbeSpec
from autotune.errors import AutotuneError, UsageError
from autotune.results.codec import to_json

if TYPE_CHECKING:
    from autotune.results.diagnosis import DiagnoseResult


def _verdicts(text: str) -> frozenset[str]:
    """`--fail-on`: verdict names, comma-separated, each one classify.VERDICTS holds."""
    from autotune.diagnose.checks import VERDICTS

    names = frozenset(name.strip() for name in text.split(","))
    unknown = sorted(names - set(VERDICTS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, unknown))} is not a verdict; use {', '.join(VERDICTS)}"
        )
    return names


def add_parser(commands: Any) -> None:
    diagnose = commands.add_parser(
        "diagnose",
        help="paired low/high parallelism probes → a bottleneck verdict",
        epilog=epilog("the verdict is one of --fail-on"),
    )
    add_workload_arguments(diagnose)
    add_target_arguments(diagnose)
    add_batch_arguments(diagnose)
    probes = diagnose.add_argument_group("probes")
    probes.add_argument(
        "--low", type=positive_int, default=LOW_PARALLELISM, help="low probe parallelism"
    )
    probes.add_argument(
        "--high", type=positive_int, default=HIGH_PARALLELISM, help="high probe parallelism"
    )
    add_options(probes, ProbeSpec, "min_s", "max_s")
    probes.add_argument(
        "--fail-on",
        type=_verdicts,
        default=frozenset(),
        metavar="VERDICT[,VERDICT]",
        help="exit 3 when the verdict is one of these, e.g. unstable,rate-limited",
    )
    output = diagnose.add_argument_group("output")
    add_output_dir(
        output, "none: the verdict is printed only; a DIR gets diagnose.json and index.html"
    )
    add_json(output, "the result (every probe, the verdict and its evidence)", old_path=True)
    output.add_argument("--report", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    add_quiet(output)
    probes.add_argument(
        "--command",
        metavar="TEMPLATE",
        help="diagnose your own collector instead: a command with {parallelism} and "
        "{output} (the rollout JSONL it writes), optionally {limit} (--limit, default "
        "10 rollouts a slot), e.g. 'ng_collect_rollouts ... +num_samples_in_parallel={parallelism} "
        "+output_jsonl_fpath={output} +limit={limit}'",
    )
    diagnose.set_defaults(
        handler=run_command,
        parallelism=None,
        output=None,
        resume=False,
        adaptive_concurrency=RUN_DEFAULTS.adaptive_concurrency,
        max_failure_rate=RUN_DEFAULTS.max_failure_rate,
    )


def _rescue_json(result: DiagnoseResult) -> str:
    """Saves a measured result where it can go; says where (the end of an error sentence)."""
    try:
        fd, name = tempfile.mkstemp(prefix="autotune-diagnose-", suffix=".json")
        with os.fdopen(fd, "wb") as handle:
            handle.write(to_json(result))
    except OSError:
        return "the summary above is all that was kept; rerun with a writable path."
    return f"the result is saved in {name} instead (`autotune report {name} --output-dir DIR`)."


def run_command(args: argparse.Namespace) -> int:
    from autotune.diagnose.diagnose_job import BLOCKS, DiagnoseConfig, diagnose
    from autotune.processes.event_loop import run_async
    from autotune.report.diagnose_report import write_outputs
    from autotune.report.terminal import diagnose_text, probe_progress
    from autotune.results.codec import save

    config = DiagnoseConfig(
        collect=run_config(args),
        low=args.low,
        high=args.high,
        min_s=args.min_s,
        max_s=args.max_s,
        command=args.command,
    )
    print_json, json_path = json_choice(args)
    output_dir, flag = args.output_dir, "--output-dir"
    if args.report is not None:
        if output_dir is not None:
            raise UsageError("--report is the old spelling of --output-dir; pass only one.")
        deprecated("--report DIR", "--output-dir DIR")
        output_dir, flag = args.report, "--report"
    if json_path is not None:
        if json_path.is_dir():
            raise UsageError(
                f"--json {json_path} is a directory; pass a file, "
                f"e.g. --json {json_path / 'diagnose.json'}."
            )
        check_writable_dir(json_path.parent, f"--json {json_path}")
    if output_dir is not None:
        check_writable_dir(output_dir, f"{flag} {output_dir}")
    blocks = 2 if config.command is not None else BLOCKS  # a command runs once at each
    with probe_progress(enabled=not args.quiet, count=blocks) as watch:
        result = run_async(diagnose(config, watch))
    print_result(to_json(result).decode() if print_json else diagnose_text(result))
    writing = json_path
    try:
        if json_path is not None:
            save(result, json_path)
        if output_dir is not None:
            writing = output_dir
            page = write_outputs(result, output_dir)[-1]
            if not args.quiet:
                print(f"report: {page}", file=sys.stderr)
    except OSError as error:
        raise AutotuneError(
            f"could not write {writing} ({error.strerror}); {_rescue_json(result)}"
        ) from None
    if result.verdict.verdict in args.fail_on:
        print(
            f"autotune: error: the verdict is {result.verdict.verdict}, which --fail-on "
            f"{','.join(sorted(args.fail_on))} fails; its evidence and next step are above.",
            file=sys.stderr,
        )
        return EXIT_GATE
    return 0
