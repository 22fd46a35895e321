"""The probe's own count beside the server's: a Prometheus counter read at a window's
edges (interpolated between scrapes), and the client's output tokens/s and completions/s
checked against vLLM's generation-token and finished-request counters over the same
windows. Why: docs/design/probes.md.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from autotune.telemetry import Sample

TOKEN_MISMATCH_THRESHOLD = 0.10  # a difference past this (or the rate's own precision) is reported


def read_at(counter: Sequence[tuple[float, float]], t: float) -> float | None:
    """A counter's value at `t`, interpolated between the readings around it; None
    outside them."""
    index = bisect_left(counter, (t,))
    if index == 0 or index == len(counter):
        return counter[index][1] if index < len(counter) and counter[index][0] == t else None
    (t0, v0), (t1, v1) = counter[index - 1], counter[index]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def server_tokens(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """The server's own count of generated tokens over time, where it has one."""
    return server_counter(samples, "vllm:generation_tokens_total")


def server_counter(samples: Sequence[Sample], name: str) -> list[tuple[float, float]]:
    return [(s.t, s.values[name]) for s in samples if s.source == "server" and name in s.values]


def counter_rate(
    counter: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]
) -> float | None:
    """A counter's rate over the windows: read at each window's edges, between the
    scrapes around them (a block can be shorter than two scrape intervals)."""
    counted = elapsed = 0.0
    for start, end in windows:
        at_start, at_end = read_at(counter, start), read_at(counter, end)
        if at_start is not None and at_end is not None and end > start:
            counted += at_end - at_start
            elapsed += end - start
    return counted / elapsed if elapsed else None


def token_check(
    samples: Sequence[Sample],
    windows: Sequence[tuple[float, float]],
    client_tps: float,
    precision: float,
    client_requests_per_s: float | None,
) -> dict[str, float] | None:
    """The client's count beside the server's own counters over the same windows: output
    tokens/s against vllm:generation_tokens_total, and (where a rollout is one model call,
    `client_requests_per_s`) completions/s against the requests the server finished
    (vllm:e2e_request_latency_seconds_count). The client counts the tokens of the
    rollouts that finished in a window, which the server generated partly before it: a
    difference within the rate's own relative `precision` is that, not a miscount."""
    server_tps = counter_rate(server_tokens(samples), windows)
    if server_tps is None or (server_tps <= 0 and client_tps <= 0):
        return None
    limit = max(TOKEN_MISMATCH_THRESHOLD, precision)
    relative = abs(client_tps - server_tps) / max(server_tps, client_tps)
    check = {
        "client_tokens_per_s": client_tps,
        "server_tokens_per_s": server_tps,
        "relative_difference": relative,
        "mismatch": float(relative > limit),
    }
    ended = server_counter(samples, "vllm:e2e_request_latency_seconds_count")
    server_rps = counter_rate(ended, windows)
    if client_requests_per_s is not None and server_rps:
        apart = abs(client_requests_per_s - server_rps) / max(server_rps, client_requests_per_s)
        check |= {
            "client_requests_per_s": client_requests_per_s,
            "server_requests_per_s": server_rps,
            "requests_relative_difference": apart,
            "requests_mismatch": float(apart > limit),
        }
    return check
