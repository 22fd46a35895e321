"""Client overhead: autotune's engine against a bare aiohttp loop, both on a null server.

With a server that answers instantly on its own core, a client pinned to the other core
is bound by its own CPU, so requests per second measure how much work each request costs
the client. The bare loop (one ClientSession, N coroutines posting a chat completion and
reading the JSON) is the physical ceiling of aiohttp+uvloop here; the engine adds tasks,
retries, verification, timings and a JSONL writer, and must keep most of that ceiling.

The engine runs a second time per round "metered": with everything a production collect
watches on (/metrics scraped every second, a stats line every second, a drift watch;
autotune/live/), which must keep 95% of the plain engine's rate. Then twice as GRPO
groups of 8 samples a prompt (`--num-repeats 8`): "repeated" without the group figures,
"grouped" with them (autotune/rl/groups.py): the same requests and tasks, only the
bookkeeping differs. Two rates on a shared machine differ by more than 3% from noise
alone (identical runs here spread ±25%), so the bookkeeping's cost is also timed on its
own, per sample, and judged as a share of a repeated request's client CPU: at most 3%.

The five alternate for R rounds (the order rotating each round) and the medians are
compared, so machine noise and drift hit them alike.

    python benchmarks/overhead.py [--requests 20000] [--concurrency 64] [--rounds 3]
                                  [--json] [--check]

Targets: engine >= 3,000 rollouts/s and >= 60% of the bare loop; metered >= 95% of the
engine; group bookkeeping <= 3% of a repeated request's CPU. Exit status is 0 unless
--check is given and a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from autotune.bench.overhead import Run, bare_loop, engine_run

try:  # run as a script (benchmarks/ on sys.path) or as `python -m benchmarks.overhead`
    import _common
except ImportError:  # pragma: no cover
    from benchmarks import _common  # type: ignore[no-redef]


ENGINE_MIN_RPS = 3000.0
ENGINE_MIN_RATIO = 0.60
METERED_MIN_RATIO = 0.95  # issue 17: live metering costs the engine at most 5%
BOOKKEEPING_MAX_SHARE = 0.03  # issue 23: group bookkeeping costs the engine at most 3%
GROUP_SIZE = 8
KINDS = ("bare", "engine", "metered", "repeated", "grouped")


def bookkeeping_us(samples: int = 160_000) -> float:
    """CPU µs the group figures cost a sample, timed alone (GroupTracker.ended on groups of
    GROUP_SIZE): steadier than the difference of two noisy rates."""
    from autotune.rl.groups import GroupTracker

    tracker = GroupTracker(GROUP_SIZE)
    started = _common.cpu_seconds()
    for index in range(samples):
        tracker.ended(index // GROUP_SIZE, 0.0, 1.0 + index % GROUP_SIZE, float(index % 3 == 0), 9)
    return (_common.cpu_seconds() - started) / samples * 1e6


def engine_available() -> str | None:
    """None when autotune's engine can be imported, else why not."""
    try:
        import autotune.rollout.collect_job  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then alternate bare loop and engine for the rounds; the figures as a dict."""
    client_core, server_core = _common.core_plan()
    _common.pin_self(client_core)
    why_no_engine = None if args.no_engine else engine_available()
    use_engine = not args.no_engine and why_no_engine is None
    runs: list[Run] = []

    def note(run: Run, label: str) -> None:
        runs.append(run)
        print(
            f"  {label}: {run.kind:6} {run.per_s:9,.0f}/s  {run.requests:,} in"
            f" {run.elapsed_s:.2f} s  cpu {run.cpu_s / run.wall_s:4.0%}  failed {run.failed}",
            file=sys.stderr,
        )

    with _common.NullServer(core=server_core) as server, tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        print(
            f"null server {server.base_url} (core {server_core}), client core {client_core}",
            file=sys.stderr,
        )

        def try_engine(total: int, label: str, kind: str = "engine") -> Run | None:
            # An engine that crashes is reported beside the bare figures; the run goes on.
            nonlocal use_engine, why_no_engine
            grouped = kind in ("repeated", "grouped")
            try:
                return engine_run(
                    server.base_url,
                    args.concurrency,
                    total,
                    out_dir,
                    metered=kind == "metered",
                    group_size=GROUP_SIZE if grouped else 1,
                    track_groups=kind == "grouped",
                )
            except Exception as error:
                why_no_engine = f"the engine failed: {type(error).__name__}: {error}"
                use_engine = False
                print(f"  {label}: {why_no_engine}", file=sys.stderr)
                return None

        if args.warmup:
            bare_loop(server.base_url, args.concurrency, args.warmup)
            if use_engine:
                try_engine(args.warmup, "warm-up")
        for index in range(args.rounds):
            shift = index % len(KINDS)
            order = KINDS[shift:] + KINDS[:shift]
            label = f"round {index + 1}/{args.rounds}"
            for kind in order:
                if kind == "bare":
                    note(bare_loop(server.base_url, args.concurrency, args.requests), label)
                elif use_engine and (run := try_engine(args.requests, label, kind)) is not None:
                    note(run, label)

    bare = [r.per_s for r in runs if r.kind == "bare"]
    engine = [r.per_s for r in runs if r.kind == "engine"]
    metered = [r.per_s for r in runs if r.kind == "metered"]
    repeated = [r.per_s for r in runs if r.kind == "repeated"]
    grouped = [r.per_s for r in runs if r.kind == "grouped"]
    bare_median = _common.median(bare)
    engine_median = _common.median(engine) if engine else None
    metered_median = _common.median(metered) if metered else None
    ratio = engine_median / bare_median if engine_median is not None else None
    metered_ratio = metered_median / engine_median if metered_median and engine_median else None
    repeated_median = _common.median(repeated) if repeated else None
    grouped_median = _common.median(grouped) if grouped else None
    grouped_ratio = grouped_median / repeated_median if grouped_median and repeated_median else None
    # CPU seconds a request costs the client: unlike a rate, untouched by other processes
    # taking the client's core (on a shared machine the cleaner measure of metering's cost).
    cpu_us = {
        kind: _common.median([r.cpu_s / r.requests * 1e6 for r in runs if r.kind == kind])
        for kind in KINDS
        if any(r.kind == kind for r in runs)
    }
    failed = sum(r.failed for r in runs)
    bookkeeping = bookkeeping_us() if use_engine else None
    repeated_cpu = cpu_us.get("repeated")
    bookkeeping_share = bookkeeping / repeated_cpu if bookkeeping and repeated_cpu else None
    targets = {
        "engine_min_rollouts_per_s": ENGINE_MIN_RPS,
        "engine_min_ratio": ENGINE_MIN_RATIO,
        "engine_rps_ok": engine_median is not None and engine_median >= ENGINE_MIN_RPS,
        "ratio_ok": ratio is not None and ratio >= ENGINE_MIN_RATIO,
        "metered_min_ratio": METERED_MIN_RATIO,
        "metered_ok": metered_ratio is not None and metered_ratio >= METERED_MIN_RATIO,
        "bookkeeping_max_share": BOOKKEEPING_MAX_SHARE,
        "bookkeeping_ok": bookkeeping_share is not None
        and bookkeeping_share <= BOOKKEEPING_MAX_SHARE,
        "no_failures": failed == 0,
    }
    return {
        "benchmark": "overhead",
        "schema_version": 1,
        "machine": _common.machine(),
        "client_core": client_core,
        "server_core": server_core,
        "concurrency": args.concurrency,
        "requests_per_run": args.requests,
        "rounds": args.rounds,
        "engine": "skipped"
        if args.no_engine
        else (why_no_engine or "autotune.rollout.collect_job"),
        "bare_req_per_s": bare,
        "engine_rollouts_per_s": engine,
        "bare_median": bare_median,
        "engine_median": engine_median,
        "ratio": ratio,
        "metered_rollouts_per_s": metered,
        "metered_median": metered_median,
        "metered_ratio": metered_ratio,
        "repeated_rollouts_per_s": repeated,
        "repeated_median": repeated_median,
        "grouped_rollouts_per_s": grouped,
        "grouped_median": grouped_median,
        "grouped_ratio": grouped_ratio,
        "bookkeeping_us_per_sample": bookkeeping,
        "bookkeeping_share": bookkeeping_share,
        "cpu_us_per_request": cpu_us,
        "runs": [asdict(r) for r in runs],
        "targets": targets,
        "passed": all(v for k, v in targets.items() if k.endswith("_ok") or k == "no_failures"),
    }


def render(result: dict[str, Any]) -> str:
    """The figures as a small table."""
    rounds = result["rounds"]
    head = "".join(f"{'round ' + str(i + 1):>10}" for i in range(rounds)) + f"{'median':>10}"
    lines = [
        f"client overhead on a null server: concurrency {result['concurrency']}, "
        f"{result['requests_per_run']:,} requests a run, {rounds} rounds",
        f"{'':28}{head}",
    ]

    def row(label: str, values: list[float], med: float | None) -> str:
        cells = "".join(f"{v:>10,.0f}" for v in values) + " " * 10 * (rounds - len(values))
        return f"{label:28}{cells}{'' if med is None else f'{med:>10,.0f}'}"

    lines.append(row("bare aiohttp loop req/s", result["bare_req_per_s"], result["bare_median"]))
    if result["engine_rollouts_per_s"]:
        lines.append(
            row("engine rollouts/s", result["engine_rollouts_per_s"], result["engine_median"])
        )
        ratio = result["ratio"]
        lines.append(f"{'engine / bare':28}{'':{10 * rounds}}{ratio:>10.0%}")
        metered_ratio = result["metered_ratio"]
        if metered_ratio is not None:
            metered = result["metered_rollouts_per_s"]
            lines.append(row("metered rollouts/s", metered, result["metered_median"]))
            lines.append(f"{'metered / engine':28}{'':{10 * rounds}}{metered_ratio:>10.1%}")
        grouped_ratio = result.get("grouped_ratio")
        if grouped_ratio is not None:
            repeated = result["repeated_rollouts_per_s"]
            lines.append(row("repeated rollouts/s", repeated, result["repeated_median"]))
            grouped = result["grouped_rollouts_per_s"]
            lines.append(row("grouped rollouts/s", grouped, result["grouped_median"]))
            lines.append(f"{'grouped / repeated':28}{'':{10 * rounds}}{grouped_ratio:>10.1%}")
        cpu = result["cpu_us_per_request"]
        per_request = ", ".join(f"{kind} {us:.1f}" for kind, us in cpu.items())
        lines.append(f"client CPU µs a request (median): {per_request}")
        share = result.get("bookkeeping_share")
        if share is not None:
            lines.append(
                f"group bookkeeping alone: {result['bookkeeping_us_per_sample']:.2f} µs a "
                f"sample, {share:.2%} of a repeated request's CPU"
            )
        for kind, base in (("metered", "engine"), ("grouped", "repeated")):
            if kind in cpu and base in cpu:
                lines.append(
                    f"{kind + ' / ' + base + ' (CPU)':28}{'':{10 * rounds}}"
                    f"{cpu[kind] / cpu[base]:>10.1%}"
                )
    else:
        lines.append(f"engine: not measured ({result['engine']}); targets not judged")
        return "\n".join(lines)
    t = result["targets"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines.append(
        f"targets: engine >= {t['engine_min_rollouts_per_s']:,.0f} rollouts/s "
        f"{verdict(t['engine_rps_ok'])}; engine >= {t['engine_min_ratio']:.0%} of bare "
        f"{verdict(t['ratio_ok'])}; metered >= {t['metered_min_ratio']:.0%} of engine "
        f"{verdict(t['metered_ok'])}; group bookkeeping <= {t['bookkeeping_max_share']:.0%} "
        f"of a request {verdict(t['bookkeeping_ok'])}; no failed requests "
        f"{verdict(t['no_failures'])}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2_000, help="requests before round 1")
    parser.add_argument("--no-engine", action="store_true", help="measure the bare loop only")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--requests, --concurrency and --rounds must be positive")
    result = measure(args)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render(result))
    return 1 if args.check and not result["passed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
