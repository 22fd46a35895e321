"""Several replicas of one model behind one run: the rotation's rules, and collect against
two simulated replicas of unequal speed (one of them killed mid-run)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from autotune.diagnose.classify import _replica_notes
from autotune.results.probes import ProbeResult
from autotune.results.stages import ReplicaStats
from autotune.rollout.replicas import ReplicaSet, calls_heard, replica_stats, several
from autotune.servers.launcher import ServerSpec
from autotune.telemetry.prometheus import PrometheusSampler
from tests.helpers import (
    HANG_S,
    REPO,
    ServeApp,
    autotune,
    free_port,
    one_sentence_error,
    read_rows,
    server_process,
)

# -- the rotation ----------------------------------------------------------------------------


def test_only_several_replicas_are_told_apart() -> None:
    """A lone replica's figures are the run's own: collect and the probes read none."""
    pair = ReplicaSet(["http://a/v1", "http://b/v1"])
    assert several(pair) is pair
    assert several(ReplicaSet(["http://a/v1"])) is None
    assert several(None) is None


def test_fewest_outstanding_wins_and_a_finished_call_frees_its_slot() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"])
    first, second, third = replicas.acquire(), replicas.acquire(), replicas.acquire()
    assert (first.index, second.index, third.index) == (0, 1, 0)
    replicas.succeeded(second, 0.1, 10)  # b is now the less busy one
    assert replicas.acquire().index == 1


def test_affinity_keeps_a_group_on_one_replica_within_the_slack() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"], affinity_slack=2)
    group = [replicas.acquire(key=7) for _ in range(3)]
    # a holds 0, 1, 2 in flight against b's 0, 0, 0: the third is beyond the slack.
    assert [r.index for r in group] == [0, 0, 0]
    assert replicas.acquire(key=7).index == 1  # a is 3 ahead: the group spills over
    assert replicas.acquire(key=8).index == 1  # an unkeyed group takes the least busy


def test_connection_failures_take_a_replica_out_until_a_trial_call_succeeds() -> None:
    now = [0.0]
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"], down_after=2, clock=lambda: now[0])
    a = replicas.replicas[0]
    for _ in range(2):
        call = replicas.acquire(avoid=replicas.replicas[1])
        assert call is a
        replicas.failed(call, "connection", "refused")
    assert not a.up and a.down_reason == "refused"
    assert {replicas.acquire().index for _ in range(4)} == {1}
    now[0] += 10  # past retry_after_s: one call tries it again
    trial = replicas.acquire()
    assert trial is a
    replicas.succeeded(trial, 0.1, 5)
    assert a.up and a.times_down == 1


def test_an_http_error_from_a_live_replica_does_not_take_it_out() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"], down_after=1)
    call = replicas.acquire()
    replicas.failed(call, "http_5xx", "HTTP 500")
    assert call.up and call.failures_by_class == {"http_5xx": 1}


def test_a_retry_avoids_the_replica_it_failed_on() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"])
    failed = replicas.acquire()
    replicas.failed(failed, "timeout", "slow")
    assert replicas.acquire(avoid=failed) is not failed


def test_replica_stats_read_each_replicas_metrics_and_gpus() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"], gpus=[(0, 1), (2, 3)])
    for replica, latency in ((replicas.replicas[0], 0.2), (replicas.replicas[1], 0.4)):
        replicas.acquire()  # a, then b
        replicas.succeeded(replica, latency, 100)
    telemetry = {
        "server/replica0:vllm:num_requests_waiting": {"mean": 3.0, "max": 5.0},
        "server/replica1:vllm:prefix_cache_queries_total": {"mean": 0, "max": 0, "delta": 800},
        "server/replica1:vllm:prefix_cache_hits_total": {"mean": 0, "max": 0, "delta": 600},
        "gpu/gpu2_util_pct": {"mean": 90.0, "max": 99.0},
        "gpu/gpu3_util_pct": {"mean": 70.0, "max": 80.0},
    }
    a, b = replica_stats(replicas.snapshot(), replicas.replicas, 2.0, telemetry)
    assert a.server == {"waiting": 3.0} and a.gpu == {} and a.mean_latency_s == 0.2
    assert b.prefix_cache_hit_share == 0.75 and b.gpus == [2, 3]
    assert b.gpu == {"util_pct": 80.0} and b.output_tokens_per_s == 50.0


def _replica(index: int, **fields: object) -> ReplicaStats:
    base: dict = dict(
        index=index, url=f"http://r{index}/v1", completed=100, failed=0, calls_per_s=10.0,
        output_tokens_per_s=100.0, mean_latency_s=0.5, up=True, times_down=0,
    )  # fmt: skip
    return ReplicaStats(**{**base, **fields})


def _probe(*replicas: ReplicaStats) -> ProbeResult:
    return ProbeResult(16, 20.0, (19.0, 21.0), 200.0, 0.0, 200, 0, 10.0, 1.0, "precision",
                       replicas=list(replicas))  # fmt: skip


def test_diagnose_names_the_one_failing_replica_and_not_a_shared_problem() -> None:
    dead = _replica(1, failed=40, up=False, times_down=1, down_reason="connection refused")
    (note,) = _replica_notes(_probe(_replica(0), dead))
    assert note.startswith("replica http://r1/v1 failed 40 of 140 calls")
    assert "connection refused" in note
    both = _replica_notes(_probe(_replica(0, failed=40), _replica(1, failed=40)))
    assert both == []  # every replica failing is the server's problem: the verdict's
    slow = _replica_notes(_probe(_replica(0), _replica(1, mean_latency_s=1.0)))
    assert len(slow) == 1 and "replica http://r1/v1 answers 2.0× slower" in slow[0]
    assert _replica_notes(_probe(_replica(0))) == []


async def test_one_sampler_reads_every_replica_and_outlives_a_dead_one(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    def metrics(waiting: float, kv: float) -> web.Application:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(
                text=f"vllm:num_requests_waiting {waiting}\nvllm:kv_cache_usage_perc {kv}\n"
            )

        app = web.Application()
        app.router.add_get("/metrics", handler)
        return app

    first = await serve_app(metrics(2, 0.5))
    second = await serve_app(metrics(6, 0.9))
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    sampler = PrometheusSampler(session, [first + "/metrics", second + "/metrics", dead])
    values = await sampler.sample()
    assert sampler.available
    assert values == {
        "replica0:vllm:num_requests_waiting": 2.0,
        "replica0:vllm:kv_cache_usage_perc": 0.5,
        "replica1:vllm:num_requests_waiting": 6.0,
        "replica1:vllm:kv_cache_usage_perc": 0.9,
        "vllm:num_requests_waiting": 8.0,  # queues add up
        "vllm:kv_cache_usage_perc": 0.7,  # a fraction per replica: averaged
    }


# -- two simulated replicas behind one collect -----------------------------------------------

# Slow enough in real time (~80 and ~32 rollouts/s) that neither the client nor the
# servers' event loops are what limits them on a small machine: the model steps are.
FAST = ["--time-scale", "0.5", "--max-num-seqs", "8"]
SLOW = ["--time-scale", "1.25", "--max-num-seqs", "8"]  # each step 2.5 times as long
WORK = ["--prompt-tokens", "64", "--output-tokens", "32"]


def _collect(*base_urls: str, parallelism: int, tasks: int, output_dir: Path) -> dict:
    urls = [word for url in base_urls for word in ("--base-url", url)]
    result = autotune(
        "collect", *urls, *WORK, "--synthetic", str(tasks), "--parallelism", str(parallelism),
        "--extra-body", '{"ignore_eos": true}', "--output-dir", str(output_dir), "--json",
        "--quiet", timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


@pytest.mark.measures  # three throughputs compared: a neighbour's load skews one
def test_two_unequal_replicas_share_by_speed_and_reach_their_summed_capacity(
    tmp_path: Path,
) -> None:
    with (
        server_process(ServerSpec.sim(FAST)) as fast,
        server_process(ServerSpec.sim(SLOW)) as slow,
    ):
        # Alone, each at twice its batch: saturated, so this is its capacity.
        alone_fast = _collect(fast, parallelism=16, tasks=320, output_dir=tmp_path / "fast")
        alone_slow = _collect(slow, parallelism=16, tasks=160, output_dir=tmp_path / "slow")
        both = _collect(fast, slow, parallelism=32, tasks=600, output_dir=tmp_path / "both")
    capacity = alone_fast["rollouts_per_s"] + alone_slow["rollouts_per_s"]
    assert alone_fast["rollouts_per_s"] > 1.8 * alone_slow["rollouts_per_s"]
    assert both["completed"] == 600 and both["failed"] == 0
    first, second = both["replicas"]
    assert first["url"] == fast and second["url"] == slow
    assert first["completed"] + second["completed"] == 600
    assert first["completed"] > 1.8 * second["completed"]  # the faster one got more
    assert both["rollouts_per_s"] >= 0.9 * capacity, (both["rollouts_per_s"], capacity)
    print(
        f"alone {alone_fast['rollouts_per_s']:.1f} + {alone_slow['rollouts_per_s']:.1f} rollouts/s;"
        f" together {both['rollouts_per_s']:.1f} ({both['rollouts_per_s'] / capacity:.0%})"
    )


def test_a_replica_killed_mid_run_loses_no_rollout(tmp_path: Path) -> None:
    out = tmp_path / "rollouts.jsonl"
    with (
        server_process(ServerSpec.sim(FAST)) as kept,
        ServerSpec.sim(FAST).process() as doomed,
    ):
        command = [
            sys.executable, "-m", "autotune", "collect", "--base-url", kept,
            "--base-url", doomed.base_url or "", *WORK, "--synthetic", "600",
            "--parallelism", "16",
            "--extra-body", '{"ignore_eos": true}', "--output-dir", str(tmp_path), "--json",
            "--quiet",
        ]  # fmt: skip
        run = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + HANG_S
        while not out.exists() or len(out.read_bytes().splitlines()) < 150:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, f"not 150 rows within {HANG_S:g} s"
            time.sleep(0.05)
        assert doomed.pid is not None
        os.killpg(doomed.pid, signal.SIGKILL)  # mid-run, with calls in flight on it
        stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 0, stderr
    summary = orjson.loads(stdout)
    rows = read_rows(out)
    keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows]
    assert len(rows) == 600 and len(set(keys)) == 600 and summary["failed"] == 0
    alive, dead = summary["replicas"]
    assert alive["up"] and not dead["up"] and dead["times_down"] == 1
    assert "connection" in (dead["down_reason"] or "")
    assert alive["completed"] > dead["completed"] > 0


def test_bad_replica_flags_are_one_sentence() -> None:
    url = "http://127.0.0.1:9/v1"
    same = one_sentence_error(autotune("collect", "--base-url", url, "--base-url", url + "/"))
    assert "same server twice" in same
    two = ["--base-url", url, "--base-url", "http://127.0.0.1:10/v1"]
    gpus = one_sentence_error(autotune("collect", *two, "--replica-gpus", "0"))
    assert "once per --base-url" in gpus
    unreachable = one_sentence_error(autotune("collect", *two))
    assert "cannot reach the model server at http://127.0.0.1:9/v1" in unreachable


def test_diagnose_probes_each_replica_and_names_the_saturated_one(tmp_path: Path) -> None:
    with (
        server_process(ServerSpec.sim(FAST)) as roomy,
        server_process(ServerSpec.sim(["--time-scale", "0.5", "--max-num-seqs", "2"])) as narrow,
    ):
        result = autotune(
            "diagnose", "--base-url", roomy, "--base-url", narrow, "--low", "2", "--high", "16",
            "--max-s", "8", *WORK, "--extra-body", '{"ignore_eos": true}',
            "--output-dir", str(tmp_path), "--json", timeout=180,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    diagnosis = orjson.loads(result.stdout)
    high = max(diagnosis["probes"], key=lambda probe: probe["parallelism"])
    first, second = high["replicas"]
    assert (first["url"], second["url"]) == (roomy, narrow)
    assert first["completed"] > second["completed"] > 0
    # Each replica's own /metrics: the narrow one (2 slots for ~8 calls) keeps a queue.
    assert second["server"]["waiting"] > 1 > first["server"]["waiting"]
    assert first["server"]["generation_tokens"] > second["server"]["generation_tokens"] > 0
    notes = " ".join(diagnosis["verdict"]["notes"])
    assert f"replica {narrow} is saturated" in notes and roomy not in notes
    page = (tmp_path / "index.html").read_text()
    assert "<h2>Replicas</h2>" in page and narrow in page


def test_under_heavy_load_a_group_stays_put_within_a_share_of_the_load() -> None:
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"], affinity_slack=2, affinity_share=0.25)
    for _ in range(100):  # 50 calls in flight on each
        replicas.acquire()
    group = [replicas.acquire(key="task-9") for _ in range(8)]
    # 50 in flight on the least busy: 12.5 more is within the share, so all 8 stay.
    assert len({r.index for r in group}) == 1


def test_a_windows_calls_are_those_that_ended_inside_it_whenever_it_was_counted() -> None:
    """A burst of calls ending together just after a window's start: counted by when each
    call ended, not by snapshots taken a quarter-second apart around it."""
    replicas = ReplicaSet(["http://a/v1", "http://b/v1"])
    ticks = itertools.count()

    def calls(count: int, latency_s: float, tokens: int) -> None:
        """`count` calls in flight at once (spread by fewest outstanding), then all done."""
        for replica in [replicas.acquire() for _ in range(count)]:
            replicas.succeeded(replica, latency_s, tokens)

    with calls_heard(replicas, clock=lambda: float(next(ticks))) as heard:
        calls(3, 1.0, 10)  # before the window, which starts as the third ends (t=2)
        before = replicas.snapshot()
        calls(5, 2.0, 20)  # the burst inside it: on replicas 0, 1, 0, 1, 0
        replicas.failed(replicas.acquire(), "http_5xx", "HTTP 500")
    calls(1, 3.0, 30)  # after: no longer heard
    inside = [call for t, call in heard if 2 < t <= 8]
    counts = [
        after.since(earlier).with_calls(inside)
        for earlier, after in zip(before, replicas.snapshot(), strict=True)
    ]
    assert [c.completed for c in counts] == [3, 2]
    assert [c.failed for c in counts] == [1, 0]
    assert [c.output_tokens for c in counts] == [60, 40]
    assert [c.latency_sum_s for c in counts] == [6.0, 4.0]
    assert len(heard) == 9 and replicas.on_call is None


def test_replica_counts_cover_the_same_window_as_the_probe_when_timed_in_tokens(
    tmp_path: Path,
) -> None:
    """Rollouts of ~5 s against a 40 s cap are timed in tokens, in blocks of 11-14 s
    whose windows start once every slot generates, long before every slot has finished a
    rollout: each replica's calls are counted over that window, as the probe's
    completions are (counted from the completions' warm-up, half of them were missed; from
    the look nearest the window's start, a burst of calls ending together, 3 of 40)."""
    flags = ["--time-scale", "0.5", "--max-num-seqs", "16"]
    with (
        server_process(ServerSpec.sim(flags)) as first,
        server_process(ServerSpec.sim(flags)) as second,
    ):
        result = autotune(
            "diagnose", "--base-url", first, "--base-url", second, "--low", "2", "--high", "8",
            "--max-s", "40", "--synthetic", "200", "--output-tokens", "800,0",
            "--extra-body", '{"ignore_eos": true}', "--output-dir", str(tmp_path), timeout=240,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for probe in orjson.loads((tmp_path / "diagnose.json").read_bytes())["probes"]:
        assert all("(in tokens)" in block["stop_reason"] for block in probe["blocks"])
        # One call a rollout, ending just before the rollout does: the same window holds both.
        assert sum(replica["completed"] for replica in probe["replicas"]) == probe["completed"]
