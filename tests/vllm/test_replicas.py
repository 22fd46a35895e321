"""Two real vLLM replicas of one model behind one `autotune collect` and one `diagnose`.

The module starts two CPU-build servers once, side by side, one core each: the whole
server pinned with taskset and its OpenMP threads bound to that core (with the default
`auto` binding both would pick the same cores). Both tests then share them. They serve
the wide model, whose batches cost little more than single sequences (see
build_tiny_model.py): with the tiny one, each core's per-sequence work left the
diagnose's speedup anywhere from ×1.0 to ×2.2, across the ×2.00 threshold.

What must hold against real servers, not the simulator: every call lands on one of
the two, each replica's figures come from its own /metrics, and GRPO groups (four
rollouts of one prompt, kept on one replica by the rotation's prompt affinity) hit
that replica's prefix cache. vLLM 0.32 turns prefix caching on by default for a
decoder-only model on x86 (only MLA models and RISC-V switch it off) and exports its
counters as vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from autotune.servers.vllm import VllmServer
from tests.helpers import autotune, read_rows
from tests.vllm.conftest import TEST_ENV, TEST_FLAGS, WIDE_FLAGS, VllmInstall

pytestmark = pytest.mark.vllm

TASKS, REPEATS = 16, 4
# Prompts of 4 to 5 KV blocks (32 tokens each): a repeat of one finds 4 of them cached.
WORK = ("--prompt-tokens", "160,16", "--output-tokens", "24,0", "--extra-body",
        '{"ignore_eos": true}')  # fmt: skip
# The diagnose's: short prompts and longer answers, so that decoding (which batches) and
# not prefill (which each request pays alone) is most of a rollout's work.
PROBE_WORK = ("--prompt-tokens", "32,8", "--output-tokens", "64,0", "--extra-body",
              '{"ignore_eos": true}')  # fmt: skip


@pytest.fixture(scope="module")
def two_replicas(
    vllm_install: VllmInstall, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VllmServer]]:
    """Two servers of the wide model, each on a core of its own, started together."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two replicas need two cores, one each")
    log_dir = tmp_path_factory.mktemp("vllm-replicas")
    servers = [
        VllmServer(
            vllm_install.wide_model,
            {**TEST_FLAGS, **WIDE_FLAGS, "max_num_seqs": 16},
            command=["taskset", "-c", str(cpu), *vllm_install.command],
            env={**TEST_ENV, "VLLM_CPU_OMP_THREADS_BIND": str(cpu)},
            log_path=log_dir / f"vllm-{i}.log",
            startup_timeout_s=300,
        )
        for i, cpu in enumerate(cpus[:2])
    ]

    async def start_all() -> None:
        await asyncio.gather(*(server.start() for server in servers))

    started = time.monotonic()
    try:
        asyncio.run(start_all())
        print(f"\ntwo vLLM replicas up in {time.monotonic() - started:.0f} s")
        yield servers
    finally:
        for server in servers:
            server.stop_sync()


def _urls(servers: list[VllmServer]) -> list[str]:
    return [word for server in servers for word in ("--base-url", server.base_url or "")]


def _logs(servers: list[VllmServer]) -> str:
    return "".join(server.log_tail() for server in servers)


def test_collect_spreads_groups_over_both_and_reads_each_ones_metrics(
    two_replicas: list[VllmServer], tmp_path: Path
) -> None:
    started = time.monotonic()
    result = autotune(
        "collect", *_urls(two_replicas), "--synthetic", str(TASKS), "--num-repeats",
        str(REPEATS), *WORK, "--parallelism", "8", "--output-dir", str(tmp_path),
        "--json", "--quiet", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + _logs(two_replicas)
    summary: dict[str, Any] = orjson.loads(result.stdout)
    total = TASKS * REPEATS
    assert (summary["completed"], summary["failed"]) == (total, 0)
    rows = read_rows(tmp_path / "rollouts.jsonl")
    keys = {(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows}
    assert len(rows) == len(keys) == total  # every rollout saved exactly once
    first, second = summary["replicas"]
    assert [first["url"], second["url"]] == [s.base_url for s in two_replicas]
    assert first["completed"] > 0 and second["completed"] > 0
    assert first["completed"] + second["completed"] == total
    for replica in (first, second):
        server = replica["server"]
        assert replica["up"] and replica["times_down"] == 0
        assert server["generation_tokens"] > 0
        # Exported by this build and on by default: repeats of a prompt hit the cache.
        assert server["prefix_cache_queries"] > 0
        assert 0 < server["prefix_cache_hits"] <= server["prefix_cache_queries"]
    generated = first["server"]["generation_tokens"] + second["server"]["generation_tokens"]
    # The two /metrics together saw what the client counted (vLLM may record the last
    # request's tokens a moment after answering it, hence not exact equality).
    assert 0.95 * summary["output_tokens"] <= generated <= summary["output_tokens"]
    print(
        f"collect {total} rollouts in {time.monotonic() - started:.0f} s "
        f"({summary['rollouts_per_s']:.2f}/s); "
        + "; ".join(
            f"replica {r['index']}: {r['completed']} calls ({r['calls_per_s']:.2f}/s), "
            f"{r['server']['generation_tokens']:.0f} tokens generated, prefix cache "
            f"{r['server']['prefix_cache_hits']:.0f}/{r['server']['prefix_cache_queries']:.0f}"
            f" tokens hit"
            for r in (first, second)
        )
        + f"; client counted {summary['output_tokens']} output tokens, servers {generated:.0f}"
    )


def test_diagnose_measures_each_replica_in_every_probe(
    two_replicas: list[VllmServer], tmp_path: Path
) -> None:
    started = time.monotonic()
    result = autotune(
        "diagnose", *_urls(two_replicas), "--low", "2", "--high", "8", "--min-s", "3",
        "--max-s", "40", "--synthetic", "200", *PROBE_WORK, "--no-stream",
        "--output-dir", str(tmp_path), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + _logs(two_replicas)
    diagnosis: dict[str, Any] = orjson.loads((tmp_path / "diagnose.json").read_bytes())
    # Two replicas of 16 sequences each, 1 then 4 in flight on each: continuous batching
    # still has room, so throughput grows with parallelism, as on one 64-sequence server.
    verdict = diagnosis["verdict"]
    assert verdict["verdict"] == "parallelism-bound", verdict["confidence"]
    high = max(diagnosis["probes"], key=lambda probe: probe["parallelism"])
    assert high["parallelism"] == 8
    first, second = high["replicas"]
    assert [first["url"], second["url"]] == [s.base_url for s in two_replicas]
    for index, replica in enumerate((first, second)):
        assert replica["completed"] > 0 and replica["calls_per_s"] > 0
        assert replica["server"]["generation_tokens"] > 0
        # Its own /metrics, as the probe's telemetry keys it.
        assert f"server/replica{index}:vllm:generation_tokens_total" in high["telemetry"]
    print(
        f"diagnose in {time.monotonic() - started:.0f} s: verdict "
        f"{diagnosis['verdict']['verdict']}; "
        + "; ".join(
            f"parallelism {probe['parallelism']}: {probe['rollouts_per_s']:.2f} rollouts/s ("
            + ", ".join(
                f"replica {r['index']} {r['calls_per_s']:.2f} calls/s, waiting "
                f"{r['server'].get('waiting', float('nan')):.1f}"
                for r in probe["replicas"]
            )
            + ")"
            for probe in diagnosis["probes"]
        )
    )
