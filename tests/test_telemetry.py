"""Telemetry: parsing vLLM's /metrics, each sampler's readings and failures, the recorder,
and the window summaries."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
import types
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from autotune.engines import ENGINES
from autotune.telemetry import (
    ClientSampler,
    GpuSampler,
    PrometheusSampler,
    Sample,
    TelemetryRecorder,
    gpu_count,
    gpu_inventory,
    parse_prometheus,
    summarise,
)
from tests.helpers import ServeApp, free_port

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'

# Shaped like vLLM V1's /metrics with two engines (data parallel): per-engine label sets,
# prometheus_client's `_created` series, exponent notation, a timestamp, +Inf, NaN, and
# label values holding quotes, commas and braces.
VLLM_METRICS = f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12204.0
python_gc_objects_collected_total{{generation="1"}} 1573.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76415726312e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{MODEL}}} 12.0
vllm:num_requests_running{{engine="1",{MODEL}}} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{MODEL}}} 3.0 1764157285000
vllm:num_requests_waiting{{engine="1",{MODEL}}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{MODEL}}} 0.8125
vllm:kv_cache_usage_perc{{engine="1",{MODEL}}} 0.4375
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",{MODEL}}} 4.0
vllm:num_preemptions_total{{engine="1",{MODEL}}} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{{engine="0",{MODEL}}} 1.7641572854e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",{MODEL}}} 1.234567e+06
vllm:prompt_tokens_total{{engine="1",{MODEL}}} 7.65433e+05
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",{MODEL}}} 2.5e+05
vllm:generation_tokens_total{{engine="1",{MODEL}}} 1.5e+05
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",{MODEL}}} 500.0
vllm:request_success_total{{engine="0",finished_reason="length",{MODEL}}} 12.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",{MODEL}}} 100.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",{MODEL}}} 400.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 512.0
vllm:time_to_first_token_seconds_count{{engine="0",{MODEL}}} 512.0
vllm:time_to_first_token_seconds_sum{{engine="0",{MODEL}}} 201.5
vllm:time_to_first_token_seconds_bucket{{engine="1",le="0.1",{MODEL}}} 50.0
vllm:time_to_first_token_seconds_bucket{{engine="1",le="1.0",{MODEL}}} 250.0
vllm:time_to_first_token_seconds_bucket{{engine="1",le="+Inf",{MODEL}}} 300.0
vllm:time_to_first_token_seconds_count{{engine="1",{MODEL}}} 300.0
vllm:time_to_first_token_seconds_sum{{engine="1",{MODEL}}} 98.5
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 512.0
vllm:e2e_request_latency_seconds_count{{engine="0",{MODEL}}} 512.0
vllm:e2e_request_latency_seconds_sum{{engine="0",{MODEL}}} 4.096e+03
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 512.0
vllm:request_queue_time_seconds_count{{engine="0",{MODEL}}} 512.0
vllm:request_queue_time_seconds_sum{{engine="0",{MODEL}}} 12.25
# HELP vllm:spec_decode_draft_acceptance_rate Speculative token acceptance rate.
# TYPE vllm:spec_decode_draft_acceptance_rate gauge
vllm:spec_decode_draft_acceptance_rate{{engine="0",{MODEL}}} NaN
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",note="a \\"quoted\\" {{brace}}, comma",{MODEL}}} 1.0
"""


# -- parse_prometheus ---------------------------------------------------------------------


def test_parse_sums_label_sets_and_reads_every_number_form() -> None:
    m = parse_prometheus(VLLM_METRICS)
    assert m["vllm:num_requests_running"] == 21.0
    assert m["vllm:num_requests_waiting"] == 3.0  # the timestamp is not the value
    assert m["vllm:num_preemptions_total"] == 5.0
    assert m["vllm:prompt_tokens_total"] == 2_000_000.0
    assert m["vllm:generation_tokens_total"] == 400_000.0
    assert m["vllm:request_success_total"] == 512.0
    assert m["process_start_time_seconds"] == 1.76415726312e09
    assert m["vllm:time_to_first_token_seconds_sum"] == 300.0
    assert m["vllm:time_to_first_token_seconds_count"] == 812.0
    assert m["vllm:e2e_request_latency_seconds_sum"] == 4096.0
    assert m['vllm:time_to_first_token_seconds_bucket{le="0.1"}'] == 150.0
    assert m['vllm:time_to_first_token_seconds_bucket{le="+Inf"}'] == 812.0
    assert m["vllm:cache_config_info"] == 1.0  # braces and commas inside a label value
    assert "vllm:spec_decode_draft_acceptance_rate" not in m  # NaN only: no reading
    assert not any(name.startswith("#") for name in m)


def test_parse_averages_what_it_is_told_to() -> None:
    m = parse_prometheus(VLLM_METRICS, average=["vllm:kv_cache_usage_perc", "absent"])
    assert m["vllm:kv_cache_usage_perc"] == 0.625
    assert parse_prometheus(VLLM_METRICS)["vllm:kv_cache_usage_perc"] == 1.25


def test_parse_reads_only_the_names_asked_for() -> None:
    wanted = {"vllm:num_requests_running", "vllm:time_to_first_token_seconds_bucket"}
    assert parse_prometheus(VLLM_METRICS, names=wanted) == {
        "vllm:num_requests_running": 21.0,
        'vllm:time_to_first_token_seconds_bucket{le="0.1"}': 150.0,
        'vllm:time_to_first_token_seconds_bucket{le="1.0"}': 650.0,
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"}': 812.0,
    }


def test_parse_infinities_and_garbage() -> None:
    m = parse_prometheus('a +Inf\nb -Inf\nc 1e-3\nnot a metric line\n<html>\nd{x="1"} oops\n')
    assert m == {"a": math.inf, "b": -math.inf, "c": 0.001}
    assert parse_prometheus("<!doctype html>\n<html><body>Not found</body></html>\n") == {}


# -- PrometheusSampler --------------------------------------------------------------------


def _metrics_app(responses: list[tuple[int, str]], hits: list[int]) -> web.Application:
    """Answers /metrics with `responses` in turn (the last one repeats), counting hits."""

    async def metrics(request: web.Request) -> web.Response:
        hits.append(1)
        status, text = responses[min(len(hits), len(responses)) - 1]
        return web.Response(status=status, text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def test_prometheus_sampler_reports_vllm_metrics(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    base = await serve_app(_metrics_app([(200, VLLM_METRICS)], []))
    sampler = PrometheusSampler(session, base + "/metrics")
    values = await sampler.sample()
    assert sampler.available and sampler.reason is None
    assert values == {
        "vllm:num_requests_running": 21.0,
        "vllm:num_requests_waiting": 3.0,
        "vllm:kv_cache_usage_perc": 0.625,
        "vllm:num_preemptions_total": 5.0,
        "vllm:generation_tokens_total": 400_000.0,
        "vllm:prompt_tokens_total": 2_000_000.0,
        "vllm:time_to_first_token_seconds_sum": 300.0,
        "vllm:time_to_first_token_seconds_count": 812.0,
        "vllm:e2e_request_latency_seconds_sum": 4096.0,
        "vllm:e2e_request_latency_seconds_count": 512.0,
        "vllm:request_queue_time_seconds_sum": 12.25,
        "vllm:request_queue_time_seconds_count": 512.0,
    }
    await sampler.aclose()


async def test_prometheus_sampler_takes_the_old_kv_cache_name(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    old = VLLM_METRICS.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    base = await serve_app(_metrics_app([(200, old)], []))
    values = await PrometheusSampler(session, base + "/metrics").sample()
    assert values is not None and values["vllm:kv_cache_usage_perc"] == 0.625


@pytest.mark.parametrize(
    ("status", "text", "why"),
    [
        (404, "404: Not Found", "answered HTTP 404"),
        (200, "<!doctype html><html><body>app</body></html>", "not Prometheus text"),
        (200, "# TYPE other gauge\nother_metric 1\n", "serves no metrics of vLLM, SGLang"),
    ],
)
async def test_prometheus_sampler_gives_up_once_on_a_server_without_metrics(
    serve_app: ServeApp, session: aiohttp.ClientSession, status: int, text: str, why: str
) -> None:
    hits: list[int] = []
    base = await serve_app(_metrics_app([(status, text)], hits))
    sampler = PrometheusSampler(session, base + "/metrics")
    for _ in range(3):
        assert await sampler.sample() is None
    assert not sampler.available
    assert sampler.reason is not None and why in sampler.reason
    assert sampler.reason.startswith("no server telemetry:")
    assert ("not Prometheus text" in sampler.reason) == text.startswith("<")
    assert len(hits) == 1  # no retry storm


async def test_prometheus_sampler_closed_port(session: aiohttp.ClientSession) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    sampler = PrometheusSampler(session, url)
    assert await sampler.sample() is None
    assert not sampler.available
    assert sampler.reason is not None and f"cannot reach {url}" in sampler.reason


async def test_prometheus_sampler_scrape_timeout(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return web.Response(text=VLLM_METRICS)

    app = web.Application()
    app.router.add_get("/metrics", slow)
    sampler = PrometheusSampler(session, await serve_app(app) + "/metrics", timeout_s=0.05)
    assert await sampler.sample() is None
    assert sampler.reason is not None and "did not answer within 0.05 s" in sampler.reason


async def test_prometheus_sampler_rides_out_a_blip_but_not_an_outage(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    hits: list[int] = []
    responses = [(200, VLLM_METRICS), (500, ""), (200, VLLM_METRICS), (500, "")]
    base = await serve_app(_metrics_app(responses, hits))
    sampler = PrometheusSampler(session, base + "/metrics")
    got = [await sampler.sample() for _ in range(6)]
    assert [v is not None for v in got] == [True, False, True, False, False, False]
    assert not sampler.available
    assert sampler.reason is not None and "3 times in a row" in sampler.reason
    assert await sampler.sample() is None and len(hits) == 6


# -- GpuSampler ---------------------------------------------------------------------------


async def test_gpu_sampler_on_this_machine() -> None:
    sampler = GpuSampler()
    values = await sampler.sample()
    if sampler.available:  # a machine with a GPU: real readings
        assert values is not None and values["gpu_util_pct_mean"] >= 0.0
        assert values["gpu0_mem_used_gib"] > 0.0
        assert gpu_count() >= 1 and gpu_inventory()[0]["memory_total_gib"] > 0.0
    else:
        assert values is None
        assert sampler.reason is not None and sampler.reason.startswith("no GPU telemetry:")
        assert gpu_count() == 0 and gpu_inventory() == []
    await sampler.aclose()
    await sampler.aclose()  # closing twice is harmless


def _fake_nvml(driver: list[list[tuple[int, int]]] | None = None) -> types.ModuleType:
    """Two GPUs; the second cannot report power (NVML says NotSupported). `driver`: each
    GPU's utilisation samples as the driver keeps them, (timestamp µs, %); the tests add
    to them as time goes by. Without: a driver that keeps none (NotFound)."""

    class NVMLError(Exception):
        pass

    kept = driver if driver is not None else [[], []]

    def samples(handle: int, kind: int, seen: int) -> tuple[int, list[Any]]:
        assert kind == 1  # NVML_GPU_UTILIZATION_SAMPLES
        fresh = [
            types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=v))
            for t, v in kept[handle]
            if t > seen
        ]
        if not fresh:
            raise NVMLError("Not Found")
        return 1, fresh

    def power(handle: int) -> int:
        if handle == 1:
            raise NVMLError("Not Supported")
        return 350_500

    nvml = types.ModuleType("pynvml")
    calls: dict[str, int] = {"init": 0, "shutdown": 0}

    def init() -> None:
        calls["init"] += 1

    def shutdown() -> None:
        calls["shutdown"] += 1

    nvml.__dict__.update(
        NVMLError=NVMLError,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlSystemGetDriverVersion=lambda: "580.65.06",
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        NVML_GPU_UTILIZATION_SAMPLES=1,
        nvmlDeviceGetSamples=samples,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=[90, 30][h]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            used=[70, 10][h] * 2**30, total=80 * 2**30
        ),
        nvmlDeviceGetPowerUsage=power,
    )
    return nvml


async def test_gpu_sampler_readings_and_aggregates(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = GpuSampler()
    assert sampler.available and sampler.reason is None
    assert await sampler.sample() == {  # no driver samples: the current rate, one sample
        "gpu0_util_pct": 90.0,
        "gpu0_util_samples": 1.0,
        "gpu0_mem_used_gib": 70.0,
        "gpu0_power_w": 350.5,
        "gpu1_util_pct": 30.0,
        "gpu1_util_samples": 1.0,
        "gpu1_mem_used_gib": 10.0,
        "gpu_util_pct_mean": 60.0,
        "gpu_mem_used_gib_total": 80.0,
        "gpu_power_w_total": 350.5,
    }
    await sampler.aclose()
    assert gpu_count() == 2
    assert gpu_inventory()[1] == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_gib": 80.0,
        "driver_version": "580.65.06",
    }
    assert nvml.calls["init"] == nvml.calls["shutdown"] == 3


async def test_gpu_utilisation_averages_every_driver_sample_since_the_last_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reading covers the whole interval since the previous one, not the instant it is
    taken: the mean of every sample the driver took in it, with their count. History
    from before the sampler started is no window's. The instant (GetUtilizationRates:
    90% and 30% here) would read the same whatever the GPU did in between."""
    driver = [[(1, 100), (2, 100)], [(1, 0)]]  # before the probe began
    nvml = _fake_nvml(driver)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = GpuSampler()
    driver[0] += [(10, 0), (11, 50), (12, 100)]
    driver[1] += [(10, 20), (11, 40)]
    first = await sampler.sample()
    driver[0] += [(20, 10)]
    second = await sampler.sample()
    await sampler.aclose()
    assert first is not None and second is not None
    assert (first["gpu0_util_pct"], first["gpu0_util_samples"]) == (50.0, 3.0)
    assert (first["gpu1_util_pct"], first["gpu1_util_samples"]) == (30.0, 2.0)
    assert first["gpu_util_pct_mean"] == 40.0
    assert (second["gpu0_util_pct"], second["gpu0_util_samples"]) == (10.0, 1.0)
    # nothing new on GPU 1: its current rate, one sample
    assert (second["gpu1_util_pct"], second["gpu1_util_samples"]) == (30.0, 1.0)


# -- ClientSampler ------------------------------------------------------------------------


async def test_client_sampler_sees_a_blocked_loop() -> None:
    sampler = ClientSampler()
    first = await sampler.sample()
    assert first is not None and set(first) == {"rss_mb"} and first["rss_mb"] > 10
    await asyncio.sleep(0.15)
    quiet = await sampler.sample()
    time.sleep(0.3)  # blocking the loop is the point
    await asyncio.sleep(0.06)
    blocked = await sampler.sample()
    await sampler.aclose()
    assert quiet is not None and blocked is not None
    assert blocked["loop_lag_ms"] > 200
    assert quiet["loop_lag_ms"] < 100


async def test_client_sampler_cpu_fraction_busy_versus_idle() -> None:
    sampler = ClientSampler()
    await sampler.sample()
    await asyncio.sleep(0.3)
    idle = await sampler.sample()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    busy = await sampler.sample()
    await sampler.aclose()
    assert idle is not None and busy is not None
    # Ratios, not levels: on a loaded shared machine a busy loop may get a fraction of a core.
    assert busy["cpu_fraction"] > max(0.1, 3 * idle["cpu_fraction"])
    assert busy["cpu_fraction"] < 1.5  # one thread cannot use much more than one core


async def test_client_sampler_counts_child_processes() -> None:
    spin = "import time\nend = time.perf_counter() + 5\nwhile time.perf_counter() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        sampler = ClientSampler()
        await sampler.sample()
        await asyncio.sleep(0.4)
        values = await sampler.sample()
        await sampler.aclose()
    finally:
        child.kill()
        child.wait()
    assert values is not None
    assert values["children_cpu_fraction"] > 0.1
    assert values["cpu_fraction"] < values["children_cpu_fraction"]


# -- TelemetryRecorder --------------------------------------------------------------------


class _Broken:
    name = "broken"
    available = True
    reason: str | None = None

    async def sample(self) -> dict[str, float] | None:
        raise RuntimeError("bug")

    async def aclose(self) -> None:
        pass


class _Counter:
    """Counts its samples and closes."""

    name = "server"
    available = True
    reason: str | None = None

    def __init__(self) -> None:
        self.n = 0
        self.closed = False

    async def sample(self) -> dict[str, float] | None:
        self.n += 1
        return {"vllm:generation_tokens_total": 10.0 * self.n}

    async def aclose(self) -> None:
        self.closed = True


async def test_recorder_samples_drops_failures_and_stops_cleanly() -> None:
    counter = _Counter()
    samplers: list[Any] = [ClientSampler(), GpuSampler(), _Broken(), counter]
    before = asyncio.all_tasks()
    start = time.time()
    async with TelemetryRecorder(samplers, interval_s=0.05) as recorder:
        await asyncio.sleep(0.3)
    end = time.time()
    assert asyncio.all_tasks() == before  # recorder and heartbeat tasks are gone
    assert counter.closed
    assert "bug" in recorder.unavailable["broken"]
    if not samplers[1].available:
        assert recorder.unavailable["gpu"].startswith("no GPU telemetry:")
    ticks = [s for s in recorder.samples if s.source == "server"]
    assert 5 <= len(ticks) <= 9  # every 50 ms for 300 ms, plus the one at exit
    assert all(start <= s.t <= end for s in recorder.samples)
    assert {s.source for s in recorder.samples} >= {"client", "server"}
    stats = summarise(recorder.samples, start, end)
    assert stats["server/vllm:generation_tokens_total"]["delta"] == 10.0 * (len(ticks) - 1)
    assert "client/loop_lag_ms" in stats


# -- summarise ----------------------------------------------------------------------------


def test_summarise_window_means_maxima_and_counter_deltas() -> None:
    samples = [
        Sample(0.0, "server", {"vllm:num_requests_running": 100.0, "vllm:prompt_tokens_total": 0}),
        Sample(1.0, "server", {"vllm:num_requests_running": 2.0, "vllm:prompt_tokens_total": 10}),
        Sample(1.0, "client", {"cpu_fraction": 0.5}),
        Sample(3.0, "server", {"vllm:num_requests_running": 6.0, "vllm:prompt_tokens_total": 40}),
        Sample(2.0, "server", {"vllm:num_requests_running": 4.0, "vllm:prompt_tokens_total": 25}),
        Sample(2.0, "client", {"cpu_fraction": 1.0}),
        Sample(9.0, "server", {"vllm:num_requests_running": 0.0, "vllm:prompt_tokens_total": 99}),
    ]
    stats = summarise(samples, 1.0, 3.0)
    assert stats == {
        "server/vllm:num_requests_running": {"mean": 4.0, "max": 6.0, "samples": 3.0},
        "server/vllm:prompt_tokens_total": {
            "mean": 25.0,
            "max": 40.0,
            "samples": 3.0,
            "delta": 30.0,
        },
        "client/cpu_fraction": {"mean": 0.75, "max": 1.0, "samples": 2.0},
    }
    assert summarise(samples, 20.0, 30.0) == {}


def test_summarise_counter_reset_counts_as_restart() -> None:
    values = [100.0, 150.0, 20.0, 50.0]  # the server restarted after 150
    samples = [Sample(float(t), "server", {"x_count": v}) for t, v in enumerate(values)]
    assert summarise(samples, 0.0, 3.0)["server/x_count"]["delta"] == 50.0 + 20.0 + 30.0


SGLANG_METRICS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 12.0
sglang:num_queue_reqs{model_name="m"} 4.0
sglang:token_usage{model_name="m"} 0.5
sglang:max_total_num_tokens{model_name="m"} 65536.0
sglang:prompt_tokens_total{model_name="m"} 9000.0
sglang:cached_tokens_total{model_name="m"} 3000.0
sglang:generation_tokens_total{model_name="m"} 7000.0
sglang:num_retracted_requests_total{model_name="m"} 2.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 30.0
sglang:e2e_request_latency_seconds_count{model_name="m"} 20.0
sglang:e2e_request_latency_seconds_bucket{model_name="m",le="1.0"} 20.0
sglang:queue_time_seconds_sum{model_name="m"} 1.5
sglang:queue_time_seconds_count{model_name="m"} 20.0
"""


async def test_sglang_metrics_are_read_as_autotunes_quantities(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    """Each SGLang family lands under the quantity the checks read; the engine is told."""
    base = await serve_app(_metrics_app([(200, SGLANG_METRICS)], []))
    sampler = PrometheusSampler(session, base + "/metrics")
    values = await sampler.sample()
    assert sampler.engine == "sglang"
    assert values == {
        "vllm:num_requests_running": 12.0,
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.5,
        "vllm:num_preemptions_total": 2.0,
        "vllm:generation_tokens_total": 7000.0,
        "vllm:prompt_tokens_total": 9000.0,
        "vllm:prefix_cache_queries_total": 9000.0,
        "vllm:prefix_cache_hits_total": 3000.0,
        "vllm:e2e_request_latency_seconds_sum": 30.0,
        "vllm:e2e_request_latency_seconds_count": 20.0,
        "vllm:request_queue_time_seconds_sum": 1.5,
        "vllm:request_queue_time_seconds_count": 20.0,
        "kv_capacity_tokens": 65536.0,
    }


def _trtllm_app(prometheus: str | None) -> web.Application:
    """TensorRT-LLM's JSON iteration stats at /metrics, Prometheus text at its own path
    when given."""

    async def stats(request: web.Request) -> web.Response:
        stat = {
            "iterLatencyMS": 12.0,
            "numActiveRequests": 7,
            "numQueuedRequests": 1,
            "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 25, "tokensPerBlock": 32},
        }
        return web.json_response([stat])

    async def text(request: web.Request) -> web.Response:
        return web.Response(text=prometheus or "", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", stats)
    if prometheus is not None:
        app.router.add_get("/prometheus/metrics", text)
    return app


TRTLLM_RUNNING = ENGINES["trtllm"].metrics.names["vllm:num_requests_running"]


@pytest.mark.parametrize("prometheus", [None, f"{TRTLLM_RUNNING} 9\n"])
async def test_tensorrt_llm_is_read_from_its_prometheus_path_else_its_iteration_stats(
    serve_app: ServeApp, session: aiohttp.ClientSession, prometheus: str | None
) -> None:
    base = await serve_app(_trtllm_app(prometheus))
    sampler = PrometheusSampler(session, base + "/metrics")
    values = await sampler.sample()
    assert sampler.engine == "trtllm"
    if prometheus is None:
        assert values == {
            "vllm:num_requests_running": 7.0,
            "vllm:num_requests_waiting": 1.0,
            "vllm:kv_cache_usage_perc": 0.25,
            "kv_capacity_tokens": 3200.0,
        }
    else:
        assert values == {"vllm:num_requests_running": 9.0}


async def test_an_sglang_server_without_metrics_is_told_what_serves_them(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    async def info(request: web.Request) -> web.Response:
        return web.json_response({"tp_size": 1})

    app = web.Application()
    app.router.add_get("/get_server_info", info)
    base = await serve_app(app)
    sampler = PrometheusSampler(session, base + "/metrics")
    assert await sampler.sample() is None
    assert not sampler.available and sampler.engine == "sglang"
    assert sampler.reason is not None and "--enable-metrics" in sampler.reason


async def test_an_idle_tensorrt_llm_answers_no_stats_and_is_still_read(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    """Its JSON /metrics empties its queue of iteration stats: an idle server answers []."""

    async def empty(request: web.Request) -> web.Response:
        return web.json_response([])

    app = web.Application()
    app.router.add_get("/metrics", empty)
    sampler = PrometheusSampler(session, await serve_app(app) + "/metrics")
    assert await sampler.sample() == {}
    assert await sampler.sample() == {}
    assert sampler.available and sampler.engine == "trtllm"


async def test_sglang_kv_use_over_data_parallel_ranks_is_their_mean(
    serve_app: ServeApp, session: aiohttp.ClientSession
) -> None:
    text = 'sglang:token_usage{dp_rank="0"} 0.25\nsglang:token_usage{dp_rank="1"} 0.75\n'
    sampler = PrometheusSampler(
        session, await serve_app(_metrics_app([(200, text)], [])) + "/metrics"
    )
    assert await sampler.sample() == {"vllm:kv_cache_usage_perc": 0.5}
