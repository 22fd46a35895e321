"""The telemetry Sampler contract (telemetry/recorder.py's `Sampler`), over every source.

Telemetry never fails a probe: a sampler returns finite float readings or nothing, and
a source it cannot read (no GPU, no /metrics) makes it unavailable with a one-sentence
reason instead of an exception. A new Sampler joins `SAMPLERS` and the `source` fixture.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from autotune.telemetry import (
    ClientSampler,
    GpuSampler,
    PrometheusSampler,
    Sampler,
    TelemetryRecorder,
    gpu_count,
)
from tests.helpers import ServeApp, free_port

SAMPLERS = ["client", "server", "server-unreachable", "gpu"]
SOURCES = {"client", "server", "gpu"}  # Sample.source: what reports group readings by
METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 3.0\n'
    'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
)


@dataclass
class Source:
    sampler: Sampler
    readable: bool  # whether this source can be read here


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=METRICS)


@pytest.fixture(params=SAMPLERS)
async def source(
    request: pytest.FixtureRequest, session: aiohttp.ClientSession, serve_app: ServeApp
) -> AsyncIterator[Source]:
    kind = request.param
    if kind == "client":
        sampler: Sampler = ClientSampler()
        readable = True
    elif kind == "server":
        app = web.Application()
        app.router.add_get("/metrics", _metrics)
        sampler = PrometheusSampler(session, await serve_app(app) + "/metrics")
        readable = True
    elif kind == "server-unreachable":
        sampler = PrometheusSampler(session, f"http://127.0.0.1:{free_port()}/metrics")
        readable = False
    elif kind == "gpu":
        sampler = GpuSampler()
        readable = gpu_count() > 0  # none on a developer's laptop or a CI runner
    else:
        raise AssertionError(f"no fixture for the sampler {kind!r}")
    yield Source(sampler, readable)
    await sampler.aclose()


def _check_readings(values: dict[str, float] | None) -> None:
    if values is None:
        return
    assert isinstance(values, dict) and values, "nothing to report is None, not {}"
    for name, value in values.items():
        assert isinstance(name, str) and name
        assert isinstance(value, float), (name, value)
        assert math.isfinite(value), (name, value)


def _check_unavailable(sampler: Sampler) -> None:
    """Unavailable, with a reason in the words every report shows: `no gpu telemetry: …`."""
    assert sampler.available is False
    assert isinstance(sampler.reason, str), "an unavailable source says why"
    assert sampler.reason.lower().startswith(f"no {sampler.name} telemetry: "), sampler.reason
    assert len(sampler.reason) > len(f"no {sampler.name} telemetry: ") + 10, sampler.reason


async def test_a_sampler_names_its_source_and_says_why_it_is_unavailable(source: Source) -> None:
    sampler = source.sampler
    assert sampler.name in SOURCES
    assert isinstance(sampler.available, bool)
    if not sampler.available:
        _check_unavailable(sampler)


async def test_sample_gives_finite_floats_or_nothing_and_never_raises(source: Source) -> None:
    sampler = source.sampler
    readings = [await sampler.sample() for _ in range(2)]
    for values in readings:
        _check_readings(values)
    if source.readable:
        assert sampler.available, sampler.reason
        assert readings[-1], "a readable source reports something by its second sample"
    else:
        _check_unavailable(sampler)
        assert readings == [None, None]
        assert await sampler.sample() is None, "an unavailable source stays quiet"


async def test_aclose_may_be_called_twice(source: Source) -> None:
    await source.sampler.sample()
    await source.sampler.aclose()
    await source.sampler.aclose()


async def test_a_recorder_gets_readings_or_a_reason_from_it(source: Source) -> None:
    sampler = source.sampler
    async with TelemetryRecorder([sampler], interval_s=0.01) as recorder:
        pass  # the recorder takes one last reading on a clean exit
    samples = [s for s in recorder.samples if s.source == sampler.name]
    for sample in samples:
        _check_readings(sample.values)
    if source.readable:
        assert samples, recorder.unavailable
        assert sampler.name not in recorder.unavailable
    else:
        assert samples == []
        assert recorder.unavailable[sampler.name] == sampler.reason
