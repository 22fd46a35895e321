"""Command line: parse, build one validated config, call one function, print.

No measuring happens here. Every error a user can cause arrives as an AutotuneError
(or is a flag argparse refuses) and leaves as one `autotune: error:` sentence on stderr
with a non-zero exit code; the codes are in autotune.errors' docstring and each
command's `--help`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from autotune import __version__
from autotune.config import (
    PROBE_DEFAULTS,
    CollectConfig,
    LiveConfig,
    Shard,
    SyntheticWorkload,
    TargetConfig,
)
from autotune.errors import AutotuneError, UsageError
from autotune.helpformat import DefaultsHelpFormatter
from autotune.results import to_json

if TYPE_CHECKING:
    from autotune.results import DiagnoseResult

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_GATE = 3  # the run finished but fails its gate (--max-failure-rate, --fail-on)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM ended
# What an interrupted (Ctrl-C) or terminated (SIGTERM) job leaves behind, by command.
_KEPT_ON_INTERRUPT = {
    "collect": "every finished rollout is on disk (rerun with --resume)",
    "sweep": "every finished trial is kept in the study storage (rerun the same command to resume)",
    "diagnose": "nothing was written",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt, so that both stop the same way:
    output flushed, worker processes and launched servers stopped (see run_async)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


_EXIT_CODES = (
    "exit status: 0 done; 1 a runtime error (one sentence on stderr); 2 a usage error "
    "(a bad flag, file or spec); {gate}130 interrupted (Ctrl-C); 143 terminated (SIGTERM)."
)


def _epilog(gate: str = "") -> str:
    """The exit-code paragraph of a command's --help; `gate` says what exit 3 means."""
    return _EXIT_CODES.format(gate=f"3 {gate}; " if gate else "")


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one `autotune: error:` sentence like every other error (no
    usage block: the sentence names the flag and points at --help), its --help saying each
    flag's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"autotune: error: {message}; see `{self.prog} --help`.\n")


# -- the output convention: a job's files go in --output-dir; --json prints its result ---

REPORTS = Path("reports")
ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"  # collect's closing summary, beside its rollouts


def _deprecated(old: str, new: str) -> None:
    """The note an old spelling earns: it works for this release, not the next."""
    print(f"autotune: note: {old} is deprecated and goes in the next release; use {new}.",
          file=sys.stderr)  # fmt: skip


def _add_output_dir(parser: argparse._ActionsContainer, default: str) -> None:
    parser.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help=f"the folder this command writes its files in (default: {default})",
    )


def _add_json(parser: argparse._ActionsContainer, what: str, old_path: bool = False) -> None:
    """`--json`: the result on stdout, machine-readable, instead of the text for people.
    `old_path`: the command once took `--json PATH`, which still saves there."""
    help_text = f"print {what} as JSON on stdout instead of the text summary"
    if not old_path:
        parser.add_argument("--json", action="store_true", help=help_text)
        return
    parser.add_argument(
        "--json",
        nargs="?",
        const=True,
        default=False,
        metavar="PATH",
        help=f"{help_text} (`--json PATH`, deprecated, saves it to PATH instead)",
    )


def _json_choice(args: argparse.Namespace) -> tuple[bool, Path | None]:
    """(print JSON on stdout, the file a deprecated `--json PATH` saves it to)."""
    if isinstance(args.json, bool):
        return args.json, None
    if args.json == "-":
        _deprecated("--json -", "--json")
        return True, None
    _deprecated("--json PATH", "--output-dir DIR, or --json > PATH")
    return False, Path(args.json)


def _new_run_dir(command: str) -> Path:
    """reports/<command>-<date>-<time>, a folder no earlier run has used."""
    import time

    stem = REPORTS / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = stem, 1
    while candidate.exists():
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return candidate


def _mean_std(text: str) -> tuple[int, int]:
    """'256' or '256,64' → (mean, std)."""
    try:
        parts = [int(p) for p in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts.append(parts[0] // 4)
    if len(parts) != 2 or parts[0] < 1 or parts[1] < 0:
        raise argparse.ArgumentTypeError(
            f"must be MEAN or MEAN,STD in tokens (mean at least 1, std at least 0), not {text!r}"
        )
    return parts[0], parts[1]


def _whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(
                f"must be a whole number of at least {least}, not {text!r}"
            )
        return value

    return parse


def _real(expected: str, within: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a finite number `within` its range (`expected` names it)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and within(value)):
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text!r}")
        return value

    return parse


_positive_int = _whole(1)
_count = _whole(0)
_positive = _real("a number above 0", lambda value: value > 0)
_non_negative = _real("a number of at least 0", lambda value: value >= 0)
_share = _real("a share from 0 to 1", lambda value: 0 <= value <= 1)
_inner_share = _real("a number above 0 and below 1", lambda value: 0 < value < 1)


def _verdicts(text: str) -> frozenset[str]:
    """`--fail-on`: verdict names, comma-separated, each one classify.VERDICTS holds."""
    from autotune.classify import VERDICTS

    names = frozenset(name.strip() for name in text.split(","))
    unknown = sorted(names - set(VERDICTS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, unknown))} is not a verdict; use {', '.join(VERDICTS)}"
        )
    return names


# One set of defaults: the configs' own (the flags only say them again in --help).
_DEFAULTS = CollectConfig()


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every job that talks to a model server."""
    group = parser.add_argument_group("model server")
    group.add_argument(
        "--base-url",
        action="append",
        metavar="URL",
        help="OpenAI-compatible base URL, e.g. http://host:8000/v1 "
        "(default: start the embedded simulated vLLM-like server); repeat it for replicas "
        "of one model: each call goes to the one with the fewest calls in flight, and a "
        "replica that stops answering is taken out of rotation",
    )
    group.add_argument(
        "--replica-gpus",
        action="append",
        metavar="I,J",
        help="the GPU indices the matching --base-url runs on (repeat it, in the same "
        "order), so NVML readings are reported per replica, e.g. --replica-gpus 0,1",
    )
    group.add_argument(
        "--agent-url",
        metavar="URL",
        help="a running NeMo Gym agent server instead, e.g. http://host:port (an agent of "
        "ng_run's /server_instances): each rollout is one POST /run, made and verified there",
    )
    group.add_argument(
        "--metrics-url",
        metavar="URL",
        help="the model server's Prometheus /metrics when not beside --base-url (with "
        "--agent-url: the vLLM the agent calls), e.g. http://host:8000/metrics",
    )
    group.add_argument("--model", help="model name (default: the server's first model)")
    group.add_argument(
        "--api",
        choices=("chat", "completions"),
        default="chat",
        help="/v1/chat/completions or /v1/completions",
    )
    group.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="non-streaming calls (no time-to-first-token)",
    )
    group.add_argument(
        "--extra-body", metavar="JSON", help="extra request fields, e.g. '{\"ignore_eos\": true}'"
    )
    group.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (never printed)",
    )
    group.add_argument(
        "--timeout", type=_positive, default=600.0, metavar="SECONDS", help="per-request timeout"
    )
    group.add_argument(
        "--idle-timeout",
        type=_positive,
        default=_DEFAULTS.target.idle_timeout_s,
        metavar="SECONDS",
        help="a stream silent this long after its first byte has stalled: that attempt fails "
        "(default: 60)",
    )
    group.add_argument(
        "--max-retries", type=_count, default=3, help="retries of a failed model call"
    )
    group.add_argument(
        "--pool-limit", type=_positive_int, default=1024, help="most open connections"
    )
    group.add_argument("--rpm", type=_positive, help="requests per minute limit")
    group.add_argument("--tpm", type=_positive, help="tokens per minute limit")
    group.add_argument(
        "--sim-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the embedded simulator, e.g. --sim-arg=--max-num-seqs=32",
    )


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tasks and verifier")
    group.add_argument(
        "--input",
        "-i",
        type=Path,
        help="task JSONL: NeMo Gym, {messages: [...]} or {prompt: ...} rows "
        "(default: a synthetic workload)",
    )
    group.add_argument(
        "--synthetic",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="number of synthetic tasks when no --input is given",
    )
    group.add_argument(
        "--prompt-tokens",
        type=_mean_std,
        default=(256, 64),
        metavar="MEAN[,STD]",
        help="synthetic prompt lengths, normal (STD: a quarter of MEAN when left out)",
    )
    group.add_argument(
        "--output-tokens",
        type=_mean_std,
        default=(256, 64),
        metavar="MEAN[,STD]",
        help="synthetic output lengths (max_tokens; ignore_eos on the simulator)",
    )
    group.add_argument("--seed", type=_count, default=0, help="seed of the synthetic tasks")
    group.add_argument("--limit", type=_count, help="only the first N tasks")
    group.add_argument(
        "--num-repeats", type=_positive_int, default=1, help="rollouts per task (GRPO groups)"
    )
    group.add_argument("--shard", type=str, metavar="i/N", help="the i-th of N contiguous slices")
    group.add_argument(
        "--verifier",
        default=None,
        help="none | exact | boxed | mcqa | code | synthetic | file.py:function | "
        "package.module:function | http(s)://host:port/verify "
        "(default: synthetic without --input, else none)",
    )
    group.add_argument(
        "--verifier-workers",
        type=_positive_int,
        help="processes for pool verifiers, connections for HTTP ones",
    )
    group.add_argument(
        "--verifier-cost-ms",
        type=_non_negative,
        default=0.0,
        help="CPU milliseconds the synthetic verifier burns per rollout",
    )
    group.add_argument(
        "--verifier-timeout",
        type=_positive,
        default=_DEFAULTS.verifier_timeout_s,
        metavar="SECONDS",
        help="longest one verification by a user function or an HTTP verifier may take; "
        "a stuck function's worker is replaced (default: 60)",
    )
    group.add_argument(
        "--tools",
        metavar="URL",
        help="multi-turn rollouts: the NeMo Gym resources server whose tools the model may "
        "call (http://host:port; each call is POST /NAME, as NeMo Gym's simple agent makes "
        "it), or null (every call answered at once, to measure the engine)",
    )
    group.add_argument(
        "--max-turns",
        type=_positive_int,
        default=_DEFAULTS.max_turns,
        metavar="N",
        help=f"model calls per multi-turn rollout, at most (default: {_DEFAULTS.max_turns})",
    )


def _port(text: str) -> int:
    """An argparse type: a TCP port to listen on."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, not {text!r}")
    return value


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """`collect`'s flags for watching a run while it runs (autotune/live/)."""
    live = _DEFAULTS.live
    group = parser.add_argument_group("while it runs: metrics, stats, drift watch, report")
    group.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics of the run at http://HOST:PORT/metrics while it runs",
    )
    group.add_argument(
        "--metrics-host",
        default=live.metrics_host,
        metavar="HOST",
        help="the address --metrics-port listens on (default: 127.0.0.1, this machine only)",
    )
    group.add_argument(
        "--metrics-linger",
        type=_non_negative,
        default=live.metrics_linger_s,
        metavar="SECONDS",
        help="after the run, serve until one more scrape reads the final figures, at most "
        "this long (default: 0)",
    )
    group.add_argument(
        "--stats-every",
        type=_positive,
        metavar="SECONDS",
        help="append the run's figures as a JSON line to <output>_stats.jsonl this often; "
        "the last line holds the closing summary",
    )
    expect = group.add_mutually_exclusive_group()
    expect.add_argument(
        "--expect",
        type=Path,
        metavar="RECOMMENDATION",
        help="warn when steady-state throughput drifts below a sweep's prediction "
        "(reports/<study>/recommendation.json)",
    )
    expect.add_argument(
        "--expect-rate",
        type=_positive,
        metavar="R",
        help="warn when steady-state throughput drifts below R rollouts/s",
    )
    group.add_argument(
        "--drift-window",
        type=_positive,
        default=live.drift_window_s,
        metavar="SECONDS",
        help="the drift watch's window (default: 16 mean rollout latencies, at least 60 s, "
        "so a window holds 8 batches of completions)",
    )
    group.add_argument(
        "--drift-windows",
        type=_positive_int,
        default=live.drift_windows,
        metavar="N",
        help="warn once after N windows in a row below the expectation (default: 3)",
    )
    group.add_argument(
        "--report",
        type=Path,
        nargs="?",
        const=True,  # no DIR: the run's --output-dir
        metavar="DIR",
        help="at the end, write collect.json and an HTML report (throughput, stage latency "
        "and errors over the run) in DIR (default: the --output-dir)",
    )


def _live_config(args: argparse.Namespace) -> LiveConfig:
    return LiveConfig(
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_linger_s=args.metrics_linger,
        stats_every_s=args.stats_every,
        expect=args.expect,
        expect_rate=args.expect_rate,
        drift_window_s=args.drift_window,
        drift_windows=args.drift_windows,
        report=args.report,
    )


def _target_config(args: argparse.Namespace) -> TargetConfig:
    extra_body: dict[str, Any] = {}
    if args.extra_body:
        try:
            extra_body = orjson.loads(args.extra_body)
        except orjson.JSONDecodeError as error:
            raise UsageError(
                f"--extra-body is not valid JSON ({error}); quote it as one JSON object."
            ) from None
        if not isinstance(extra_body, dict):
            raise UsageError("--extra-body must be a JSON object, e.g. '{\"ignore_eos\": true}'.")
    from autotune.target import base_url_problem

    base_urls: list[str] = args.base_url or []
    for flag, url, example in (
        *(("--base-url", url, "http://host:8000/v1") for url in base_urls),
        ("--agent-url", args.agent_url, "http://host:port"),
        ("--metrics-url", args.metrics_url, "http://host:8000/metrics"),
    ):
        problem = base_url_problem(url) if url is not None else None
        if problem is not None:
            raise UsageError(f"{flag} {url} {problem}, e.g. {example}.")
    if args.agent_url is not None and base_urls:
        raise UsageError(
            "--agent-url and --base-url both say where rollouts go; pass one "
            "(the agent calls its own model server)."
        )
    return TargetConfig(
        agent_url=args.agent_url,
        metrics_url=args.metrics_url,
        base_url=base_urls[0] if base_urls else None,
        replica_urls=_replica_urls(base_urls, args.metrics_url),
        replica_gpus=_replica_gpus(args.replica_gpus or [], len(base_urls)),
        model=args.model,
        api=args.api,
        stream=args.stream,
        api_key_env=args.api_key_env,
        extra_body=extra_body,
        request_timeout_s=args.timeout,
        idle_timeout_s=args.idle_timeout,
        max_retries=args.max_retries,
        pool_limit=args.pool_limit,
        rpm=args.rpm,
        tpm=args.tpm,
        sim_args=tuple(args.sim_arg),
    )


def _replica_urls(base_urls: list[str], metrics_url: str | None) -> tuple[str, ...]:
    """Every --base-url when several are given (replicas of one model), else none."""
    if len(base_urls) < 2:
        return ()
    seen = {url.rstrip("/") for url in base_urls}
    if len(seen) < len(base_urls):
        raise UsageError(
            "--base-url names the same server twice; give each replica once "
            "(to send it more calls, raise --parallelism)."
        )
    if metrics_url is not None:
        raise UsageError(
            "--metrics-url names one server's /metrics, but several --base-url are given; "
            "drop it: each replica's /metrics is read beside its base URL."
        )
    return tuple(base_urls)


def _replica_gpus(values: list[str], replicas: int) -> tuple[tuple[int, ...], ...]:
    """--replica-gpus, one per --base-url: comma-separated GPU indices."""
    if not values:
        return ()
    if len(values) != replicas:
        raise UsageError(
            f"--replica-gpus is given {len(values)} times for {replicas} --base-url; give "
            "it once per --base-url, in the same order (e.g. --replica-gpus 0,1)."
        )
    groups = []
    for value in values:
        try:
            group = tuple(int(part) for part in value.split(","))
        except ValueError:
            group = ()
        if not group or min(group) < 0:
            raise UsageError(
                f"--replica-gpus {value!r} is not a list of GPU indices; pass e.g. 0,1."
            )
        groups.append(group)
    return tuple(groups)


def collect_config(args: argparse.Namespace) -> CollectConfig:
    """The one validated config of a collect run."""
    verifier = args.verifier or ("none" if args.input else "synthetic")
    if args.agent_url is not None:
        if args.verifier is not None:
            raise UsageError(
                "the NeMo Gym agent verifies each rollout itself (its resources server's "
                "/verify); drop --verifier."
            )
        verifier = "nemo-gym-agent"
    return CollectConfig(
        target=_target_config(args),
        input=args.input,
        synthetic=SyntheticWorkload(
            num_tasks=args.synthetic,
            prompt_tokens_mean=args.prompt_tokens[0],
            prompt_tokens_std=args.prompt_tokens[1],
            output_tokens_mean=args.output_tokens[0],
            output_tokens_std=args.output_tokens[1],
            seed=args.seed,
        ),
        limit=args.limit,
        num_repeats=args.num_repeats,
        shard=Shard.parse(args.shard) if args.shard else None,
        parallelism=args.parallelism,
        adaptive_concurrency=args.adaptive_concurrency,
        verifier=verifier,
        verifier_workers=args.verifier_workers,
        verifier_cost_ms=args.verifier_cost_ms,
        verifier_timeout_s=args.verifier_timeout,
        tools=args.tools,
        max_turns=args.max_turns,
        output=args.output,
        resume=args.resume,
        progress=not args.quiet,
        max_failure_rate=args.max_failure_rate,
    )


def _collect_output(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """(the rollout file, the summary file): DIR/rollouts.jsonl and DIR/summary.json of
    --output-dir (default: a new folder under reports/), the deprecated --output FILE as
    given (no summary file, as before), or neither with --no-output."""
    if args.output is not None:
        if args.output_dir is not None or args.no_output:
            raise UsageError("--output is the old spelling of --output-dir; pass only one.")
        _deprecated("--output FILE", f"--output-dir DIR (rollouts go to DIR/{ROLLOUTS_FILE})")
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
        args.output_dir = _new_run_dir("collect")
    return args.output_dir / ROLLOUTS_FILE, args.output_dir / SUMMARY_FILE


def _kept_by_collect(args: argparse.Namespace) -> str:
    """Where an interrupted collect's rollouts are, and how to go on from there."""
    directory = getattr(args, "output_dir", None)
    if getattr(args, "no_output", False):
        return "nothing was kept (--no-output)"
    if directory is None:
        return _KEPT_ON_INTERRUPT["collect"]
    if not directory.exists():
        return "no rollout had finished"
    return (
        f"every finished rollout is in {directory}/ (rerun with --output-dir {directory} --resume)"
    )


def _remove_if_unused(directory: Path) -> None:
    """The run's own new folder, gone if it failed before its first row (a wrong URL, a
    bad flag), so that a mistake leaves no litter; anything collected stays."""
    from autotune.store import failures_path

    rows = directory / ROLLOUTS_FILE
    if failures_path(rows).exists() or (rows.exists() and rows.stat().st_size):
        return
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(OSError):  # reports/ too, when this run made it and it is empty
        directory.parent.rmdir()


def _cmd_collect(args: argparse.Namespace) -> int:
    from autotune.collect import failure_gate, run_collect
    from autotune.report.terminal import collect_summary_text, progress_bar

    defaulted = args.output_dir is None and args.output is None and not args.no_output
    args.output, summary_file = _collect_output(args)
    if args.report is True:
        if args.output_dir is None:
            raise UsageError(
                "--report without DIR goes in --output-dir, and this run has none "
                "(--no-output or --output FILE); pass --report DIR."
            )
        args.report = args.output_dir
    config = replace(collect_config(args), live=_live_config(args))
    if config.live.report is not None:
        _check_writable_dir(config.live.report, f"--report {config.live.report}")
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
        print(to_json(summary).decode())
    else:
        print(collect_summary_text(summary))
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
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from autotune.collect import run_async
    from autotune.diagnose import DiagnoseConfig, diagnose, write_outputs
    from autotune.report.terminal import diagnose_text, probe_progress
    from autotune.results import save

    config = DiagnoseConfig(
        collect=collect_config(args),
        low=args.low,
        high=args.high,
        min_s=args.min_s,
        max_s=args.max_s,
        command=args.command,
    )
    print_json, json_path = _json_choice(args)
    output_dir, flag = args.output_dir, "--output-dir"
    if args.report is not None:
        if output_dir is not None:
            raise UsageError("--report is the old spelling of --output-dir; pass only one.")
        _deprecated("--report DIR", "--output-dir DIR")
        output_dir, flag = args.report, "--report"
    if json_path is not None:
        if json_path.is_dir():
            raise UsageError(
                f"--json {json_path} is a directory; pass a file, "
                f"e.g. --json {json_path / 'diagnose.json'}."
            )
        _check_writable_dir(json_path.parent, f"--json {json_path}")
    if output_dir is not None:
        _check_writable_dir(output_dir, f"{flag} {output_dir}")
    with probe_progress(enabled=not args.quiet, count=2) as watch:
        result = run_async(diagnose(config, watch))
    print(to_json(result).decode() if print_json else diagnose_text(result))
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


def _check_writable_dir(directory: Path, what: str) -> None:
    """A directory that exists and takes files, or can be created; else one UsageError."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what} cannot be written: {existing} is a file; choose another path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"{what} cannot be written: {existing} is not writable; choose another path."
        )


def _rescue_json(result: DiagnoseResult) -> str:
    """Saves a measured result where it can go; says where (the end of an error sentence)."""
    try:
        fd, name = tempfile.mkstemp(prefix="autotune-diagnose-", suffix=".json")
        with os.fdopen(fd, "wb") as handle:
            handle.write(to_json(result))
    except OSError:
        return "the summary above is all that was kept; rerun with a writable path."
    return f"the result is saved in {name} instead (`autotune report {name} --out DIR`)."


def _with_repeats(study: Any, repeats: int | None) -> Any:
    """The study with `--num-repeats`: a workload of other groups is another study, so it
    gets its own name (its own storage and reports) rather than resuming this one's trials."""
    if repeats is None or repeats == study.workload.num_repeats:
        return study
    workload = study.workload.model_copy(update={"num_repeats": repeats})
    return study.model_copy(update={"workload": workload, "name": f"{study.name}-x{repeats}"})


def _cmd_sweep(args: argparse.Namespace) -> int:
    from autotune.collect import run_async
    from autotune.config import load_study
    from autotune.report.terminal import progress_bar, sweep_text
    from autotune.sweep.job import check_storage, redact_text, run_sweep, write_outputs
    from autotune.sweep.recommend import recommendation

    if args.schema:
        from autotune.config import Study

        print(to_json(Study.model_json_schema()).decode())
        return 0
    if args.study is None:
        raise UsageError("autotune sweep needs a study file; pass e.g. studies/demo.yaml.")
    study = _with_repeats(load_study(args.study), args.num_repeats)
    directory, flag = args.output_dir, f"--output-dir {args.output_dir}"
    if args.reports_dir is not None:
        if directory is not None:
            raise UsageError("--reports-dir is the old spelling of --output-dir; pass only one.")
        _deprecated("--reports-dir DIR", f"--output-dir DIR/{study.name}")
        directory, flag = args.reports_dir / study.name, f"--reports-dir {args.reports_dir}"
    elif directory is None:
        directory, flag = REPORTS / study.name, f"the report folder {REPORTS / study.name}"
    check_storage(args.storage)
    # Checked now: the reports are written only after every trial has run.
    _check_writable_dir(directory, flag)
    if args.storage is None or study.target.kind == "command":  # where studies_dir is used
        _check_writable_dir(args.studies_dir, f"--studies-dir {args.studies_dir}")
    with progress_bar(enabled=not args.quiet, unit="trial") as bar:
        bar.set_total(study.budget.trials)

        def on_trial(number: int, outcome: Any) -> None:
            knobs = ", ".join(f"{k}={v}" for k, v in outcome.knobs.items()) or "client only"
            found = (
                f"infeasible: {redact_text(outcome.infeasible_reason)}"
                if outcome.infeasible_reason
                else f"{outcome.value:.3g} at parallelism "
                f"{outcome.curve.best_measured_parallelism if outcome.curve else '-'}"
            )
            if outcome.pruned_reason:
                found += f", pruned: {outcome.pruned_reason}"
            if not args.quiet:
                bar.write(f"trial {number}: {knobs} → {found} ({outcome.wall_s:.1f} s)")
            bar.rollout_done({}, 0)  # after its line, so that a log reads in order

        result = run_async(
            run_sweep(study, storage=args.storage, studies_dir=args.studies_dir, on_trial=on_trial)
        )
    try:
        write_outputs(result, directory)
    except OSError as error:
        raise AutotuneError(
            f"could not write the reports in {directory} ({error.strerror}); the study "
            "storage keeps every trial: rerun the same command with another --output-dir."
        ) from None
    recommended = recommendation(result)
    if args.json:
        print(to_json(recommended).decode() if recommended else "null")
    else:
        print(sweep_text(result, recommended, directory))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from autotune.collect import write_outputs as collect_outputs
    from autotune.diagnose import write_outputs as diagnose_outputs
    from autotune.results import CollectResult, DiagnoseResult, load_result
    from autotune.sweep.job import write_outputs as sweep_outputs

    result = load_result(args.directory)
    directory = args.output_dir
    if args.out is not None:
        if directory is not None:
            raise UsageError("--out is the old spelling of --output-dir; pass only one.")
        _deprecated("--out DIR", "--output-dir DIR")
        directory = args.out
    if directory is None:
        directory = args.directory if args.directory.is_dir() else args.directory.parent
    if isinstance(result, DiagnoseResult):
        written = diagnose_outputs(result, directory)
    elif isinstance(result, CollectResult):
        written = collect_outputs(result, directory)
    else:
        written = sweep_outputs(result, directory)
    if args.json:
        print(to_json({"written": [str(path) for path in written]}).decode())
    else:
        print(written[-1])
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from autotune.store import merge_rollouts

    output = args.output_dir / ROLLOUTS_FILE if args.output_dir is not None else args.output
    if args.output is not None:
        if args.output_dir is not None:
            raise UsageError("--output is the old spelling of --output-dir; pass only one.")
        _deprecated("--output FILE", f"--output-dir DIR (the rows go to DIR/{ROLLOUTS_FILE})")
    elif output is None:
        raise UsageError("merge needs a place for the merged rows; pass --output-dir DIR.")
    shards = [shard / ROLLOUTS_FILE if shard.is_dir() else shard for shard in args.shards]
    written, dropped = merge_rollouts(shards, output)
    if args.json:
        print(to_json({"output": str(output), "merged": written, "duplicates": dropped}).decode())
    else:
        print(f"merged {written} rollouts into {output} ({dropped} duplicates dropped)")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
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
    from autotune.bench.results import refuse_baseline

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
    print(to_json(results.to_dict()).decode() if args.json else run_summary(results))
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
    if args.out is None:
        return None
    if args.output_dir is not None:
        raise UsageError("--out is the old spelling of --output-dir; pass only one.")
    _deprecated(old, f"--output-dir DIR (it gets DIR/{file})")
    return Path(args.out)


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
    print_json, json_path = _json_choice(args)
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
    print(document if print_json else table)
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
        print(to_json(baseline.to_dict()).decode())
        return 0
    print(
        f"{'replaced' if replaced else 'wrote'} the baseline {args.baseline} with the "
        f"{len(baseline.cases)} cases of {args.results} ({when}, host "
        f"{baseline.machine.get('host')}); commit it with the change that explains it."
    )
    return 0


def _add_comparison_outputs(parser: argparse.ArgumentParser, output_dir: str) -> None:
    _add_output_dir(parser, output_dir)
    _add_json(parser, "the comparison", old_path=True)
    parser.add_argument("--junit", type=Path, metavar="PATH", help="also JUnit XML here")
    parser.add_argument(
        "--markdown", type=Path, metavar="PATH", help="also the Markdown table here"
    )
    parser.add_argument("--html", type=Path, metavar="DIR", help="also the HTML report here")


def _add_bench_commands(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="CI regression benchmarks with a statistical gate",
        description="Exit codes: 0 no regression, 1 regression, 2 usage error, "
        "3 baseline missing or not comparable, 4 the benchmark could not run.",
    )
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")

    run = bench_commands.add_parser("run", help="measure every case of a suite")
    run.add_argument("suite", type=Path, help="the suite YAML file")
    _add_output_dir(run, f"{REPORTS}/bench; it gets results.json")
    run.add_argument("--out", "-o", type=Path, metavar="FILE", help="deprecated: use --output-dir")
    run.add_argument("--case", action="append", metavar="NAME", help="only this case (repeat)")
    run.add_argument("--repetitions", type=_positive_int, help="override every case's")
    run.add_argument("--warmup", type=_count, help="override every case's warm-up repetitions")
    _add_json(run, "the results")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    run.add_argument(
        "--launch",
        metavar="CMD",
        help="every probe case against the server CMD starts ({port} where its port goes); "
        "overhead cases are left out",
    )
    run.set_defaults(handler=_cmd_bench, bench_handler=_bench_run)

    compare = bench_commands.add_parser(
        "compare", help="judge results against a baseline (exit 1 on a regression)"
    )
    compare.add_argument(
        "results", type=Path, nargs="+", help="results JSON; the newest is judged, all are history"
    )
    compare.add_argument("--baseline", type=Path, required=True, help="the baseline JSON")
    compare.add_argument("--threshold", type=_inner_share, help="override each case's, e.g. 0.05")
    compare.add_argument(
        "--alpha", type=_inner_share, help="significance level (default: the suite's)"
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
    compare.set_defaults(handler=_cmd_bench, bench_handler=_bench_compare)

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
    ab.add_argument("--min-pairs", type=_positive_int, default=5, help="pairs before stopping")
    ab.add_argument("--max-pairs", type=_positive_int, default=12, help="pairs at most")
    ab.add_argument("--threshold", type=_inner_share, help="override each case's, e.g. 0.05")
    ab.add_argument("--alpha", type=_inner_share, help="significance level (default: the suite's)")
    ab.add_argument(
        "--ignore-fingerprint", action="append", default=[], metavar="FIELD",
        help="compare across a difference in this field (server is ignored with --*-cmd)",
    )  # fmt: skip
    ab.add_argument("--out", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    ab.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    _add_comparison_outputs(
        ab,
        f"{REPORTS}/bench/ab; it gets each pair's results, both sides' merged results, "
        "comparison.json, junit.xml, summary.md and index.html",
    )
    ab.set_defaults(handler=_cmd_bench, bench_handler=_bench_ab)

    update = bench_commands.add_parser(
        "update-baseline", help="make results the new baseline, on purpose"
    )
    update.add_argument("results", type=Path, help="results JSON from `autotune bench run`")
    update.add_argument("--baseline", type=Path, required=True, help="the baseline to write")
    update.add_argument("--reason", required=True, help="why, recorded in the baseline")
    _add_json(update, "what was written")
    update.set_defaults(handler=_cmd_bench, bench_handler=_bench_update_baseline)


def _cmd_sim_serve(args: argparse.Namespace) -> int:
    from autotune.servers.sim.server import main as sim_main

    return sim_main(args.sim_args, prog="autotune sim serve")


def _split_sim_serve(argv: list[str]) -> tuple[list[str], list[str]]:
    """(autotune's arguments, the simulator's) of `autotune [-v] sim serve FLAGS...`.

    The simulator parses its own flags (vLLM's names, its own range checks, its own
    --help); an argparse REMAINDER would lose those that start with `-` (`--port 8000`).
    A `--` right after `serve` is dropped, as a user may write it to mean "the rest is
    the simulator's".
    """
    for index, word in enumerate(argv[:-1]):
        if word == "sim" and argv[index + 1] == "serve":
            rest = argv[index + 2 :]
            return argv[: index + 2], rest[1:] if rest[:1] == ["--"] else rest
        if not word.startswith("-"):
            break
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune",
        description="Measure and tune RL rollout collection throughput.",
        epilog=_epilog("a command's gate failed (see its --help)"),
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="job", required=True, metavar="COMMAND")

    collect = commands.add_parser(
        "collect",
        help="collect rollouts (the engine on its own)",
        epilog=_epilog(
            "the run finished, but no rollout succeeded or a larger share failed than "
            "--max-failure-rate (the rollouts collected are kept)"
        ),
    )
    add_workload_arguments(collect)
    add_target_arguments(collect)
    run = collect.add_argument_group("run")
    run.add_argument(
        "--parallelism",
        "--num-samples-in-parallel",
        type=_positive_int,
        default=None,
        help="rollouts in flight at once (default: unlimited, as in NeMo Gym)",
    )
    _add_output_dir(
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
        type=_share,
        default=_DEFAULTS.max_failure_rate,
        metavar="SHARE",
        help="exit 3 when a larger share of rollouts fails (default: 0.05)",
    )
    run.add_argument(
        "--no-adaptive-concurrency",
        dest="adaptive_concurrency",
        action="store_false",
        help="keep --parallelism in flight even when the server answers 429/503",
    )
    _add_json(run, "the closing summary")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress, only the result")
    add_live_arguments(collect)
    collect.set_defaults(handler=_cmd_collect)

    diagnose = commands.add_parser(
        "diagnose",
        help="paired low/high parallelism probes → a bottleneck verdict",
        epilog=_epilog("the verdict is one of --fail-on"),
    )
    add_workload_arguments(diagnose)
    add_target_arguments(diagnose)
    probes = diagnose.add_argument_group("probes")
    probes.add_argument("--low", type=_positive_int, default=5, help="low probe parallelism")
    probes.add_argument("--high", type=_positive_int, default=20, help="high probe parallelism")
    probes.add_argument(
        "--min-s",
        type=_positive,
        default=PROBE_DEFAULTS.min_s,
        help="shortest steady-state window",
    )
    probes.add_argument(
        "--max-s", type=_positive, default=PROBE_DEFAULTS.max_s, help="time cap per probe"
    )
    probes.add_argument(
        "--fail-on",
        type=_verdicts,
        default=frozenset(),
        metavar="VERDICT[,VERDICT]",
        help="exit 3 when the verdict is one of these, e.g. unstable,rate-limited",
    )
    output = diagnose.add_argument_group("output")
    _add_output_dir(
        output, "none: the verdict is printed only; a DIR gets diagnose.json and index.html"
    )
    _add_json(output, "the result (every probe, the verdict and its evidence)", old_path=True)
    output.add_argument("--report", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    output.add_argument("--quiet", "-q", action="store_true", help="no progress, only the result")
    probes.add_argument(
        "--command",
        metavar="TEMPLATE",
        help="diagnose your own collector instead: a command with {parallelism} and "
        "{output} (the rollout JSONL it writes), optionally {limit} (--limit, default "
        "10 × --high), e.g. 'ng_collect_rollouts ... +num_samples_in_parallel={parallelism} "
        "+output_jsonl_fpath={output} +limit={limit}'",
    )
    diagnose.set_defaults(
        handler=_cmd_diagnose,
        parallelism=None,
        output=None,
        resume=False,
        num_repeats=1,
        adaptive_concurrency=_DEFAULTS.adaptive_concurrency,
        max_failure_rate=_DEFAULTS.max_failure_rate,
    )

    sweep = commands.add_parser(
        "sweep",
        help="an Optuna study over parallelism and server knobs → a recommendation",
        epilog=_epilog(),
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
    _add_output_dir(
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
        type=_positive_int,
        metavar="N",
        help="rollouts per task, one after another (GRPO groups sharing a prompt), instead of "
        "the study's workload.num_repeats; the study is then NAME-xN, apart from NAME's trials",
    )
    _add_json(sweep, "the recommendation")
    sweep.add_argument("--quiet", "-q", action="store_true", help="no progress, only the result")
    sweep.set_defaults(handler=_cmd_sweep)

    report = commands.add_parser(
        "report", help="render a report again from its saved results", epilog=_epilog()
    )
    report.add_argument(
        "directory",
        type=Path,
        help="a folder a command wrote (its --output-dir), or the JSON file in it",
    )
    _add_output_dir(report, "the folder read")
    report.add_argument("--out", type=Path, metavar="DIR", help="deprecated: use --output-dir")
    _add_json(report, "the paths written")
    report.set_defaults(handler=_cmd_report)

    merge = commands.add_parser(
        "merge", help="join shard outputs without duplicates", epilog=_epilog()
    )
    merge.add_argument(
        "shards",
        nargs="+",
        type=Path,
        help=f"each shard's rollout JSONL, or the --output-dir holding its {ROLLOUTS_FILE}",
    )
    _add_output_dir(merge, f"none: pass one; the merged rows go to DIR/{ROLLOUTS_FILE}")
    merge.add_argument(
        "--output", "-o", type=Path, metavar="FILE", help="deprecated: use --output-dir"
    )
    _add_json(merge, "the counts and the output path")
    merge.set_defaults(handler=_cmd_merge)

    _add_bench_commands(commands)

    sim = commands.add_parser(
        "sim", help="the embedded simulated vLLM-like server", epilog=_epilog()
    )
    sim_commands = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")
    serve = sim_commands.add_parser(
        "serve",
        help="serve it (takes vLLM's flag names; see `autotune sim serve --help`)",
        add_help=False,
    )
    serve.set_defaults(handler=_cmd_sim_serve)  # its flags: see _split_sim_serve
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    own, sim_flags = _split_sim_serve(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(own)
    args.sim_args = sim_flags
    quiet = getattr(args, "quiet", False)  # only the result: warnings and errors still show
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="autotune: %(message)s",
        stream=sys.stderr,
    )
    handler: Callable[[argparse.Namespace], int] = args.handler
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return handler(args)
    except UsageError as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except AutotuneError as error:
        print(f"autotune: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader (`| head`) has gone: the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as interrupt:
        terminated = isinstance(interrupt, Terminated)
        kept = _kept_by_collect(args) if args.job == "collect" else _KEPT_ON_INTERRUPT.get(args.job)
        what = "terminated" if terminated else "interrupted"
        print(f"autotune: {what}{f'; {kept}' if kept else ''}.", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
