"""Client overhead: autotune's engine against a bare aiohttp loop, both on a null server.

With a server that answers instantly on its own core, a client pinned to the other core
is bound by its own CPU, so requests per second measure how much work each request costs
the client. The bare loop (one ClientSession, N coroutines posting a chat completion and
reading the JSON) is the physical ceiling of aiohttp+uvloop here; the engine adds tasks,
retries, verification, timings and a JSONL writer, and must keep most of that ceiling.

The two alternate for R rounds (the order flipping each round) and the medians are
compared, so machine noise and drift hit both alike.

    python benchmarks/overhead.py [--requests 20000] [--concurrency 64] [--rounds 3]
                                  [--json] [--check]

Targets: engine >= 3,000 rollouts/s and >= 60% of the bare loop. Exit status is 0 unless
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


def engine_available() -> str | None:
    """None when autotune's engine can be imported, else why not."""
    try:
        import autotune.collect  # noqa: F401
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

        def try_engine(total: int, label: str) -> Run | None:
            # An engine that crashes is reported beside the bare figures; the run goes on.
            nonlocal use_engine, why_no_engine
            try:
                return engine_run(server.base_url, args.concurrency, total, out_dir)
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
            order = ("bare", "engine") if index % 2 == 0 else ("engine", "bare")
            label = f"round {index + 1}/{args.rounds}"
            for kind in order:
                if kind == "bare":
                    note(bare_loop(server.base_url, args.concurrency, args.requests), label)
                elif use_engine and (run := try_engine(args.requests, label)) is not None:
                    note(run, label)

    bare = [r.per_s for r in runs if r.kind == "bare"]
    engine = [r.per_s for r in runs if r.kind == "engine"]
    bare_median = _common.median(bare)
    engine_median = _common.median(engine) if engine else None
    ratio = engine_median / bare_median if engine_median is not None else None
    failed = sum(r.failed for r in runs)
    targets = {
        "engine_min_rollouts_per_s": ENGINE_MIN_RPS,
        "engine_min_ratio": ENGINE_MIN_RATIO,
        "engine_rps_ok": engine_median is not None and engine_median >= ENGINE_MIN_RPS,
        "ratio_ok": ratio is not None and ratio >= ENGINE_MIN_RATIO,
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
        "engine": "skipped" if args.no_engine else (why_no_engine or "autotune.collect"),
        "bare_req_per_s": bare,
        "engine_rollouts_per_s": engine,
        "bare_median": bare_median,
        "engine_median": engine_median,
        "ratio": ratio,
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
    else:
        lines.append(f"engine: not measured ({result['engine']}); targets not judged")
        return "\n".join(lines)
    t = result["targets"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines.append(
        f"targets: engine >= {t['engine_min_rollouts_per_s']:,.0f} rollouts/s "
        f"{verdict(t['engine_rps_ok'])}; engine >= {t['engine_min_ratio']:.0%} of bare "
        f"{verdict(t['ratio_ok'])}; no failed requests {verdict(t['no_failures'])}"
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
