"""The flags of a run (collect, diagnose): its tasks and verifier, its model server, what it
reports while it runs, and the one CollectConfig they make.
Why: docs/design/cli.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from autotune.cli.common import non_negative, positive, positive_int
from autotune.cli.options import add_options, spec_of, values_of
from autotune.config.collection import (
    TOOL_ERROR_TREATMENTS,
    CollectConfig,
    LiveConfig,
    RequestFields,
    ServerFields,
    Shard,
    SyntheticSpec,
    TargetConfig,
    WorkloadSpec,
    collect_config,
    target_config,
)
from autotune.config.rl_specs import BatchSpec
from autotune.errors import UsageError

# One set of defaults: the configs' own (the flags only say them again in --help).
RUN_DEFAULTS = CollectConfig()
_SYNTHETIC = ("num_tasks", "prompt_tokens", "output_tokens", "seed")
_VERIFIER = ("verifier", "verifier_workers", "verifier_cost_ms")
_REQUEST = ("timeout_s", "max_retries")


def add_batch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training steps (RL)")
    add_options(group, BatchSpec, *BatchSpec.model_fields)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tasks and verifier")
    add_options(group, WorkloadSpec, "input")
    add_options(group, SyntheticSpec, *_SYNTHETIC)
    add_options(group, WorkloadSpec, "limit", "num_repeats")
    group.add_argument("--shard", type=str, metavar="i/N", help="the i-th of N contiguous slices")
    add_options(group, WorkloadSpec, *_VERIFIER)
    group.add_argument(
        "--verifier-timeout",
        type=positive,
        default=RUN_DEFAULTS.verifier_timeout_s,
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
        type=positive_int,
        default=RUN_DEFAULTS.max_turns,
        metavar="N",
        help=f"model calls per multi-turn rollout, at most (default: {RUN_DEFAULTS.max_turns})",
    )
    group.add_argument(
        "--tool-timeout",
        type=positive,
        default=RUN_DEFAULTS.tool_timeout_s,
        metavar="SECONDS",
        help="longest one tool call may take; a call with no answer by then fails its "
        f"rollout as tool_timeout (default: {RUN_DEFAULTS.tool_timeout_s:g})",
    )
    group.add_argument(
        "--tool-errors",
        choices=TOOL_ERROR_TREATMENTS,
        default=RUN_DEFAULTS.tool_errors,
        help="a tool answering an error status: feed its body back to the model as NeMo "
        "Gym's agent does, or fail the rollout as tool_error; counted either way "
        f"(default: {RUN_DEFAULTS.tool_errors})",
    )


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
    group.add_argument(
        "--server-max-num-seqs",
        type=positive_int,
        metavar="N",
        help="the model server's --max-num-seqs (each replica's): the busy share of "
        "--batch-groups steps is its running requests over this, or over what its KV cache "
        "holds when fewer (vLLM states only that; the simulator states both)",
    )
    add_options(group, ServerFields, "model")
    add_options(group, RequestFields, "api", "stream")
    group.add_argument(
        "--extra-body", metavar="JSON", help="extra request fields, e.g. '{\"ignore_eos\": true}'"
    )
    add_options(group, ServerFields, "api_key_env")
    add_options(group, RequestFields, "timeout_s")
    group.add_argument(
        "--idle-timeout",
        type=positive,
        default=RUN_DEFAULTS.target.idle_timeout_s,
        metavar="SECONDS",
        help="a stream silent this long after its first byte has stalled: that attempt fails "
        "(default: 60)",
    )
    add_options(group, RequestFields, "max_retries")
    group.add_argument(
        "--pool-limit", type=positive_int, default=RUN_DEFAULTS.target.pool_limit,
        help="most open connections",
    )  # fmt: skip
    group.add_argument("--rpm", type=positive, help="requests per minute limit")
    group.add_argument("--tpm", type=positive, help="tokens per minute limit")
    group.add_argument(
        "--sim-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the embedded simulator, e.g. --sim-arg=--max-num-seqs=32",
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


def add_metrics_arguments(group: argparse._ActionsContainer, what: str) -> None:
    """--metrics-port and --metrics-host: Prometheus metrics of `what` while it runs."""
    group.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help=f"serve Prometheus metrics of {what} at http://HOST:PORT/metrics while it runs",
    )
    group.add_argument(
        "--metrics-host",
        default=RUN_DEFAULTS.live.metrics_host,
        metavar="HOST",
        help="the address --metrics-port listens on (default: 127.0.0.1, this machine only)",
    )


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """`collect`'s flags for watching a run while it runs (autotune/live/)."""
    live = RUN_DEFAULTS.live
    group = parser.add_argument_group("while it runs: metrics, stats, drift watch, report")
    add_metrics_arguments(group, "the run")
    group.add_argument(
        "--metrics-linger",
        type=non_negative,
        default=live.metrics_linger_s,
        metavar="SECONDS",
        help="after the run, serve until one more scrape reads the final figures, at most "
        "this long (default: 0)",
    )
    group.add_argument(
        "--stats-every",
        type=positive,
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
        type=positive,
        metavar="R",
        help="warn when steady-state throughput drifts below R rollouts/s",
    )
    group.add_argument(
        "--drift-window",
        type=positive,
        default=live.drift_window_s,
        metavar="SECONDS",
        help="the drift watch's window (default: 16 mean rollout latencies, at least 60 s, "
        "so a window holds 8 batches of completions)",
    )
    group.add_argument(
        "--drift-windows",
        type=positive_int,
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


def live_config(args: argparse.Namespace) -> LiveConfig:
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


def _extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        extra_body = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise UsageError(
            f"--extra-body is not valid JSON ({error}); quote it as one JSON object."
        ) from None
    if not isinstance(extra_body, dict):
        raise UsageError("--extra-body must be a JSON object, e.g. '{\"ignore_eos\": true}'.")
    return extra_body


def _target_config(args: argparse.Namespace, request: RequestFields) -> TargetConfig:
    from autotune.rollout.target import base_url_problem

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
    server = ServerFields.model_construct(
        base_url=base_urls[0] if base_urls else None,
        **values_of(args, ServerFields, "model", "api_key_env"),
    )
    return target_config(
        request,
        server,
        agent_url=args.agent_url,
        metrics_url=args.metrics_url,
        replica_urls=_replica_urls(base_urls, args.metrics_url),
        replica_gpus=_replica_gpus(args.replica_gpus or [], len(base_urls)),
        extra_body=_extra_body(args.extra_body),
        idle_timeout_s=args.idle_timeout,
        pool_limit=args.pool_limit,
        rpm=args.rpm,
        tpm=args.tpm,
        sim_args=tuple(args.sim_arg),
        max_num_seqs=args.server_max_num_seqs,
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


def batch_spec(args: argparse.Namespace) -> BatchSpec | None:
    """--batch-groups and its remedies, checked together; None when not given."""
    if not hasattr(args, "over_sample"):  # a command without batch steps (diagnose, loop)
        return None
    spec = spec_of(args, BatchSpec)
    return spec if spec.batch_groups is not None else None


def run_config(args: argparse.Namespace) -> CollectConfig:
    """The one validated config of a run, from its flags (the same objects a study and a
    bench suite build)."""
    request = RequestFields.model_construct(
        **values_of(args, RequestFields, *RequestFields.model_fields)
    )
    workload = WorkloadSpec.model_construct(
        synthetic=SyntheticSpec.model_construct(**values_of(args, SyntheticSpec, *_SYNTHETIC)),
        **values_of(args, WorkloadSpec, "input", "limit", "num_repeats", *_VERIFIER),
        **request.model_dump(),
    )
    if args.agent_url is not None:
        if args.verifier is not None:
            raise UsageError(
                "the NeMo Gym agent verifies each rollout itself (its resources server's "
                "/verify); drop --verifier."
            )
        workload = workload.model_copy(update={"verifier": "nemo-gym-agent"})
    return collect_config(
        workload,
        _target_config(args, request),
        batch=batch_spec(args),
        shard=Shard.parse(args.shard) if args.shard else None,
        parallelism=args.parallelism,
        adaptive_concurrency=args.adaptive_concurrency,
        verifier_timeout_s=args.verifier_timeout,
        tools=args.tools,
        max_turns=args.max_turns,
        tool_timeout_s=args.tool_timeout,
        tool_errors=args.tool_errors,
        output=args.output,
        resume=args.resume,
        progress=not args.quiet,
        max_failure_rate=args.max_failure_rate,
    )
