"""What each remedy would make of a run's step, predicted as an interval from its phases:
asynchronous training at a split of the GPUs, generation on more GPUs, partial rollouts
against the tail, and a weight sync at its wire floor; each with its framework's lines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.doctor.anatomy import Anatomy
from autotune.results.doctor import Remedy

BYTES_PER_PARAMETER = 2  # bf16 weights on the wire


@dataclass(frozen=True, slots=True)
class Setup:
    """What the log does not say and a prediction needs (each optional)."""

    gpus: int | None = None  # the run's GPUs, generation and training together
    split: tuple[int, int] | None = None  # (generating, training) GPUs for async training
    colocated: bool = True  # the run generates and trains on the same GPUs
    generation_s: Mapping[int, float] | None = None  # measured generation time by GPU count
    params_b: float | None = None  # the model's parameters, billions
    link_gbps: float | None = None  # the weight transfer's link, gigabits a second


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float


def remedies(anatomy: Anatomy, setup: Setup) -> tuple[list[Remedy], list[str]]:
    """The remedies that apply, best predicted gain first, and why the others do not."""
    found: list[Remedy] = []
    skipped: list[str] = []
    for make in (_asynchronous, _more_generation, _partial_rollouts, _weight_sync_floor):
        remedy, why_not = make(anatomy, setup)
        if remedy is not None:
            found.append(remedy)
        elif why_not:
            skipped.append(why_not)
    return sorted(found, key=lambda remedy: remedy.gain, reverse=True), skipped


def _remedy(
    name: str, anatomy: Anatomy, predicted: Interval, basis: str, assumptions: list[str],
    lines: dict[str, str],
) -> Remedy:  # fmt: skip
    step, middle = anatomy.step.mean_s, (predicted.low + predicted.high) / 2
    return Remedy(
        name=name, step_s=middle, low_s=predicted.low, high_s=predicted.high,
        gain=step / middle, gain_low=step / predicted.high, gain_high=step / predicted.low,
        basis=basis, assumptions=assumptions, lines=lines,
    )  # fmt: skip


def _replaced(anatomy: Anatomy, seconds: float, by: Interval) -> Interval:
    """Today's step with `seconds` of it taking `by` instead, the rest unchanged."""
    rest = anatomy.step.mean_s - seconds
    return Interval(rest + by.low, rest + by.high)


def generation_at(
    gpus_now: int, gpus_then: int, seconds_now: float, setup: Setup
) -> tuple[Interval, str]:
    """Generation's time on `gpus_then` GPUs: measured there when given, else between no
    change and linear scaling of `seconds_now` on `gpus_now`."""
    measured = (setup.generation_s or {}).get(gpus_then)
    if measured is not None:
        return Interval(measured, measured), f"measured on {gpus_then} GPUs (--generation-s)"
    ratio = gpus_now / gpus_then
    bounds = sorted((seconds_now, seconds_now * ratio))
    return (
        Interval(bounds[0], bounds[1]),
        f"between no change and linear scaling from {gpus_now} to {gpus_then} GPUs (no "
        "generation time measured there: pass --generation-s GPUS=SECONDS)",
    )


@dataclass(frozen=True, slots=True)
class Lanes:
    """One step of a run, seconds: its generation, its trainer's passes (training and
    log-probs), and what neither hides (reward, weight sync, checkpoints, the rest)."""

    generation_s: float
    trainer_s: float
    exposed_s: float

    @property
    def step_s(self) -> float:
        """The step when nothing overlaps (synchronous)."""
        return self.generation_s + self.trainer_s + self.exposed_s

    @property
    def overlapped_s(self) -> float:
        """The step when generation and the trainer overlap (one step off)."""
        return max(self.generation_s, self.trainer_s) + self.exposed_s


@dataclass(frozen=True, slots=True)
class AsyncLanes:
    """Asynchronous training at a split: each lane's seconds a step at the interval's two
    ends (the generating GPUs' and the trainer's), and what neither hides."""

    split: tuple[int, int]
    generation: Interval
    trainer: Interval
    exposed_s: float
    basis: str

    def ends(self) -> tuple[Lanes, Lanes]:
        """The lanes at the interval's low end and at its high end."""
        return (
            Lanes(self.generation.low, self.trainer.low, self.exposed_s),
            Lanes(self.generation.high, self.trainer.high, self.exposed_s),
        )

    @property
    def step(self) -> Interval:
        low, high = self.ends()
        return Interval(low.overlapped_s, high.overlapped_s)


def asynchronous_lanes(anatomy: Anatomy, setup: Setup) -> AsyncLanes | str:
    """One step off: the next batch generates on G GPUs while the trainer trains on the
    other T, so a step is the longer lane plus what neither hides; the best split when
    none is given. A string: why it does not apply."""
    today = run_lanes(anatomy)
    if setup.gpus is None:
        return "asynchronous training: pass --gpus (and --split G:T) to predict it"
    if anatomy.seconds("waiting") > 0:
        return "asynchronous training: the run already overlaps generation (it waits)"
    total = setup.gpus
    splits = [setup.split] if setup.split else [(g, total - g) for g in _splits(total)]
    generation = anatomy.generation_alone_s or anatomy.seconds("generation")
    trainer = today.trainer_s
    # Apart, the engines no longer sleep and wake for the trainer.
    exposed = today.exposed_s - (anatomy.seconds("sleep_wake") if setup.colocated else 0.0)
    best: AsyncLanes | None = None
    for generating, training_gpus in splits:
        gpus_before = total if setup.colocated else generating
        lane, basis = generation_at(gpus_before, generating, generation, setup)
        trainer_before = total if setup.colocated else training_gpus
        trainer_lane = Interval(trainer, trainer * trainer_before / training_gpus)
        lanes = AsyncLanes((generating, training_gpus), lane, trainer_lane, exposed, basis)
        if best is None or lanes.step.low + lanes.step.high < best.step.low + best.step.high:
            best = lanes
    assert best is not None
    return best


def run_lanes(anatomy: Anatomy) -> Lanes:
    """The run's step as three lanes: generation (its trainer's wait included), the
    trainer's passes, and what neither hides (the step less both)."""
    generation = anatomy.seconds("generation", "waiting")
    trainer = anatomy.seconds("training", "logprobs")
    return Lanes(generation, trainer, anatomy.step.mean_s - generation - trainer)


def _asynchronous(anatomy: Anatomy, setup: Setup) -> tuple[Remedy | None, str]:
    lanes = asynchronous_lanes(anatomy, setup)
    if isinstance(lanes, str):
        return None, lanes
    today = run_lanes(anatomy)
    (generating, training_gpus), trainer = lanes.split, today.trainer_s
    switch = today.generation_s - (anatomy.generation_alone_s or today.generation_s)
    assumptions = [
        f"{generating} GPUs generate and {training_gpus} train, one step apart",
        f"training and log-probs ({trainer:.3g} s) scale between no change and linearly "
        f"with the GPUs ({setup.gpus if setup.colocated else training_gpus} → {training_gpus})",
        f"reward, weight sync, checkpoints and the unaccounted rest ({lanes.exposed_s:.3g} s) "
        "stay on the step; a colocated engine's sleep and wake-up go",
    ]
    if setup.colocated and switch > 0:
        assumptions.append(
            f"the colocated engines' wake-up and resharding ({switch:.3g} s) is gone: "
            "generation no longer shares the trainer's GPUs"
        )
    lines = {
        "verl": f"one_step_off_policy recipe: rollout.n_gpus_per_node={generating} "
        f"trainer.n_gpus_per_node={training_gpus}",
        "slime": f"train_async.py --rollout-num-gpus {generating} --actor-num-gpus-per-node "
        f"{training_gpus} (without --colocate)",
        "nemo_rl": "grpo.async_grpo.enabled=true grpo.async_grpo.max_trajectory_age_steps=1 "
        "policy.generation.colocated.enabled=false "
        f"policy.generation.colocated.resources.gpus_per_node={generating}",
        "openrlhf": f"--train.async_enable --train.async_queue_size 1 --actor.num_gpus_per_node "
        f"{training_gpus} (without --train.colocate_all)",
    }
    name = "asynchronous training, one step off"
    return _remedy(name, anatomy, lanes.step, lanes.basis, assumptions, lines), ""


def _splits(total: int) -> list[int]:
    """Generating GPU counts tried when no split is given: an eighth to a half."""
    return sorted({max(1, total * k // 8) for k in (1, 2, 3, 4)})


def _more_generation(anatomy: Anatomy, setup: Setup) -> tuple[Remedy | None, str]:
    """Twice the rollout engines (on twice the generating GPUs)."""
    generation = anatomy.seconds("generation")
    if generation <= 0 or generation < 0.2 * anatomy.step.mean_s:
        return None, "more rollout engines: generation is under a fifth of the step"
    gpus = setup.gpus or 1
    lane, basis = generation_at(gpus, 2 * gpus, generation, setup)
    return _remedy(
        "twice the rollout engines", anatomy, _replaced(anatomy, generation, lane), basis,
        [f"generation ({generation:.3g} s) on twice the GPUs; the other phases unchanged"],
        {
            "verl": "actor_rollout_ref.rollout.tensor_model_parallel_size: the engines are "
            "the rollout GPUs over it",
            "slime": "--rollout-num-gpus (with --rollout-num-gpus-per-engine)",
            "nemo_rl": "policy.generation.colocated.resources.gpus_per_node",
            "openrlhf": "--vllm.num_engines (with --vllm.tensor_parallel_size)",
        },
    ), ""  # fmt: skip


def _partial_rollouts(anatomy: Anatomy, setup: Setup) -> tuple[Remedy | None, str]:
    """Partial rollouts (or over-sampling): a step's generation stops near the time the
    mean response needs, the longest carried over to the next step."""
    tail = anatomy.tail
    ratio = tail.slowest_over_mean or tail.max_over_mean
    generation = anatomy.seconds("generation")
    if ratio is None or ratio <= 1.0 or generation <= 0:
        return None, "partial rollouts: the log has no response-length or slowest-sample figure"
    figure = "slowest sample's generation" if tail.slowest_over_mean else "longest response"
    predicted = _replaced(anatomy, generation, Interval(generation / ratio, generation))
    return _remedy(
        "partial rollouts against the tail", anatomy, predicted,
        f"between no gain and generation ending with the mean sample ({figure} ×{ratio:.2f} "
        "the mean)",
        ["the carried-over samples cost the next step nothing it would not spend anyway"],
        {
            "verl": "async_training.partial_rollout=True (fully async trainer)",
            "slime": "--partial-rollout --over-sampling-batch-size",
            "openrlhf": "--train.async_enable --train.partial_rollout_enable",
        },
    ), ""  # fmt: skip


def _weight_sync_floor(anatomy: Anatomy, setup: Setup) -> tuple[Remedy | None, str]:
    """The weight sync at its wire floor: the weights' bytes over the link."""
    sync = anatomy.seconds("weight_sync", "sleep_wake")
    if sync <= 0:
        return None, ""
    if setup.params_b is None or setup.link_gbps is None:
        return None, "a faster weight sync: pass --params-b and --link-gbps for its wire floor"
    floor = setup.params_b * 1e9 * BYTES_PER_PARAMETER * 8 / (setup.link_gbps * 1e9)
    if floor >= sync:
        return None, f"a faster weight sync: it takes {sync:.3g} s, at its floor ({floor:.3g} s)"
    predicted = _replaced(anatomy, sync, Interval(floor, sync))
    return _remedy(
        "weight sync at its wire floor", anatomy, predicted,
        f"{setup.params_b:g}B parameters in bf16 over {setup.link_gbps:g} Gb/s: {floor:.3g} s",
        ["between today's sync and the wire floor"],
        {
            "slime": "--update-weight-buffer-size (larger buckets)",
            "openrlhf": "--vllm.sync_backend nccl",
        },
    ), ""  # fmt: skip
