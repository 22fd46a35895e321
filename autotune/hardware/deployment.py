"""The simulated server's command line (vLLM's spelling, or with `--engine` SGLang's or
TensorRT-LLM's) as a validated configuration: the GPU and model profiles, the tensor- and
data-parallel layout and the KV cache vLLM's limits leave, checked as vLLM checks them at
start-up. Why here, not in servers/sim: docs/design/hardware.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn, Self

from autotune.config.flags import server_flags
from autotune.config.knobs import KNOBS, SERVER_KNOBS, ServerKnobs, knob
from autotune.engines import ENGINE_NAMES, Engine, engine_named
from autotune.engines.known import VLLM
from autotune.hardware.calibrated import CalibratedProfile, ProfileError, load_profile
from autotune.hardware.dialect_flags import OptionsError, add_dialect_flags, options_settings
from autotune.hardware.measured import MeasuredSurface, SurfaceError, load_surface, parse_key
from autotune.hardware.memory import InsufficientMemory, kv_capacity_tokens
from autotune.hardware.profiles import (
    GPUS,
    MODELS,
    GpuProfile,
    ModelProfile,
    StepCoefficients,
    find_model,
)
from autotune.helpformat import DefaultsHelpFormatter

BLOCK_SIZES = (8, 16, 32, 64, 128)
SIM_PREFIX = "sim/"


DEFAULT_GPU = "h100-80gb"
DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_WEIGHT_SYNC_GBPS = 50.0
DEFAULT_HOST_GBPS = 25.0


def _names(
    gpu: str | None, model: str | None, profile: CalibratedProfile | None
) -> tuple[str, str]:
    """--gpu and --model, else the profile's, else the defaults."""
    return (
        gpu or (profile.gpu.name if profile else DEFAULT_GPU),
        model or (profile.model.name if profile else DEFAULT_MODEL),
    )


def hardware_names(gpu: str | None, model: str | None, profile: str | None) -> tuple[str, str]:
    """The GPU and model profile names the simulator's --gpu, --model and --profile give
    (a profile that cannot be read gives the defaults; launching it says why)."""
    calibrated = None
    if profile is not None and not (gpu and model):
        with contextlib.suppress(ProfileError):
            calibrated = load_profile(Path(profile))
    return _names(gpu, model, calibrated)


class SimConfigError(ValueError):
    """A flag value the simulator (like vLLM) refuses at start-up; str() is the error text."""


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting 2, so errors stay one vLLM-like line."""

    def error(self, message: str) -> NoReturn:
        raise SimConfigError(message)


SHORT_FLAGS = {"tensor_parallel_size": "-tp", "data_parallel_size": "-dp"}  # vLLM's
PROG = "python -m autotune.servers.sim"


def add_knob_flags(
    parser: argparse.ArgumentParser, names: Sequence[str], engine: Engine = VLLM
) -> None:
    """One flag per server knob of `names` that `engine` has on its command line, spelled
    as it spells it, as ServerKnobs declares it (type, default, meaning); a knob it sets in
    its options file has no flag and defaults to None (the file's value, else ServerKnobs')."""
    for name in names:
        default, help = getattr(KNOBS, name), knob(name).help
        if name in engine.option_knobs:
            parser.set_defaults(**{name: None})
            continue
        if name in engine.missing_knobs:
            continue
        if name in engine.switches:
            for flag, value in zip(engine.switches[name], (True, False), strict=True):
                if flag is not None:
                    switched = f"{'on' if value else 'off'}: {help}"
                    parser.add_argument(
                        flag,
                        dest=name,
                        action="store_const",
                        const=value,
                        default=default,
                        help=switched,
                    )
            continue
        spelled = [engine.flag(name), *_short(name, engine)]
        kind = ServerKnobs.model_fields[name].annotation
        if kind is bool:
            action = argparse.BooleanOptionalAction
            parser.add_argument(*spelled, dest=name, action=action, default=default, help=help)
        else:
            parse = float if kind is float else int
            parser.add_argument(*spelled, dest=name, type=parse, default=default, help=help)


def _short(name: str, engine: Engine) -> list[str]:
    return [SHORT_FLAGS[name]] if name in SHORT_FLAGS and engine is VLLM else []


def engine_of(argv: Sequence[str]) -> Engine:
    """The engine whose dialect `--engine` names in `argv` (vLLM's without it)."""
    parser = _Parser(add_help=False, allow_abbrev=False)
    parser.add_argument("--engine", choices=ENGINE_NAMES, default=VLLM.name)
    return engine_named(parser.parse_known_args(list(argv))[0].engine)


def build_parser(prog: str = PROG, engine: Engine = VLLM) -> argparse.ArgumentParser:
    """`engine`'s flag names (those the simulator models) plus the simulator's own knobs."""
    p = _Parser(
        prog=prog,
        description=f"Simulated {engine.title}-like OpenAI-compatible server "
        "(SIMULATED: no model runs).",
        allow_abbrev=False,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default=VLLM.name,
        help="whose dialect it speaks: its flag spellings, metric names, request checks and "
        "RL endpoints",
    )
    models = f"one of {', '.join(MODELS)} (default: {DEFAULT_MODEL}, or --profile's)"
    if engine.model_flag is None:
        p.add_argument("model", nargs="?", default=None, metavar="MODEL", help=models)
    else:
        spelled = dict.fromkeys((engine.model_flag, "--model"))
        p.add_argument(*spelled, dest="model", default=None, help=models)
    p.add_argument("--served-model-name", nargs="+", default=None, help="(default: sim/<model>)")
    p.add_argument(
        "--gpu",
        default=None,
        help=f"one of {', '.join(GPUS)} (default: {DEFAULT_GPU}, or --profile's)",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="step with the coefficients `autotune sim calibrate` fitted to measured runs "
        "(its GPU and model unless --gpu and --model name the same)",
    )
    # The engines' layout, the cache, memory and batching (a knob declared later too),
    # then the context, as these flags have always been listed; each made from ServerKnobs.
    layout, cache, context = (
        ("tensor_parallel_size",),
        ("enable_prefix_caching",),
        ("max_model_len",),
    )
    add_knob_flags(p, layout, engine)
    if "data_parallel_size" in engine.missing_knobs:
        p.set_defaults(data_parallel_size=1)
    else:
        p.add_argument(
            engine.flag("data_parallel_size"),
            *_short("data_parallel_size", engine),
            dest="data_parallel_size",
            type=int,
            default=1,
            help=f"engines of {engine.flag('tensor_parallel_size')} GPUs each behind this one "
            "server (requests go to the least loaded)",
        )
    add_knob_flags(p, cache, engine)
    others = [name for name in SERVER_KNOBS if name not in (*layout, *cache, *context)]
    add_knob_flags(p, others, engine)
    p.add_argument("--block-size", type=int, default=16, help="KV cache block, in tokens")
    add_knob_flags(p, context, engine)
    add_dialect_flags(p, engine)
    p.add_argument("--host", default="127.0.0.1", help="the interface to listen on")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument(
        "--quiet", "-q", action="store_true", help="no start-up lines: only warnings and errors"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="real seconds per simulated second (0.05 runs 20x faster, 0 as fast as possible)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the fake outputs' lengths")
    p.add_argument(
        "--natural-output-tokens",
        type=int,
        default=400,
        help="mean output length at which the fake model stops when ignore_eos is not set",
    )
    p.add_argument(
        "--output-length-sigma",
        type=float,
        default=None,
        metavar="S",
        help="RL sampling: each sample of a prompt draws its own length, lognormal with median "
        "--natural-output-tokens and shape S (p99/p50 = e^(2.33 S)), longer for harder prompts",
    )
    p.add_argument(
        "--uninformative-share",
        type=float,
        default=None,
        metavar="U",
        help="RL grading: answers end in \\boxed{}; a share U of prompts is solved by every "
        "sample or by none (half each), the rest by alternate samples",
    )
    p.add_argument(
        "--rollouts",
        default=None,
        metavar="FILE",
        help="RL sampling from real rows: each sample's length and reward come from a rollouts "
        "JSONL (NeMo Gym's or autotune's), each prompt replaying one of its prompts' samples",
    )
    p.add_argument(
        "--die-after-requests",
        type=int,
        default=None,
        metavar="N",
        help="exit abruptly (os._exit(1)) once N requests have been accepted",
    )
    p.add_argument(
        "--crash-above-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="exit abruptly (os._exit(1)) when more than N requests are in the server at "
        "once, like a server that runs out of memory under load",
    )
    p.add_argument(
        "--max-request-rate",
        type=float,
        default=None,
        metavar="R",
        help="requests/s; past it answer 429 with Retry-After, like a hosted API",
    )
    p.add_argument(
        "--tool-call-share",
        type=float,
        default=0.0,
        metavar="F",
        help="share of chat turns offered tools that call one instead of answering (0 to 1)",
    )
    p.add_argument(
        "--slow-down-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="this many real seconds after the first request, every engine step takes "
        "--slow-down-factor times longer, like a replica that slows mid-run (drift tests)",
    )
    p.add_argument(
        "--replay-table",
        default=None,
        metavar="CSV",
        help="answer as a measured server instead of the performance model: each engine "
        "step takes the table's median time per output token at the running concurrency "
        "(autotune/hardware/measured.py; e.g. InferenceX's runs)",
    )
    p.add_argument(
        "--replay-where",
        default="",
        metavar="KEY",
        help="the table's configuration to replay, as COLUMN=VALUE pairs "
        "(hw=h100,model=gpt-oss-120b,isl=1024,osl=1024,image=v0.13.0); its TP is "
        "--tensor-parallel-size",
    )
    p.add_argument(
        "--weight-sync-gbps",
        type=float,
        default=DEFAULT_WEIGHT_SYNC_GBPS,
        metavar="GB/S",
        help="how fast POST /update_weights receives one GPU's share of the weights from a "
        f"trainer (default: {DEFAULT_WEIGHT_SYNC_GBPS:g}, a 400 Gb/s NIC)",
    )
    p.add_argument(
        "--host-gbps",
        type=float,
        default=DEFAULT_HOST_GBPS,
        metavar="GB/S",
        help="how fast weights move between a GPU and host memory on /sleep and /wake_up "
        f"(default: {DEFAULT_HOST_GBPS:g}, PCIe 4.0 x16 as measured)",
    )
    p.add_argument(
        "--slow-down-factor",
        type=float,
        default=2.0,
        metavar="F",
        help="how much slower each step gets after --slow-down-after (default: 2)",
    )
    return p


@dataclass(frozen=True, slots=True)
class SimArgs:
    """The simulator's settings by field name, and the flags it ignores (vLLM's that it
    does not model): a command line read once, a configuration's knobs set over it typed."""

    values: dict[str, Any]
    ignored: tuple[str, ...] = ()

    @classmethod
    def parse(cls, argv: Sequence[str], prog: str | None = None) -> SimArgs:
        parser = build_parser(prog or PROG, engine_of(argv))
        namespace, unknown = parser.parse_known_args(list(argv))
        return cls(vars(namespace), tuple(unknown))

    def with_knobs(self, knobs: Mapping[str, Any]) -> SimArgs:
        """These settings with `knobs` over them (None leaves a setting as it is); a knob
        the simulator does not model is ignored, as its flag would be."""
        values, ignored = dict(self.values), list(self.ignored)
        for name, value in knobs.items():
            if value is None:
                continue
            if name not in values:
                ignored += server_flags({name: value})
            elif isinstance(value, float) and value.is_integer() and type(values[name]) is int:
                values[name] = int(value)  # a whole float drawn for an integer knob
            else:
                values[name] = value
        return SimArgs(values, tuple(ignored))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The validated server configuration."""

    engine: Engine  # whose dialect it speaks (--engine)
    gpu: GpuProfile
    model: ModelProfile
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int
    data_parallel_size: int
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    max_model_len: int
    host: str
    port: int
    quiet: bool
    time_scale: float
    seed: int
    natural_output_tokens: int
    output_length_sigma: float | None
    uninformative_share: float | None
    rollouts: str | None  # a rollouts JSONL whose lengths and rewards the policy replays
    die_after_requests: int | None
    crash_above_concurrency: int | None
    max_request_rate: float | None
    tool_call_share: float
    slow_down_after_s: float | None
    slow_down_factor: float
    weight_sync_gbps: float
    host_gbps: float
    measured: MeasuredSurface | None  # --replay-table: the surface each engine replays
    coefficients: StepCoefficients  # --profile's, else the step model's defaults
    kv_capacity_tokens: int  # of one engine
    ignored_flags: tuple[str, ...]

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def weight_bytes_per_gpu(self) -> float:
        """One GPU's share of the weights: what a weight sync or a sleep moves."""
        return self.model.weight_bytes / self.tensor_parallel_size

    @classmethod
    def from_args(cls, argv: Sequence[str], prog: str | None = None) -> Self:
        """Parse and validate flags the way vLLM does at start-up; raises SimConfigError.
        `prog`: the command `--help` names (`autotune sim serve` when autotune forwards)."""
        return cls.of(SimArgs.parse(argv, prog))

    @classmethod
    def of(cls, args: SimArgs) -> Self:
        """Validate the settings the way vLLM does at start-up; raises SimConfigError."""
        ns, unknown = SimpleNamespace(**args.values), args.ignored
        engine = engine_named(ns.engine)
        profile = None
        if ns.profile is not None:
            try:
                profile = load_profile(Path(ns.profile))
            except ProfileError as error:
                raise SimConfigError(f"{error}.") from None
        gpu_name, model_name = _names(ns.gpu, ns.model, profile)
        gpu = GPUS.get(gpu_name)
        if gpu is None:
            raise SimConfigError(
                f"Unknown GPU profile {gpu_name!r}. Known profiles: {', '.join(GPUS)}; "
                "pass one with --gpu."
            )
        model = find_model(model_name)
        if model is None:
            raise SimConfigError(
                f"Unknown model profile {model_name!r}. Known profiles: {', '.join(MODELS)}; "
                f"pass one with {engine.model_flag or 'the model argument'}."
            )
        if profile is not None and (gpu, model) != (profile.gpu, profile.model):
            raise SimConfigError(
                f"--profile {ns.profile} was calibrated for {profile.model.name} on "
                f"{profile.gpu.name}, not {model.name} on {gpu.name}: drop --gpu and --model "
                "or calibrate a profile for them."
            )
        tp = ns.tensor_parallel_size
        if tp < 1 or model.attention_heads % tp:
            raise SimConfigError(
                f"Total number of attention heads ({model.attention_heads}) must be divisible by "
                f"tensor parallel size ({tp})."
            )
        if engine.options_flag is not None:  # TensorRT-LLM: its KV share and options file
            try:
                settings = options_settings(engine, args.values, gpu, model, tp)
            except OptionsError as error:
                raise SimConfigError(f"{error}.") from None
            ns.gpu_memory_utilization = settings.gpu_memory_utilization
            ns.enable_prefix_caching = settings.enable_prefix_caching
            unknown = (*unknown, *settings.ignored)
        if ns.data_parallel_size < 1:
            raise SimConfigError(
                f"data_parallel_size ({ns.data_parallel_size}) must be at least 1."
            )
        if not 0 < ns.gpu_memory_utilization <= 1:
            raise SimConfigError(
                f"GPU memory utilization must be within (0, 1]. Got {ns.gpu_memory_utilization}."
            )
        if ns.block_size not in BLOCK_SIZES:
            raise SimConfigError(
                f"Invalid block size {ns.block_size}; choose one of "
                f"{', '.join(map(str, BLOCK_SIZES))} with --block-size."
            )
        if ns.max_num_seqs < 1:
            raise SimConfigError(f"max_num_seqs ({ns.max_num_seqs}) must be at least 1.")
        if ns.max_num_batched_tokens < ns.max_num_seqs:
            raise SimConfigError(
                f"max_num_batched_tokens ({ns.max_num_batched_tokens}) must be greater than or "
                f"equal to max_num_seqs ({ns.max_num_seqs})."
            )
        if not 1 <= ns.max_model_len <= model.max_position_embeddings:
            raise SimConfigError(
                f"User-specified max_model_len ({ns.max_model_len}) is outside 1.."
                f"{model.max_position_embeddings} (max_position_embeddings in {model.name}'s "
                "config.json)."
            )
        if ns.time_scale < 0 or not math.isfinite(ns.time_scale):
            raise SimConfigError(f"--time-scale must be a finite number >= 0, got {ns.time_scale}.")
        if ns.natural_output_tokens < 1:
            raise SimConfigError("--natural-output-tokens must be at least 1.")
        if ns.output_length_sigma is not None and not 0 <= ns.output_length_sigma <= 5:
            raise SimConfigError("--output-length-sigma must be a number from 0 to 5.")
        if ns.uninformative_share is not None and not 0 <= ns.uninformative_share <= 1:
            raise SimConfigError("--uninformative-share must be a share from 0 to 1.")
        if ns.rollouts is not None and (
            ns.output_length_sigma is not None or ns.uninformative_share is not None
        ):
            raise SimConfigError(
                "--rollouts sets the lengths and rewards itself: drop --output-length-sigma "
                "and --uninformative-share, or --rollouts."
            )
        if ns.die_after_requests is not None and ns.die_after_requests < 1:
            raise SimConfigError("--die-after-requests must be at least 1.")
        if ns.crash_above_concurrency is not None and ns.crash_above_concurrency < 1:
            raise SimConfigError("--crash-above-concurrency must be at least 1.")
        if ns.max_request_rate is not None and not ns.max_request_rate > 0:
            raise SimConfigError("--max-request-rate must be a positive number of requests/s.")
        if not 0 <= ns.tool_call_share <= 1:
            raise SimConfigError("--tool-call-share must be a share from 0 to 1.")
        if ns.slow_down_after is not None and not (
            math.isfinite(ns.slow_down_after) and ns.slow_down_after >= 0
        ):
            raise SimConfigError("--slow-down-after must be a finite number of seconds >= 0.")
        if not (math.isfinite(ns.slow_down_factor) and ns.slow_down_factor > 0):
            raise SimConfigError("--slow-down-factor must be a finite number above 0.")
        for flag, value in (
            ("--weight-sync-gbps", ns.weight_sync_gbps),
            ("--host-gbps", ns.host_gbps),
        ):
            if not (math.isfinite(value) and value > 0):
                raise SimConfigError(f"{flag} must be a finite number of GB/s above 0.")
        measured = None
        if ns.replay_table is not None:
            try:
                measured = load_surface(Path(ns.replay_table), parse_key(ns.replay_where), tp)
            except SurfaceError as error:
                raise SimConfigError(f"{error}.") from None
            if ns.max_num_seqs > measured.highest:
                raise SimConfigError(
                    f"--replay-table measured {measured.describe()}; a concurrency above "
                    f"{measured.highest} was never measured: pass --max-num-seqs "
                    f"{measured.highest} or less."
                )
        elif ns.replay_where:
            raise SimConfigError("--replay-where picks a row of --replay-table: give the table.")
        try:
            capacity = kv_capacity_tokens(gpu, model, tp, ns.gpu_memory_utilization, ns.block_size)
        except InsufficientMemory as e:
            raise SimConfigError(str(e)) from None
        if ns.max_model_len > capacity - ns.block_size // 2:
            raise SimConfigError(
                f"The model's max seq len ({ns.max_model_len}) is larger than the maximum number "
                f"of tokens that can be stored in KV cache ({capacity}). Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                "engine."
            )
        names = ns.served_model_name if ns.served_model_name else [SIM_PREFIX + model.name]
        names = [n if n.startswith(SIM_PREFIX) else SIM_PREFIX + n for n in names]
        return cls(
            engine=engine,
            gpu=gpu,
            model=model,
            served_model_names=tuple(names),
            tensor_parallel_size=tp,
            data_parallel_size=ns.data_parallel_size,
            enable_prefix_caching=ns.enable_prefix_caching,
            gpu_memory_utilization=ns.gpu_memory_utilization,
            max_num_seqs=ns.max_num_seqs,
            max_num_batched_tokens=ns.max_num_batched_tokens,
            block_size=ns.block_size,
            max_model_len=ns.max_model_len,
            host=ns.host,
            port=ns.port,
            quiet=ns.quiet,
            time_scale=ns.time_scale,
            seed=ns.seed,
            natural_output_tokens=ns.natural_output_tokens,
            output_length_sigma=ns.output_length_sigma,
            uninformative_share=ns.uninformative_share,
            rollouts=ns.rollouts,
            die_after_requests=ns.die_after_requests,
            crash_above_concurrency=ns.crash_above_concurrency,
            max_request_rate=ns.max_request_rate,
            tool_call_share=ns.tool_call_share,
            slow_down_after_s=ns.slow_down_after,
            slow_down_factor=ns.slow_down_factor,
            weight_sync_gbps=ns.weight_sync_gbps,
            host_gbps=ns.host_gbps,
            measured=measured,
            coefficients=profile.coefficients if profile else StepCoefficients(),
            kv_capacity_tokens=capacity,
            ignored_flags=tuple(unknown),
        )
