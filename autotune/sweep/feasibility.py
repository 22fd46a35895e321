"""What is known before launching a configuration: whether it can start at all, how many
requests it can run at once (its ceiling), a GPU budget's splits as one search parameter,
the study's first trial, and a trial's share of the roofline. Why: docs/design/sweep.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.config.flags import flag_values
from autotune.config.knobs import (
    KNOBS,
    NUM_ENGINES,
    SERVER_KNOBS,
    SPLIT,
    ChoiceSpace,
    FloatSpace,
    IntSpace,
)
from autotune.config.study import TRAINED, Study, loop_spec, server_part
from autotune.errors import UsageError
from autotune.hardware.deployment import SimArgs, SimConfig, SimConfigError, hardware_names
from autotune.hardware.fit import (
    Batch,
    GpuMemory,
    Split,
    batch_fit,
    gpu_bytes,
    model_profile,
    tp_problem,
    vllm_fit,
    weights_fit,
)
from autotune.hardware.memory import InsufficientMemory
from autotune.hardware.profiles import GPUS, GpuProfile, ModelProfile, find_model
from autotune.hardware.roofline import roofline
from autotune.results.probes import CurvePoint

Space = IntSpace | FloatSpace | ChoiceSpace
# A colocated engine shares its GPUs with the trainer, whose weights, gradients and
# optimiser state stay there: OpenRLHF's hybrid engine gives vLLM half of their memory
# (`--vllm_gpu_memory_utilization 0.5`), and a colocated trial takes no more.
COLOCATED_MEMORY_SHARE = 0.5


def hardware(study: Study) -> tuple[GpuProfile | None, ModelProfile | None]:
    """The GPU and model profiles the study runs on, where known: the simulator's
    `--gpu`/`--model` (its defaults when unsaid); else `resources.gpu`/`model_profile`;
    else, for vLLM, the local model directory's config.json."""
    target, resources = study.target, study.resources
    gpu_name = resources.gpu if resources else None
    model_name = resources.model_profile if resources else None
    if target.kind == "sim":
        values = flag_values(target.args)
        gpu_name, model_name = hardware_names(
            values.get("gpu"), values.get("model"), values.get("profile")
        )
    gpu = GPUS.get(gpu_name) if gpu_name else None
    model = find_model(model_name) if model_name else None
    if model is None and target.engine is not None and target.model:
        model = model_profile(Path(target.model))
    return gpu, model


def splits(study: Study, gpu_memory: GpuMemory | None = None) -> list[Split]:
    """The engines × TP splits of `resources.gpus` worth a trial, smallest TP first.

    TP: the study's tensor_parallel_size choices, else every size up to the budget
    (powers of two when the model is unknown), less those the model cannot be sharded
    over or whose weights do not fit a GPU at the largest memory utilisation searched.
    For each TP only the most engines that fit (gpus // TP): one more engine is more
    hardware and never fewer rollouts, since the client's parallelism is searched too.
    Raises UsageError for a TP choice the model cannot be sharded over, or when none fits.
    """
    assert study.resources is not None
    gpus = study.resources.gpus
    gpu, model = hardware(study)
    space = study.search_space.tensor_parallel_size
    chosen = space is not None
    if space is not None:
        sizes = [int(choice) for choice in space.choices]
    elif model is not None:
        sizes = list(range(1, gpus + 1))
    else:
        sizes = [2**k for k in range(gpus.bit_length()) if 2**k <= gpus]
    memory = gpu.memory_bytes if gpu else None
    if memory is None and study.target.engine is not None:
        memory = (gpu_memory or gpu_bytes)()
    found, too_big = [], []
    for tp in sorted(set(sizes)):
        why = tp_problem(model, tp) if model else None
        if why is not None and chosen and model is not None:
            usable = [str(t) for t in range(1, gpus + 1) if tp_problem(model, t) is None]
            raise UsageError(
                f"search_space.tensor_parallel_size.choices holds {tp}, which cannot shard "
                f"{model.name} ({why.rstrip('.')}); choose from {', '.join(usable)}."
            )
        if why is not None:
            continue
        if (
            model is not None
            and memory is not None
            and not weights_fit(model, memory, tp, _largest_utilisation(study))
        ):
            too_big.append(tp)
            continue
        found.append(Split(gpus // tp, tp))
    if not found:
        raise UsageError(
            f"no tensor-parallel size of resources.gpus ({gpus}) fits "
            f"{model.name if model else 'the model'} (tried {', '.join(map(str, too_big))}); "
            "give the study more GPUs or a larger gpu_memory_utilization."
        )
    return found


def _largest_utilisation(study: Study) -> float:
    space = study.search_space.gpu_memory_utilization
    if isinstance(space, FloatSpace):
        return space.high
    if isinstance(space, ChoiceSpace):
        return max(float(choice) for choice in space.choices)
    return float(flag_values(study.target.args).get("gpu_memory_utilization", 0.9))


def parameters(study: Study, gpu_count: int = 0) -> dict[str, Space]:
    """What the sampler draws: the server knobs, tensor-parallel choices limited to the
    GPUs NVML sees; with `resources`, one categorical SPLIT in place of TP.

    Why one categorical for the split: engines and TP are tied by the budget
    (engines × TP ≤ gpus) and only a handful of splits exist (four for 8 GPUs). As two
    parameters TPE would draw pairs that break the budget (trials wasted on refusals)
    and model them as independent, which they are not: a split's throughput belongs to
    the pair. One categorical over the valid splits makes every draw feasible, and TPE
    learns each split's value directly from the trials that ran it.
    """
    knobs = {**study.search_space.server_knobs(), **study.search_space.trainer_knobs()}
    if study.resources is not None:
        split = ChoiceSpace(choices=[s.name for s in splits(study)])
        others = {name: space for name, space in knobs.items() if name != "tensor_parallel_size"}
        return {SPLIT: split, **others}
    tp = knobs.get("tensor_parallel_size")
    if isinstance(tp, ChoiceSpace) and gpu_count > 0:
        usable = [choice for choice in tp.choices if int(choice) <= gpu_count] or [1]
        knobs["tensor_parallel_size"] = ChoiceSpace(choices=usable)
    return knobs


def knobs_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's knobs from the sampler's draw: a SPLIT becomes num_engines and
    tensor_parallel_size (what the launcher starts and the report shows)."""
    knobs = dict(params)
    if SPLIT in knobs:
        split = Split.parse(str(knobs.pop(SPLIT)))
        knobs = {NUM_ENGINES: split.engines, "tensor_parallel_size": split.tp, **knobs}
    return knobs


def effective_knobs(knobs: Mapping[str, Any], known: Batch) -> dict[str, Any]:
    """The knobs that decide what a configuration runs: without gpu_memory_utilization
    when its KV cache has room to spare (two such configurations are measured once)."""
    if known.cache_to_spare:
        return {name: value for name, value in knobs.items() if name != "gpu_memory_utilization"}
    return dict(knobs)


def prelaunch(study: Study, knobs: Mapping[str, Any], gpu_memory: GpuMemory | None = None) -> Batch:
    """Whether the configuration can start and how many requests it can run at once
    (every engine's together). The batch settings are the trainer's: no server sees them."""
    shared = colocated_problem(study, knobs)
    if shared is not None:
        return Batch(shared, None)
    knobs = server_part(knobs)
    engines = int(knobs.get(NUM_ENGINES, 1))
    one = _one_engine(study, {k: v for k, v in knobs.items() if k != NUM_ENGINES}, gpu_memory)
    if one.ceiling is None or engines == 1:
        return one
    return replace(one, ceiling=one.ceiling * engines)


def colocated_problem(study: Study, knobs: Mapping[str, Any]) -> str | None:
    """Why a colocated loop trial's engine takes more of its shared GPUs than the trainer
    leaves it (COLOCATED_MEMORY_SHARE); None for any other trial."""
    if study.objective.metric != TRAINED:
        return None
    if loop_spec(study.workload.loop, knobs).mode != "colocated":
        return None
    fixed = flag_values(study.target.args).get("gpu_memory_utilization")
    share = float(knobs.get("gpu_memory_utilization", fixed or KNOBS.gpu_memory_utilization))
    if share <= COLOCATED_MEMORY_SHARE:
        return None
    return (
        f"colocated, the engine shares its GPUs with the trainer: gpu_memory_utilization "
        f"{share:g} leaves the trainer {1 - share:.0%} of their memory, and a colocated engine "
        f"takes at most {COLOCATED_MEMORY_SHARE:g} (OpenRLHF's hybrid engine gives vLLM half)"
    )


def _one_engine(study: Study, knobs: Mapping[str, Any], gpu_memory: GpuMemory | None) -> Batch:
    settings = {**flag_values(study.target.args), **knobs}
    if study.target.kind == "sim":
        try:
            config = SimConfig.of(SimArgs.parse(study.target.args).with_knobs(knobs))
        except SimConfigError as error:
            return Batch(str(error), None)
        # Every knob as the simulator resolved it, its defaults included.
        resolved = {name: getattr(config, name) for name in SERVER_KNOBS}
        return _known(study, resolved, config.kv_capacity_tokens)
    if study.target.kind == "vllm":
        gpu, model = hardware(study)
        if model is not None:
            memory = gpu.memory_bytes if gpu else (gpu_memory or gpu_bytes)()
            problem, capacity = vllm_fit(model, settings, memory)
            if problem is not None:
                return Batch(problem, None)
            return _known(study, settings, capacity)
    return _known(study, settings, None)


def seed_configuration(study: Study, gpu_count: int = 0) -> dict[str, Any] | None:
    """The first trial's parameters: among every choice and range end of `parameters`,
    the configuration with the highest known ceiling, then the larger values in the
    knobs' order; None when no knob is searched or nothing is known to fit."""
    spaces = parameters(study, gpu_count)
    if not spaces:
        return None
    memory = gpu_bytes() if study.target.kind == "vllm" else None
    values = {name: _ends(space) for name, space in spaces.items()}
    ranked = []
    for combination in itertools.product(*values.values()):
        params = dict(zip(values, combination, strict=True))
        known = prelaunch(study, knobs_of(params), lambda: memory)
        if known.problem is None and known.ceiling is not None:
            order = [v if isinstance(v, int | float) else 0 for v in combination]
            ranked.append(((known.ceiling, *order), params))
    return max(ranked, key=lambda item: item[0])[1] if ranked else None


def _ends(space: IntSpace | FloatSpace | ChoiceSpace) -> list[Any]:
    """A knob's candidates for the seed: its choices, or its range's two ends."""
    if isinstance(space, ChoiceSpace):
        return list(space.choices)
    return [space.low, space.high]


def _known(study: Study, settings: Mapping[str, Any], kv_tokens: int | None) -> Batch:
    """The hardware's batch for the study's rollouts (synthetic work only: a task file's
    lengths are not known before it runs)."""
    synthetic = study.workload.synthetic
    lengths = (
        None
        if study.workload.input is not None
        else (synthetic.prompt_tokens, synthetic.output_tokens)
    )
    return batch_fit(lengths, settings, kv_tokens)


def caching_on(study: Study, knobs: Mapping[str, Any]) -> bool:
    """Whether the configuration runs with prefix caching: the knob, else the fixed
    args, else on (vLLM V1's default, and the simulator's)."""
    if "enable_prefix_caching" in knobs:
        return bool(knobs["enable_prefix_caching"])
    return "--no-enable-prefix-caching" not in study.target.args


def roofline_share(
    study: Study, knobs: Mapping[str, Any], points: Sequence[CurvePoint]
) -> tuple[float | None, float | None]:
    """(the roofline's output tokens/s, the share of it the best point reached) for a
    trial, on the trial's clock; (None, None) where the GPU, the model or the workload's
    lengths are unknown.

    The share of prompt tokens read from the prefix cache is the best point's measured
    one (the server's counters) where there is one; else, with caching on and GRPO
    groups of n, (n − 1)/n of each prompt's whole blocks: every rollout of a group but
    the first finds its prompt cached.
    """
    gpu, model = hardware(study)
    workload = study.workload
    if gpu is None or model is None or workload.input is not None or not points:
        return None, None
    best = max(points, key=lambda point: point.output_tokens_per_s)
    settings = {**flag_values(study.target.args), **knobs}
    prompt, output = workload.synthetic.prompt_tokens[0], workload.synthetic.output_tokens[0]
    block = int(settings.get("block_size", 16))
    cached = best.prefix_cache_hit_share
    if cached is None:
        repeats = workload.num_repeats
        whole_blocks = prompt // block * block / prompt
        cached = (repeats - 1) / repeats * whole_blocks if caching_on(study, knobs) else 0.0
    try:
        ceiling = roofline(
            gpu,
            model,
            int(settings.get("tensor_parallel_size", 1)),
            int(knobs.get(NUM_ENGINES, 1)),
            prompt,
            output,
            max_num_seqs=int(settings.get("max_num_seqs", 256)),
            gpu_memory_utilization=float(settings.get("gpu_memory_utilization", 0.9)),
            block_size=block,
            cached_prompt_share=cached,
        )
    except InsufficientMemory:
        return None, None
    tokens = ceiling.output_tokens_per_s / _time_scale(study)
    return tokens, best.output_tokens_per_s / tokens if tokens > 0 else None


def _time_scale(study: Study) -> float:
    """Real seconds per simulated second of an accelerated simulator (its probes are
    timed by the wall clock, so its ceiling is too); 1 for anything else."""
    scale = float(flag_values(study.target.args).get("time_scale", 1.0))
    return scale if study.target.kind == "sim" and scale > 0 else 1.0
