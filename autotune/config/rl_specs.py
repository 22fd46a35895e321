"""The RL specs: a batch step (`BatchSpec`: groups, over-sampling, carry-over) and the
trainer loop beside the rollouts (`LoopSpec`: mode, staleness, pauses, weight syncs).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from autotune.config.fields import (
    Count,
    Count0,
    Duration,
    Flag,
    NonNegative,
    Option,
    SpecModel,
    Text,
    must_be,
)

BATCH_KNOBS = ("batch_groups", "over_sample", "carry_over")


LOOP_KNOBS = ("mode", "ahead_steps", "max_staleness", "pause_mode")


LoopMode = Literal["sync", "colocated", "async"]


PauseMode = Literal["keep", "wait", "abort", "retract"]


class LoopSpec(SpecModel):
    """The RL loop (`autotune loop`): a trainer stand-in takes `batch_groups` groups a step,
    trains for `train_s`, then syncs weights (pause, sync, caches, resume)."""

    what: ClassVar[str] = "a loop setting"
    mode: Annotated[
        LoopMode,
        must_be("sync, colocated or async"),
        Option(
            ("--mode",),
            "sync: generate, then train, then sync; colocated: the same with the server "
            "asleep while the trainer trains (its GPUs are shared); async: generation goes on "
            "while the trainer trains, at most --max-ahead groups ahead (default: sync)",
            "MODE",
        ),
    ] = "sync"
    batch_groups: Annotated[
        Count, Option(("--batch-groups",), "groups the trainer takes a step (default: 8)", "B")
    ] = 8
    steps: Annotated[Count, Option(("--steps",), "training steps to run (default: 10)", "N")] = 10
    train_s: Annotated[
        Duration,
        Option(
            ("--train-s",),
            "one training step's time: seconds, normal:MEAN,SD or uniform:LOW,HIGH (default: 1)",
            "T",
            text=str,
        ),
    ] = ("fixed", 1.0, 0.0)
    train_command: Annotated[
        Text | None,
        Option(
            ("--train-command",),
            "a shell command run once a step as the training step (its run time is the "
            "step's; it sees AUTOTUNE_STEP, AUTOTUNE_POLICY_VERSION, AUTOTUNE_BATCH_SAMPLES)",
            "CMD",
        ),
    ] = None
    sync_s: Annotated[
        Duration,
        Option(
            ("--sync-s",),
            "the weight transfer's time while generation is paused: seconds or a "
            "distribution as --train-s (default: 0)",
            "S",
            text=str,
        ),
    ] = ("fixed", 0.0, 0.0)
    sync_via_server: Annotated[
        Flag,
        Option(
            ("--sync-via-server",),
            "the transfer is the server's own POST /update_weights (the simulator charges "
            "the model's weights at its --weight-sync-gbps) instead of --sync-s",
            switch=True,
        ),
    ] = False
    sync_command: Annotated[
        Text | None,
        Option(
            ("--sync-command",),
            "a shell command run at each sync, while generation is paused, as the transfer",
            "CMD",
        ),
    ] = None
    pause_mode: Annotated[
        PauseMode,
        must_be("keep, wait, abort or retract"),
        Option(
            ("--pause-mode",),
            "what a sync does to requests in flight (the engine's pause): keep freezes them "
            "until the resume (SGLang: in_place), wait lets them finish first (vLLM only), "
            "abort ends them (they are sent again after the sync), retract frees their KV "
            "cache and recomputes it after (SGLang only) (default: keep)",
            "MODE",
        ),
    ] = "keep"
    clear_cache: Annotated[
        Flag,
        Option(
            ("--no-clear-cache",),
            "keep the prefix cache across a sync (default: cleared, as new weights make it stale)",
            switch=True,
        ),
    ] = True
    max_ahead: Annotated[
        Count | None,
        Option(
            ("--max-ahead",),
            "async: groups started and not yet trained on, at most (OpenRLHF's async queue; "
            "default: --batch-groups, one step ahead)",
            "Q",
        ),
    ] = None
    max_staleness: Annotated[
        Count0 | None,
        Option(
            ("--max-staleness",),
            "async: drop (and count) a group generated more than K policy versions before "
            "the step that would train on it (default: keep every group)",
            "K",
        ),
    ] = None
    sleep_level: Annotated[
        int,
        Field(ge=1, le=2),
        must_be("1 or 2"),
        Option(
            ("--sleep-level",),
            "colocated: vLLM's sleep level while the trainer trains (1: weights to host "
            "memory, 2: dropped) (default: 1)",
            "LEVEL",
        ),
    ] = 1

    @model_validator(mode="after")
    def _coherent(self) -> LoopSpec:
        if self.mode != "async" and (self.max_ahead is not None or self.max_staleness is not None):
            raise ValueError(
                "max_ahead (--max-ahead) and max_staleness (--max-staleness) bound the async "
                "mode: drop them or pass mode async (--mode async)"
            )
        if self.max_ahead is not None and self.max_ahead < self.batch_groups:
            raise ValueError(
                f"max_ahead ({self.max_ahead}) must be at least batch_groups "
                f"({self.batch_groups}), or no step could ever start"
            )
        transfers = [self.sync_via_server, self.sync_command is not None, self.sync_s[1] > 0]
        if sum(transfers) > 1:
            raise ValueError(
                "give one weight transfer: --sync-s, --sync-via-server or --sync-command"
            )
        if self.train_command is not None and self.train_s != ("fixed", 1.0, 0.0):
            raise ValueError("give one training step: --train-s or --train-command")
        return self

    @property
    def ahead(self) -> int:
        """Groups started and not yet trained on, at most: a step's in the synchronous modes."""
        return self.max_ahead or self.batch_groups


class BatchSpec(SpecModel):
    """Batch-synchronous collection: steps of `batch_groups` GRPO groups, as a synchronous
    trainer consumes them between weight syncs, and the remedies for their stragglers."""

    what: ClassVar[str] = "a batch setting"
    batch_groups: Annotated[
        Count | None,
        Option(
            ("--batch-groups",),
            "collect in training steps of B groups (of --num-repeats samples), each step "
            "ending when its groups are complete, as a synchronous trainer waits",
            "B",
        ),
    ] = None
    over_sample: Annotated[
        NonNegative,
        Option(
            ("--over-sample",),
            "start ceil(B*(1+R)) groups a step and end it at B informative groups; the rest "
            "are cancelled on the server (default: 0)",
            "R",
        ),
    ] = 0.0
    carry_over: Annotated[
        Flag,
        Option(
            ("--carry-over",),
            "samples still running when a step ends go on into the next (partial rollouts), "
            "counted to the step in which they finish",
            switch=True,
        ),
    ] = False

    @model_validator(mode="after")
    def _needs_batches(self) -> BatchSpec:
        if self.batch_groups is None and (self.over_sample or self.carry_over):
            raise ValueError(
                "over-sampling and carry-over act on batch steps: give batch_groups "
                "(--batch-groups) too"
            )
        return self
