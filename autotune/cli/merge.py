"""`autotune merge`: shard outputs joined without duplicates."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    ROLLOUTS_FILE,
    add_json,
    add_output_dir,
    add_quiet,
    epilog,
    old_spelling,
    print_result,
)
from autotune.errors import UsageError
from autotune.results.codec import to_json


def add_parser(commands: Any) -> None:
    merge = commands.add_parser(
        "merge", help="join shard outputs without duplicates", epilog=epilog()
    )
    merge.add_argument(
        "shards",
        nargs="+",
        type=Path,
        help=f"each shard's rollout JSONL, or the --output-dir holding its {ROLLOUTS_FILE}",
    )
    add_output_dir(merge, f"none: pass one; the merged rows go to DIR/{ROLLOUTS_FILE}")
    merge.add_argument(
        "--output", "-o", type=Path, metavar="FILE", help="deprecated: use --output-dir"
    )
    add_json(merge, "the counts and the output path")
    add_quiet(merge, "no notes, only the result")
    merge.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from autotune.rollout.store import merge_rollouts

    new = f"--output-dir DIR (the rows go to DIR/{ROLLOUTS_FILE})"
    output = old_spelling(args, "output", "--output", ("--output FILE", new))
    if output is None and args.output_dir is not None:
        output = args.output_dir / ROLLOUTS_FILE
    if output is None:
        raise UsageError("merge needs a place for the merged rows; pass --output-dir DIR.")
    shards = [shard / ROLLOUTS_FILE if shard.is_dir() else shard for shard in args.shards]
    written, dropped = merge_rollouts(shards, output)
    if args.json:
        print_result(
            to_json({"output": str(output), "merged": written, "duplicates": dropped}).decode()
        )
    else:
        print_result(f"merged {written} rollouts into {output} ({dropped} duplicates dropped)")
    return 0
