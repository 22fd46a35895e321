"""What autotune needs to know of one engine, as data: how a knob is spelled on its command
line, what its metrics are called, which request fields it takes and its RL endpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# autotune's own quantities keep the names vLLM gave them (the first engine it read): a
# summary, a verdict and a report cite `vllm:num_requests_running` whatever the engine.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"  # histograms: _sum, _count and _bucket
E2E = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
ABORTED = "autotune:aborted_requests_total"  # vLLM: request_success{finished_reason=abort}
HISTOGRAMS = (TTFT, E2E, QUEUE_TIME)
QUANTITIES = (
    RUNNING, WAITING, KV_USAGE, PREEMPTIONS, GENERATION_TOKENS, PROMPT_TOKENS, *HISTOGRAMS,
    PREFIX_QUERIES, PREFIX_HITS, ABORTED,
)  # fmt: skip


def flag_value(value: object) -> str:
    """A whole float is written as an integer (`64.0` → `64`) for integer flags."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


OPTIONS_FILE = "extra_llm_api_options.yaml"  # the options file a written launch line names
LAUNCHER_SETS = ("model", "model_path", "port", "host")  # autotune's own, per server

Spelling = Literal["kebab", "snake"]  # --max-num-seqs or --max_batch_size


@dataclass(frozen=True, slots=True)
class Metrics:
    """Where the engine serves Prometheus text and what it calls autotune's quantities."""

    prefix: str  # every family of the engine's own starts with it: how a server is told
    names: Mapping[str, str]  # autotune's quantity → the engine's metric family
    path: str = "/metrics"
    kv_capacity: str | None = None  # a gauge of the KV cache's tokens, if it serves one
    needs: str | None = None  # what makes the server serve them, said when it serves none

    def quantity_of(self) -> dict[str, list[str]]:
        """The engine's family → the quantities it gives (one family may give two)."""
        found: dict[str, list[str]] = {}
        for quantity, name in self.names.items():
            found.setdefault(name, []).append(quantity)
        return found


@dataclass(frozen=True, slots=True)
class Call:
    """One POST to a control endpoint: its path, query and JSON body."""

    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass(frozen=True, slots=True)
class Control:
    """The engine's RL endpoints, each a path (None: the engine serves none). A pause
    mode is autotune's name (`keep`, `wait`, `abort`, `retract`) mapped to the engine's."""

    serves: str | None  # a GET that answers 200 where the endpoints below are served
    sleeping: str | None = None  # a GET that answers 200 where sleep is served
    pause: str | None = None
    pause_modes: Mapping[str, str] = field(default_factory=dict)
    mode_in_body: bool = False  # SGLang: {"mode": ...}; vLLM: ?mode=
    resume: str | None = None
    resume_body: Any = None  # SGLang's continue_generation wants a JSON body, even {}
    update_weights: str | None = None
    update_body: Any = None
    update_from_disk: bool = False  # the body names the served model's path (SGLang)
    sleep: str | None = None
    wake_up: str | None = None
    memory_tags: tuple[str, ...] = ()  # what a sleep releases, named in its body (not vLLM)
    reset_cache: str | None = None
    flush_needs_idle: bool = False  # SGLang refuses a flush while requests are inside
    enable: str = ""  # what makes the server serve them, said when it does not

    def pause_call(self, mode: str, clear_cache: bool) -> Call:
        """The pause for autotune's `mode`; the caller checks `mode_problem` first."""
        assert self.pause is not None
        spelled = self.pause_modes[mode]
        if self.mode_in_body:
            return Call(self.pause, body={"mode": spelled})
        clear = "true" if clear_cache else "false"
        return Call(self.pause, {"mode": spelled, "clear_cache": clear})

    def sleep_call(self, level: int, mode: str) -> Call:
        """The sleep before training: vLLM's level and mode in the query, else the
        engine's memory tags in the body."""
        assert self.sleep is not None
        if self.memory_tags:
            return Call(self.sleep, body={"tags": list(self.memory_tags)})
        return Call(self.sleep, {"level": str(level), "mode": self.pause_modes.get(mode, mode)})

    def wake_call(self) -> Call:
        assert self.wake_up is not None
        tags = {"tags": list(self.memory_tags)} if self.memory_tags else None
        return Call(self.wake_up, body=tags)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How the engine reads a chat or completion request."""

    extra_fields: frozenset[str]  # beyond OpenAI's, the sampling fields it accepts
    forbids_unknown: bool = False  # TensorRT-LLM answers 400 to a field it does not know
    cancelled_reasons: frozenset[str] = frozenset({"abort"})  # finish_reason of a cancel


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine: its name, launch line, knob spellings, metrics, dialect and control."""

    name: str  # `kind:` of a study, `--engine` of the simulator
    title: str  # as people write it
    command: tuple[str, ...]  # the launch command before the model
    model_flag: str | None  # None: the model is the first argument
    spelling: Spelling
    negates: bool  # False written as --no-FLAG (vLLM); else a false switch is left out
    knob_flags: Mapping[str, str]  # autotune's knob (vLLM's name) → the engine's flag
    metrics: Metrics
    control: Control
    dialect: Dialect
    switches: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    option_knobs: Mapping[str, str] = field(default_factory=dict)  # knob → options-file key
    always_options: Mapping[str, Any] = field(default_factory=dict)  # in every options file
    options_flag: str | None = None  # the flag that names the options file
    always: tuple[str, ...] = ()  # flags autotune adds to every launch
    missing_knobs: Mapping[str, str] = field(default_factory=dict)  # knob → why it has none
    info_path: str | None = None  # a GET only this engine serves: how a server is told

    def flag(self, name: str) -> str:
        """A knob or any other setting by field name → this engine's flag."""
        if name in self.knob_flags:
            return self.knob_flags[name]
        bare = name.lstrip("-")
        kebab = self.spelling == "kebab"
        return "--" + (bare.replace("_", "-") if kebab else bare.replace("-", "_"))

    def field_of(self, flag: str) -> str:
        """This engine's flag (`--max-running-requests`, `--tp_size=2`) → autotune's field
        name (`max_num_seqs`, `tensor_parallel_size`); a flag no knob has keeps its own."""
        bare = _bare(flag.partition("=")[0])  # any spelling: --tp-size, tp_size, --tp_size
        for name, engine_flag in self.knob_flags.items():
            if _bare(engine_flag) == bare:
                return name
        for name, (on, off) in self.switches.items():
            if bare in (_bare(on or ""), _bare(off or "")):
                return name
        return bare

    def knob_problem(self, name: str) -> str | None:
        """Why this engine has no flag for knob `name`, else None."""
        return self.missing_knobs.get(name)

    def flags(self, knobs: Mapping[str, object]) -> list[str]:
        """argv for `knobs` in this engine's spelling (options-file knobs left out: see
        `options`); True/False as the engine switches them; None leaves a knob out."""
        argv: list[str] = []
        for name, value in knobs.items():
            if name.lstrip("-").replace("-", "_") in LAUNCHER_SETS:
                raise ValueError(f"--{name.lstrip('-')} is set by autotune; leave it out")
            if value is None or self.option_key(name) is not None:
                continue
            if name in self.missing_knobs:
                raise ValueError(f"{self.title} has no {name}: {self.missing_knobs[name]}")
            if name in self.switches:
                on, off = self.switches[name]
                spelled = on if value is True else off if value is False else None
                if value not in (True, False):
                    raise ValueError(f"{name} is a switch: true or false, not {value!r}")
                argv += [spelled] if spelled else []
                continue
            flag = self.flag(name)
            if value is True:
                argv.append(flag)
            elif value is False:
                argv += ["--no-" + flag[2:]] if self.negates else []
            else:
                argv += [flag, flag_value(value)]
        return argv

    def option_key(self, name: str) -> str | None:
        """Where a knob or setting goes in the options file (a dotted key: TensorRT-LLM's
        `kv_cache_config.free_gpu_memory_fraction`), None where it is a flag."""
        if name in self.option_knobs:
            return self.option_knobs[name]
        return name if "." in name and self.options_flag is not None else None

    def options(self, knobs: Mapping[str, object]) -> dict[str, Any]:
        """The options-file entries `knobs` set (TensorRT-LLM's extra LLM API options),
        nested by their dotted keys."""
        tree: dict[str, Any] = dict(self.always_options)
        for name, value in knobs.items():
            key = self.option_key(name)
            if value is None or key is None:
                continue
            *parents, leaf = key.split(".")
            node = tree
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
        return tree

    def launch_line(
        self,
        command: Sequence[str],
        model: str,
        knobs: Mapping[str, object],
        *,
        port: int | None = None,
        host: str | None = None,
        options_file: str | None = None,
    ) -> list[str]:
        """The server's command line: `command` (the engine's own, or a user's), the model,
        where it listens, the flags autotune always adds, then `knobs`."""
        model_part = [self.model_flag, model] if self.model_flag else [model]
        listen = ["--port", str(port)] if port is not None else []
        listen += ["--host", host] if host is not None else []
        options = [self.options_flag, options_file] if options_file and self.options_flag else []
        return [*command, *model_part, *listen, *self.always, *self.flags(knobs), *options]


def _bare(flag: str) -> str:
    """A flag as a field name: `--max-running-requests` → `max_running_requests`."""
    return flag.lstrip("-").replace("-", "_")
