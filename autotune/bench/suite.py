"""A benchmark suite: named cases in a YAML file, validated once, before anything runs.

    repetitions: 5        # measured repetitions of each case (1 to 20)
    warmup: 1             # repetitions run first and thrown away
    threshold: 0.05       # a larger (and significant) fall of the median is a regression
    alpha: 0.01           # significance level of the exact Mann-Whitney U test
    cases:
      - name: sim-streaming            # a probe (the default kind): steady-state rollouts/s
        target: {sim_args: ["--time-scale", "0.1"]}   # neither base_url nor launch: the
        workload: {synthetic: 400, output_tokens: [128, 16]}     # embedded simulator
        verifier: synthetic
        parallelism: 16
        probe: {min_s: 1.5, max_s: 6}
      - name: tuned-vllm
        target: {launch: [vllm, serve, /models/m, --port, "{port}"], startup_timeout_s: 600}
        recommendation: reports/my-study/recommendation.json   # from `autotune sweep`
      - name: engine-overhead          # engine rollouts/s ÷ bare aiohttp loop req/s
        kind: overhead
        concurrency: 64
        requests: 10000

Paths are relative to the suite file. Every error is one sentence naming the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import orjson
import yaml

from autotune.config import CollectConfig, SyntheticWorkload, TargetConfig
from autotune.errors import UsageError
from autotune.probe import ProbeSettings
from autotune.study import knob_flags

MAX_REPETITIONS = 20  # the exact test takes at most 40 values in all (stats.MAX_EXACT_SAMPLES)
DEFAULT_REPETITIONS = 5
DEFAULT_WARMUP = 1
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# The fields each mapping may hold: anything else is a typo, reported before any value.
SUITE_FIELDS = ("repetitions", "warmup", "threshold", "alpha", "cases")
_CASE = ("name", "kind", "repetitions", "warmup", "threshold")
PROBE_CASE_FIELDS = (
    *_CASE,
    "recommendation",
    "parallelism",
    "server_args",
    "target",
    "workload",
    "verifier",
    "verifier_workers",
    "verifier_cost_ms",
    "probe",
)
OVERHEAD_CASE_FIELDS = (*_CASE, "concurrency", "requests")
TARGET_FIELDS = (
    "base_url",
    "launch",
    "startup_timeout_s",
    "sim_args",
    "model",
    "api",
    "stream",
    "extra_body",
    "api_key_env",
    "timeout_s",
    "max_retries",
)
WORKLOAD_FIELDS = ("input", "synthetic", "prompt_tokens", "output_tokens", "seed", "limit")
PROBE_FIELDS = ("warmup_s", "min_s", "max_s", "target_halfwidth")


@dataclass(frozen=True, slots=True)
class ProbeCase:
    """Steady-state probes of one workload at one parallelism against one server."""

    kind: ClassVar[str] = "probe"
    name: str
    collect: CollectConfig  # target, workload, verifier, parallelism
    probe: ProbeSettings
    launch: tuple[str, ...] | None  # a command serving on {port}, started for the case
    startup_timeout_s: float
    recommendation: str | None
    repetitions: int
    warmup: int
    threshold: float

    def settings(self) -> dict[str, Any]:
        """The configuration under test, recorded with the results (never secrets)."""
        c, t = self.collect, self.collect.target
        workload: dict[str, Any] = (
            {"input": str(c.input), "limit": c.limit}
            if c.input is not None
            else {"synthetic": asdict(c.synthetic)}
        )
        return {
            "parallelism": c.parallelism,
            "verifier": c.verifier,
            "verifier_workers": c.verifier_workers,
            "verifier_cost_ms": c.verifier_cost_ms,
            "base_url": t.base_url,
            "launch": list(self.launch) if self.launch else None,
            "sim_args": list(t.sim_args),
            "model": t.model,
            "api": t.api,
            "stream": t.stream,
            "extra_body": t.extra_body,
            "workload": workload,
            "probe": asdict(self.probe),
            "recommendation": self.recommendation,
        }


@dataclass(frozen=True, slots=True)
class OverheadCase:
    """The engine against a bare aiohttp loop on the null server: their ratio."""

    kind: ClassVar[str] = "overhead"
    name: str
    concurrency: int
    requests: int
    repetitions: int
    warmup: int
    threshold: float

    def settings(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "requests": self.requests}


Case = ProbeCase | OverheadCase


@dataclass(frozen=True, slots=True)
class Suite:
    path: Path
    alpha: float
    cases: tuple[Case, ...]

    def select(
        self,
        names: list[str] | None = None,
        repetitions: int | None = None,
        warmup: int | None = None,
    ) -> Suite:
        """Only the named cases (all without names), with repetitions/warm-up overridden."""
        known = [case.name for case in self.cases]
        for name in names or ():
            if name not in known:
                raise UsageError(
                    f"--case {name!r} is not in {self.path}; its cases are {', '.join(known)}."
                )
        if repetitions is not None and not 1 <= repetitions <= MAX_REPETITIONS:
            raise UsageError(f"--repetitions must be from 1 to {MAX_REPETITIONS}.")
        if warmup is not None and warmup < 0:
            raise UsageError("--warmup must be zero or more.")
        cases = tuple(
            replace(
                case,
                repetitions=case.repetitions if repetitions is None else repetitions,
                warmup=case.warmup if warmup is None else warmup,
            )
            for case in self.cases
            if not names or case.name in names
        )
        return replace(self, cases=cases)


class _Fields:
    """One mapping of the suite, read field by field; each error names the field."""

    def __init__(
        self, data: Any, where: str, path: Path, fields: tuple[str, ...], what: str
    ) -> None:
        self.path, self.where = path, where
        if not isinstance(data, dict):
            self.fail("", "a mapping of fields", data)
        for name in data:
            if name not in fields:
                raise UsageError(
                    f"{path}: {self.at(str(name))} is not a field of {what}; "
                    f"the fields are {', '.join(fields)}."
                )
        self.data: dict[str, Any] = data

    def at(self, name: str) -> str:
        if not self.where:
            return name or "the file"
        return f"{self.where}.{name}" if name else self.where

    def fail(self, name: str, expected: str, value: Any) -> NoReturn:
        raise UsageError(f"{self.path}: {self.at(name)} must be {expected}, not {value!r}.")

    def raw(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def whole(self, name: str, default: int | None, low: int, high: int | None = None) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        upper = f" and at most {high}" if high is not None else ""
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            self.fail(name, f"a whole number of at least {low}{upper}", value)
        if high is not None and value > high:
            self.fail(name, f"a whole number of at least {low}{upper}", value)
        return value

    def number(
        self, name: str, default: float, *, zero: bool = False, below: float = math.inf
    ) -> Any:
        """A number above 0 (or from 0 with `zero`), and under `below` when given."""
        value = self.raw(name, default)
        expected = f"a number {'from' if zero else 'above'} 0" + (
            f" and below {below:g}" if below < math.inf else ""
        )
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(name, expected, value)
        if not (value >= 0 if zero else value > 0) or value >= below:
            self.fail(name, expected, value)
        return float(value)

    def text(self, name: str, default: str | None = None) -> Any:
        value = self.raw(name, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(name, "a non-empty string", value)
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            self.fail(name, "true or false", value)
        return value

    def strings(self, name: str) -> tuple[str, ...] | None:
        value = self.raw(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
            self.fail(name, "a list of strings", value)
        return tuple(str(v) for v in value)

    def sub(self, name: str, fields: tuple[str, ...], what: str) -> _Fields:
        return _Fields(self.raw(name, {}), self.at(name), self.path, fields, what)


def load_suite(path: Path) -> Suite:
    """Read and validate a suite file; UsageError, one sentence naming the field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; pass a suite YAML file.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {path} ({error}).") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{path} is not valid YAML ({' '.join(str(error).split())}).") from None
    top = _Fields(data, "", path, SUITE_FIELDS, "a suite")
    defaults = (
        top.whole("repetitions", DEFAULT_REPETITIONS, 1, MAX_REPETITIONS),
        top.whole("warmup", DEFAULT_WARMUP, 0),
        top.number("threshold", DEFAULT_THRESHOLD, below=1),
    )
    alpha = top.number("alpha", DEFAULT_ALPHA, below=1)
    entries = top.raw("cases")
    if not isinstance(entries, list) or not entries:
        top.fail("cases", "a list of at least one case", entries)
    cases = tuple(_case(e, f"cases[{i}]", path, defaults) for i, e in enumerate(entries))
    names = [case.name for case in cases]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"{path}: two cases are named {name!r}; give each its own name.")
    return Suite(path, alpha, cases)


def _case(entry: Any, where: str, path: Path, defaults: tuple[int, int, float]) -> Case:
    kind = entry.get("kind", "probe") if isinstance(entry, dict) else None
    if kind == "overhead":
        f = _Fields(entry, where, path, OVERHEAD_CASE_FIELDS, "an overhead case")
    else:
        f = _Fields(entry, where, path, PROBE_CASE_FIELDS, "a probe case")
    if kind not in ("probe", "overhead"):
        f.fail("kind", "probe or overhead", kind)
    name = f.text("name")
    if name is None or not _NAME.fullmatch(name):
        f.fail("name", "letters, digits, '.', '_' or '-' (starting with a letter or digit)", name)
    repetitions = f.whole("repetitions", defaults[0], 1, MAX_REPETITIONS)
    warmup = f.whole("warmup", defaults[1], 0)
    threshold = f.number("threshold", defaults[2], below=1)
    if kind == "overhead":
        concurrency = f.whole("concurrency", 64, 1)
        requests = f.whole("requests", 10_000, 100)
        return OverheadCase(name, concurrency, requests, repetitions, warmup, threshold)
    return _probe_case(f, name, repetitions, warmup, threshold)


def _probe_case(f: _Fields, name: str, repetitions: int, warmup: int, threshold: float) -> Case:
    base = f.path.parent
    rec_path = f.text("recommendation")
    rec_parallelism, rec_server_args = _recommendation(base / rec_path) if rec_path else (None, {})
    parallelism = f.whole("parallelism", rec_parallelism, 1)
    if parallelism is None:
        f.fail("parallelism", "a whole number of at least 1 (or come from a recommendation)", None)
    server_args = f.raw("server_args", rec_server_args)
    if not isinstance(server_args, dict):
        f.fail("server_args", "a mapping of server flag to value", server_args)
    flags = tuple(knob_flags(server_args))

    t = f.sub("target", TARGET_FIELDS, "a target")
    base_url, launch = t.text("base_url"), t.strings("launch")
    sim_args = t.strings("sim_args") or ()
    if base_url and launch:
        t.fail("launch", "absent when base_url is given (one server per case)", launch)
    if sim_args and (base_url or launch):
        t.fail("sim_args", "absent unless the case runs on the embedded simulator", sim_args)
    if launch is not None and not any("{port}" in part for part in launch):
        t.fail("launch", "a command with {port} where the server's port goes", launch)
    if base_url and flags:
        f.fail("server_args", "absent for a server at a base_url (autotune cannot set them)", flags)
    extra_body = t.raw("extra_body", {})
    if not isinstance(extra_body, dict):
        t.fail("extra_body", "a mapping of extra request fields", extra_body)
    api = t.raw("api", "chat")
    if api not in ("chat", "completions"):
        t.fail("api", "chat or completions", api)
    target = TargetConfig(
        base_url=base_url,
        model=t.text("model"),
        api=api,
        stream=t.flag("stream", True),
        api_key_env=t.text("api_key_env", "OPENAI_API_KEY"),
        extra_body=extra_body,
        request_timeout_s=t.number("timeout_s", 600.0),
        max_retries=t.whole("max_retries", 3, 0),
        sim_args=(*sim_args, *flags) if not (base_url or launch) else (),
    )
    startup_timeout_s = t.number("startup_timeout_s", 600.0)

    w = f.sub("workload", WORKLOAD_FIELDS, "a workload")
    input_name = w.text("input")
    task_file = base / input_name if input_name else None
    if task_file is not None and not task_file.is_file():
        w.fail("input", "a task JSONL file (relative to the suite)", input_name)
    prompt = _mean_std(w, "prompt_tokens", 256)
    output = _mean_std(w, "output_tokens", 256)
    synthetic = SyntheticWorkload(
        num_tasks=w.whole("synthetic", 1000, 1),
        prompt_tokens_mean=prompt[0],
        prompt_tokens_std=prompt[1],
        output_tokens_mean=output[0],
        output_tokens_std=output[1],
        seed=w.whole("seed", 0, 0),
    )
    limit = w.whole("limit", None, 1)

    p = f.sub("probe", PROBE_FIELDS, "probe settings")
    probe = ProbeSettings(
        parallelism=parallelism,
        warmup_s=p.number("warmup_s", 1.0, zero=True),
        min_s=p.number("min_s", 3.0),
        max_s=p.number("max_s", 20.0),
        target_halfwidth=p.number("target_halfwidth", 0.05, below=1),
    )
    if probe.max_s < probe.min_s:
        p.fail("max_s", f"at least min_s ({probe.min_s:g})", probe.max_s)

    collect = CollectConfig(
        target=target,
        input=task_file,
        synthetic=synthetic,
        limit=limit,
        parallelism=parallelism,
        verifier=f.text("verifier", "none" if task_file else "synthetic"),
        verifier_workers=f.whole("verifier_workers", None, 1),
        verifier_cost_ms=f.number("verifier_cost_ms", 0.0, zero=True),
        progress=False,
    )
    launch_command = (*launch, *flags) if launch else None
    return ProbeCase(
        name, collect, probe, launch_command, startup_timeout_s, rec_path, repetitions, warmup,
        threshold,
    )  # fmt: skip


def _mean_std(f: _Fields, name: str, default: int) -> tuple[int, int]:
    """`256` or `[256, 64]` tokens → (mean, std); one number means a std of a quarter."""
    value = f.raw(name, default)
    parts = value if isinstance(value, list) else [value]
    if not 1 <= len(parts) <= 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in parts
    ):
        f.fail(name, "a token count or [mean, std]", value)
    if parts[0] < 1:
        f.fail(name, "at least 1 token", value)
    return parts[0], parts[1] if len(parts) == 2 else parts[0] // 4


def _recommendation(path: Path) -> tuple[int, dict[str, Any]]:
    """(parallelism, server knobs) from the recommendation.json `autotune sweep` writes:
    `recommended.parallelism` and `server` ({"max_num_seqs": 64, ...})."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"the recommendation {path} does not exist.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(f"the recommendation {path} is not valid JSON ({error}).") from None
    recommended = data.get("recommended") if isinstance(data, dict) else None
    parallelism = recommended.get("parallelism") if isinstance(recommended, dict) else None
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise UsageError(
            f"the recommendation {path} has no recommended.parallelism; pass the "
            "recommendation.json that `autotune sweep` wrote."
        )
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise UsageError(f"the recommendation {path} has a server field that is not a mapping.")
    return parallelism, server
