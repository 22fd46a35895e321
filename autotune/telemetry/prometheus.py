"""The model server's own view of its load, scraped from its `/metrics` (vLLM's, SGLang's
or TensorRT-LLM's: each engine's names read as autotune's quantities, engines/known.py).
Why: docs/design/telemetry.md.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Collection, Iterable, Sequence

import aiohttp
import orjson

from autotune.engines import ENGINES, Engine
from autotune.engines.description import ABORTED, HISTOGRAMS, KV_USAGE, RUNNING, WAITING

# num_gpu_blocks × block_size, over engines, from vllm:cache_config_info's labels
KV_CAPACITY_TOKENS = "kv_capacity_tokens"
REPORTED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:prefix_cache_queries_total",  # prompt tokens looked up in the prefix cache
    "vllm:prefix_cache_hits_total",  # ... and found there
    ABORTED,  # requests the engine aborted (SGLang's counter; vLLM labels its finishes)
    "autotune_simulated",  # 1 from autotune's simulated server: nothing here is a real GPU
    "autotune_max_num_seqs",  # the simulator's batch limit (vLLM serves none)
    KV_CAPACITY_TOKENS,
)
"""What the sampler reports, under these names."""

_KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # the name before vLLM's V1 engine
_KV_USAGE_NAMES = tuple(
    e.metrics.names[KV_USAGE] for e in ENGINES.values() if KV_USAGE in e.metrics.names
)
_AVERAGED = (*_KV_USAGE_NAMES, _KV_USAGE_OLD)  # a fraction per engine (or rank): mean, not sum
_OTHER_ENGINES = tuple(engine for engine in ENGINES.values() if engine.name != "vllm")


def _families(engine: Engine) -> set[str]:
    """The metric names an engine's families are read under (histograms: _sum, _count)."""
    names = set()
    for quantity, family in engine.metrics.names.items():
        names |= {family + "_sum", family + "_count"} if quantity in HISTOGRAMS else {family}
    return names | ({engine.metrics.kv_capacity} if engine.metrics.kv_capacity else set())


_WANTED = frozenset(
    (*REPORTED, _KV_USAGE_OLD, *(name for e in _OTHER_ENGINES for name in _families(e)))
)
_MAX_FAILURES = 3  # consecutive failed scrapes, after a good one, before giving up

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LE = re.compile(r'(?:^|,)\s*le="([^"]*)"')


def parse_prometheus(
    text: str, average: Collection[str] = (), names: Collection[str] | None = None
) -> dict[str, float]:
    """Each metric in Prometheus text format, summed over its label sets.

    Histogram buckets stay apart per bound, keyed `name_bucket{le="0.5"}`. Names in
    `average` are averaged over their label sets instead (a per-engine fraction). Given
    `names`, only those metrics are read: a vLLM scrape is ~1,000 lines of buckets and
    this keeps a scrape well under a millisecond. NaN samples are skipped; lines that are
    not samples (comments, garbage) are ignored, so an empty result means the text was
    not Prometheus.
    """
    prefixes = tuple(names) if names is not None else ""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(prefixes) or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace == -1:
            name, _, rest = line.partition(" ")
            labels = ""
        else:
            close = line.rfind("}")  # label values may hold '}', what follows cannot
            name, labels, rest = line[:brace], line[brace + 1 : close], line[close + 1 :]
        if (names is not None and name not in names) or not _NAME.fullmatch(name):
            continue
        try:
            value = float(rest.split(maxsplit=1)[0])  # a timestamp may follow
        except (ValueError, IndexError):
            continue
        if math.isnan(value):
            continue
        if labels and name.endswith("_bucket") and (le := _LE.search(labels)):
            name = f'{name}{{le="{le.group(1)}"}}'
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    for name in average:
        if name in sums:
            sums[name] /= counts[name]
    return sums


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def kv_capacity_tokens(text: str) -> float | None:
    """The tokens the server's KV cache holds, over its engines: vLLM states each engine's
    `num_gpu_blocks` and `block_size` as labels of its `vllm:cache_config_info` gauge."""
    total = None
    for match in _CACHE_INFO.finditer(text):
        labels = dict(_LABEL.findall(match.group(1)))
        try:
            tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            continue  # a label left None before the cache was sized
        total = (total or 0.0) + tokens
    return total


def engine_of(metrics: dict[str, float]) -> Engine | None:
    """The engine whose own families these are (told by their prefix), None for none."""
    for engine in ENGINES.values():
        if any(name.startswith(engine.metrics.prefix) for name in metrics):
            return engine
    return None


def as_quantities(metrics: dict[str, float], engine: Engine) -> dict[str, float]:
    """`metrics` read under autotune's quantity names (vLLM's: the identity)."""
    if engine.name == "vllm":
        return metrics
    found: dict[str, float] = {}
    for quantity, family in engine.metrics.names.items():
        suffixes = ("_sum", "_count") if quantity in HISTOGRAMS else ("",)
        for suffix in suffixes:
            if family + suffix in metrics:
                found[quantity + suffix] = metrics[family + suffix]
    capacity = engine.metrics.kv_capacity
    if capacity is not None and capacity in metrics:
        found[KV_CAPACITY_TOKENS] = metrics[capacity]
    found.update({name: value for name, value in metrics.items() if name.startswith("autotune_")})
    return found


def iteration_stats(text: str) -> dict[str, float] | None:
    """TensorRT-LLM's JSON `/metrics` (its iteration stats, newest last) as autotune's
    quantities: requests running and waiting, KV use and capacity (none while it is idle:
    its queue of stats is empty); None if it is not that."""
    try:
        stats = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(stats, list):
        return None
    last = stats[-1] if stats and isinstance(stats[-1], dict) else {}
    found: dict[str, float] = {}
    for quantity, key in ((RUNNING, "numActiveRequests"), (WAITING, "numQueuedRequests")):
        if isinstance(last.get(key), int | float):
            found[quantity] = float(last[key])
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict) and isinstance(kv.get("maxNumBlocks"), int) and kv["maxNumBlocks"]:
        found[KV_USAGE] = kv.get("usedNumBlocks", 0) / kv["maxNumBlocks"]
        if isinstance(kv.get("tokensPerBlock"), int):
            found[KV_CAPACITY_TOKENS] = float(kv["maxNumBlocks"] * kv["tokensPerBlock"])
    return found


def server_root(base_url: str) -> str:
    """The server's root, where vLLM serves /metrics and its RL endpoints beside /v1."""
    return base_url.rstrip("/").removesuffix("/v1")


def metrics_url(base_url: str) -> str:
    return server_root(base_url) + "/metrics"


def replica_key(index: int, metric: str) -> str:
    """A metric of one replica among several, as samples and summaries key it."""
    return f"replica{index}:{metric}"


class PrometheusSampler:
    """Scrapes each of `metrics_urls` (e.g. `http://host:8000/metrics`) through the
    caller's session. With several (replicas of one model), every metric is reported per
    replica (`replica_key`) and over all of them: summed, KV usage averaged. A replica
    that stops answering is given up alone; the sampler gives up when all have."""

    name = "server"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        metrics_urls: str | Sequence[str],
        *,
        timeout_s: float = 2.0,
    ) -> None:
        urls = [metrics_urls] if isinstance(metrics_urls, str) else list(metrics_urls)
        self._scrapers = [_Scraper(session, url, timeout_s, i) for i, url in enumerate(urls)]
        self.available = True
        self.reason: str | None = None

    async def sample(self) -> dict[str, float] | None:
        live = [scraper for scraper in self._scrapers if scraper.available]
        if not live:
            return None
        if len(self._scrapers) == 1:
            values = await live[0].sample()
        else:
            readings = await asyncio.gather(*(scraper.sample() for scraper in live))
            values = _combined(zip(live, readings, strict=True))
        if not any(scraper.available for scraper in self._scrapers):
            self.available = False
            self.reason = (
                self._scrapers[0].reason
                if len(self._scrapers) == 1
                else (
                    "no server telemetry from any replica: "
                    + "; ".join(
                        (scraper.reason or "").removeprefix("no server telemetry: ").rstrip(".")
                        for scraper in self._scrapers
                    )
                    + "."
                )
            )
        return values

    @property
    def engine(self) -> str | None:
        """The engine the servers' metrics (or info path) showed, once one did."""
        return next((s.engine for s in self._scrapers if s.engine is not None), None)

    async def aclose(self) -> None:
        """Nothing to release: the session belongs to the caller."""


def _combined(
    readings: Iterable[tuple[_Scraper, dict[str, float] | None]],
) -> dict[str, float] | None:
    """Every replica's values under its own key, and all of them summed (KV averaged)."""
    combined: dict[str, float] = {}
    answered = 0
    for scraper, values in readings:
        if values is None:
            continue
        answered += 1
        for name, value in values.items():
            combined[replica_key(scraper.index, name)] = value
            combined[name] = combined.get(name, 0.0) + value
    if not answered:
        return None
    for name in _AVERAGED:
        if name in combined:
            combined[name] /= answered
    return combined


class _Scraper:
    """One /metrics URL: gives up on a server that never answered at once, on one that
    did after a few failures in a row, and then never retries in a loop."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, timeout_s: float, index: int
    ) -> None:
        self.index = index
        self.available = True
        self.reason: str | None = None
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._answered = False
        self._failures = 0
        self.engine: str | None = None  # the engine its metrics came from, once told

    async def sample(self) -> dict[str, float] | None:
        if not self.available:
            return None
        result = await self._scrape()
        if isinstance(result, str):
            self._fail(result)
            return None
        self._answered = True
        self._failures = 0
        return result

    async def _scrape(self) -> dict[str, float] | str:
        """The reported values, or why there are none."""
        text = await self._get(self._url)
        if not isinstance(text, tuple):
            return await self._why_none(text) if not self._answered else text
        body = text[0]
        if (stats := iteration_stats(body)) is not None:  # TensorRT-LLM's JSON /metrics
            if not self._answered and await self._try_prometheus_path():
                return await self._scrape()
            self.engine = self.engine or "trtllm"
            return stats
        metrics = parse_prometheus(body, average=_AVERAGED, names=_WANTED)
        engine = engine_of(metrics)
        if engine is not None:
            self.engine = engine.name
            metrics = as_quantities(metrics, engine)
        kv_tokens = kv_capacity_tokens(body)
        if kv_tokens is not None:
            metrics[KV_CAPACITY_TOKENS] = kv_tokens
        if "vllm:kv_cache_usage_perc" not in metrics and _KV_USAGE_OLD in metrics:
            metrics["vllm:kv_cache_usage_perc"] = metrics[_KV_USAGE_OLD]
        values = {name: metrics[name] for name in REPORTED if name in metrics}
        if not values:
            not_text = "" if parse_prometheus(body) else " (the answer is not Prometheus text)"
            return f"{self._url} serves no metrics of vLLM, SGLang or TensorRT-LLM{not_text}"
        return values

    async def _get(self, url: str) -> tuple[str] | str:
        """(the answer's text,), or why there is none."""
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return f"{url} answered HTTP {resp.status}"
                return (await resp.text(errors="replace"),)
        except TimeoutError:
            return f"{url} did not answer within {self._timeout.total:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            return f"cannot reach {url} ({str(exc) or type(exc).__name__})"

    async def _try_prometheus_path(self) -> bool:
        """Whether TensorRT-LLM's Prometheus path answers; scraped from then on if so."""
        url = self._url.removesuffix("/metrics") + ENGINES["trtllm"].metrics.path
        answer = await self._get(url)  # its families may come only with the first request
        if isinstance(answer, tuple) and parse_prometheus(answer[0]):
            self._url = url
            return True
        return False

    async def _why_none(self, why: str) -> str:
        """`why`, and where a server that answers an engine's own info path serves no
        metrics, what makes that engine serve them."""
        root = self._url.removesuffix("/metrics")
        for engine in ENGINES.values():
            if engine.info_path is None or engine.metrics.needs is None:
                continue
            if isinstance(await self._get(root + engine.info_path), tuple):
                self.engine = engine.name
                return f"{why}: the {engine.title} server there serves none; {engine.metrics.needs}"
        return why

    def _fail(self, why: str) -> None:
        self._failures += 1
        if not self._answered:
            self._give_up(why)
        elif self._failures >= _MAX_FAILURES:
            self._give_up(f"{why}, {self._failures} times in a row")

    def _give_up(self, why: str) -> None:
        self.available = False
        self.reason = f"no server telemetry: {why}."
