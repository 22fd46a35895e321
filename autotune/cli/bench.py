"""`autotune bench`: CI regression benchmarks with a statistical gate (run, compare, ab,
update-baseline). Its exit codes are its own: 1 is a regression, never an error."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    REPORTS,
    Terminated,
    add_json,
    add_output_dir,
    add_quiet,
    count,
    inner_share,
    json_choice,
    old_spelling,
    positive_int,
    print_result,
)
from autotune.errors import AutotuneError, UsageError
from autotune.results.codec import to_json


def run_command(args: argparse.Namespace) -> int:
    """Every `bench` command: its own exit codes (1 is a regression, never an error)."""
    from autotune.bench import EXIT_CANNOT_RUN, EXIT_NOT_COMPARABLE, BaselineUnavailable

    try:
        return int(args.bench_handler(args))
    except UsageError:
        raise
    except BaselineUnavailable as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_NOT_COMPARABLE
    except AutotuneError as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except KeyboardInterrupt as interrupt:
        what = "terminated" if isinstance(interrupt, Terminated) else "interrupted"
        print(f"autotune: {what}; no results or outputs were written.", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


def _bench_run(args: argparse.Namespace) -> int:
    from autotune.bench import EXIT_CANNOT_RUN, load_suite, run_suite, save
    from autotune.bench.outputs import run_summary
    from autotune.bench.records import refuse_baseline

    suite = load_suite(args.suite).select(args.case, args.repetitions, args.warmup)
    if args.launch:
        suite = suite.with_launch(args.launch)
    out = _old_out(args, "--out FILE", "results.json") or (
        (args.output_dir or REPORTS / "bench") / "results.json"
    )
    refuse_baseline(out)

    def report(line: str) -> None:
        print(f"bench: {line}", file=sys.stderr, flush=True)

    results = run_suite(suite, None if args.quiet else report)
    save(results, out)
    print_result(to_json(results.to_dict()).decode() if args.json else run_summary(results))
    if not args.quiet:
        print(f"results: {out}", file=sys.stderr)
    if results.failed:
        for case in results.failed:
            print(f"autotune: error: {case.error}", file=sys.stderr)
        print(
            f"autotune: error: {len(results.failed)} of {len(results.cases)} cases could not "
            f"run ({', '.join(c.name for c in results.failed)}); their results hold no sample.",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN
    return 0


def _old_out(args: argparse.Namespace, old: str, file: str) -> Path | None:
    """The path a deprecated `--out` gave (with its note), else None."""
    given = old_spelling(args, "out", "--out", (old, f"--output-dir DIR (it gets DIR/{file})"))
    return Path(given) if given is not None else None


def _bench_compare(args: argparse.Namespace) -> int:
    from autotune.bench import compare_files

    comparison = compare_files(
        args.results, args.baseline, args.threshold, args.alpha, args.ignore_fingerprint
    )
    return _comparison_outputs(comparison, args, args.output_dir)


def _bench_ab(args: argparse.Namespace) -> int:
    from autotune.bench import ab

    if (args.baseline_cmd is None) != (args.candidate_cmd is None):
        raise UsageError("--baseline-cmd and --candidate-cmd go together; pass both.")
    ignore = list(args.ignore_fingerprint)
    candidate = ab.this_side()
    if args.baseline_cmd is not None:
        baseline = ab.command_side(args.baseline_cmd)
        candidate = ab.command_side(args.candidate_cmd)
        ignore = sorted({*ignore, "server"})  # the servers are what is compared
    elif args.baseline_python is not None:
        baseline = ab.python_side(args.baseline_python)
    else:
        ref = args.baseline_ref or _recorded_commit(args.baseline_ref_from)
        baseline = ab.ref_side(ref, args.repo, _cache_dir())
    settings = ab.Settings(
        args.min_pairs, args.max_pairs, args.threshold, args.alpha, tuple(ignore)
    )
    old_out = _old_out(args, "--out DIR", "comparison.json, junit.xml, summary.md, index.html")
    output_dir = args.output_dir or REPORTS / "bench" / "ab"
    pairs = old_out or output_dir  # each pair's results, and both sides' merged
    pairs.mkdir(parents=True, exist_ok=True)

    def report(line: str) -> None:
        print(f"bench ab: {line}", file=sys.stderr, flush=True)

    comparison = ab.run_ab(
        args.suite, baseline, candidate, settings, pairs, None if args.quiet else report
    )
    return _comparison_outputs(comparison, args, None if old_out else output_dir)


def _recorded_commit(baseline: Path) -> str:
    from autotune.bench import load

    commit = (load(baseline).baseline or {}).get("commit")
    if not commit:
        raise UsageError(
            f"{baseline} records no commit; make it with `autotune bench update-baseline` "
            "in a git checkout, or pass --baseline-ref."
        )
    return str(commit)


def _cache_dir() -> Path:
    """Where slow set-ups are kept between runs: $AUTOTUNE_CACHE, else ~/.cache/autotune."""
    return Path(os.environ.get("AUTOTUNE_CACHE") or Path.home() / ".cache" / "autotune")


def _comparison_outputs(comparison: Any, args: argparse.Namespace, output_dir: Path | None) -> int:
    """The terminal table, JSON, JUnit, Markdown, HTML and step summary of a comparison;
    `output_dir` gets every one of them (comparison.json, junit.xml, summary.md,
    index.html)."""
    from autotune.bench import outputs

    table = outputs.markdown(comparison)
    document = to_json(comparison.to_dict()).decode()
    print_json, json_path = json_choice(args)
    written = []
    if output_dir is not None:
        _write_text(output_dir / "comparison.json", document + "\n")
        _write_text(output_dir / "junit.xml", outputs.junit_xml(comparison))
        _write_text(output_dir / "summary.md", table)
        written.append(outputs.write_html(comparison, output_dir))
    if args.junit:
        _write_text(args.junit, outputs.junit_xml(comparison))
    if args.markdown:
        _write_text(args.markdown, table)
    if args.html:
        written.append(outputs.write_html(comparison, args.html))
    if json_path is not None:
        _write_text(json_path, document + "\n")
    print_result(document if print_json else table)
    if not getattr(args, "quiet", False):
        for page in written:
            print(f"report: {page}", file=sys.stderr)
    outputs.append_step_summary(table)
    return comparison.exit_code


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _bench_update_baseline(args: argparse.Namespace) -> int:
    import time

    from autotune.bench import write_baseline

    replaced = args.baseline.exists()
    baseline = write_baseline(args.results, args.baseline, args.reason)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(baseline.created_at))
    if args.json:
        print_result(to_json(baseline.to_dict()).decode())
        return 0
    print(
        f"{'replaced' if replaced else 'wrote'} the baseline {args.baseline} with the "
        f"{len(baseline.cases)} cases of {args.results} ({when}, host "
        f"{baseline.machine.get('host')}); commit it with the change that explains it."
    )
    return 0


def _add_comparison_outputs(parser: argparse.ArgumentParser, output_dir: str) -> None:
    add_output_dir(parser, output_dir)
    add_json(parser, "the comparison", old_path=True)
    parser.add_argument("--junit", type=Path, metavar="PATH", help="also JUnit XML here")
    parser.add_argument(
        "--markdown", type=Path, metavar="PATH", help="also the Markdown table here"
    )
    parser.add_argument("--html", type=Path, metavar="DIR", help="also the HTML report here")


def add_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="CI regression benchmarks with a statistical gate",
        description="Exit codes: 0 no regression, 1 regression, 2 usage error, "
        "3 baseline missing or not comparable, 4 the benchmark could not run.",
    )
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")

    run = bench_commands.add_parser("run", help="measure every case of a suite")
    run.add_argument("suite", type=Path, help="the suite YAML file")
    add_output_dir(run, f"{REPORTS}/bench; it gets results.json")
    run.add_argument("--out", "-o", type=Path, metavar="FILE", help="deprecated: use --output-dir")
    run.add_argument("--case", action="append", metavar="NAME", help="only this case (repeat)")
    run.add_argument("--repetitions", type=positive_int, help="override every case's")
    run.add_argument("--warmup", type=count, help="override every case's warm-up repetitions")
    add_json(run, "the results")
    add_quiet(run, "no progress lines")
    run.add_argument(
        "--launch",
        metavar="CMD",
        help="every probe case against the server CMD starts ({port} where its port goes); "
        "overhead cases are left out",
    )
    run.set_defaults(handler=run_command, bench_handler=_bench_run)

    compare = bench_commands.add_parser(
        "compare", help="judge results against a baseline (exit 1 on a regression)"
    )
    compare.add_argument(
        "results", type=Path, nargs="+", help="results JSON; the newest is judged, all are history"
    )
    compare.add_argument("--baseline", type=Path, required=True, help="the baseline JSON")
    compare.add_argument("--threshold", type=inner_share, help="override each case's, e.g. 0.05")
    compare.add_argument(
        "--alpha", type=inner_share, help="significance level (default: the suite's)"
    )
    compare.add_argument(
        "--ignore-fingerprint",
        action="append",
        default=[],
        metavar="FIELD",
        help="compare across a difference in this field, e.g. server for a vLLM upgrade",
    )
    _add_comparison_outputs(
        compare, "none; a DIR gets comparison.json, junit.xml, summary.md and index.html"
    )
    add_quiet(compare, "no notes, only the result")
    compare.set_defaults(handler=run_command, bench_handler=_bench_compare)

    ab = bench_commands.add_parser(
        "ab",
        help="measure a baseline beside the candidate, interleaved (exit 1 on a regression)",
        description="The baseline is a git ref (--baseline-ref, or the commit a baseline file "
        "records: --baseline-ref-from), another install (--baseline-python), or a server "
        "command (--baseline-cmd, with --candidate-cmd); the candidate is this autotune.",
    )
    ab.add_argument("suite", type=Path, help="the suite YAML file")
    which = ab.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline-ref", metavar="REF", help="a git ref of this repository")
    which.add_argument(
        "--baseline-ref-from",
        type=Path,
        metavar="BASELINE",
        help="the commit recorded in a baseline file (benchmarks/baseline.json)",
    )
    which.add_argument("--baseline-python", metavar="PYTHON", help="another install's python")
    which.add_argument("--baseline-cmd", metavar="CMD", help="the baseline server's command")
    ab.add_argument("--candidate-cmd", metavar="CMD", help="the candidate server's command")
    ab.add_argument(
        "--repo", type=Path, default=Path("."), help="the git repository --baseline-ref names"
    )
    ab.add_argument("--min-pairs", type=positive_int, default=5, help="pairs before stopping")
    ab.add_argument("--max-pairs", type=positive_int, default=12, help="pairs at most")
    ab.add_argument("--threshold", type=inner_share, help="override each case's, e.g. 0.05")
    ab.add_argument("--alpha", type=inner_share, help="significance level (default: the suite's)")
    ab.add_argument(
        "--ignore-fingerprint", action="append", default=[], metavar="FIELD",
        help="compare across a difference in this field (server is ignored with --*-cmd)",
    )  # fmt: skip
    ab.add_argument("--out", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    add_quiet(ab, "no progress lines")
    _add_comparison_outputs(
        ab,
        f"{REPORTS}/bench/ab; it gets each pair's results, both sides' merged results, "
        "comparison.json, junit.xml, summary.md and index.html",
    )
    ab.set_defaults(handler=run_command, bench_handler=_bench_ab)

    update = bench_commands.add_parser(
        "update-baseline", help="make results the new baseline, on purpose"
    )
    update.add_argument("results", type=Path, help="results JSON from `autotune bench run`")
    update.add_argument("--baseline", type=Path, required=True, help="the baseline to write")
    update.add_argument("--reason", required=True, help="why, recorded in the baseline")
    add_json(update, "what was written")
    add_quiet(update, "no notes, only the result")
    update.set_defaults(handler=run_command, bench_handler=_bench_update_baseline)
