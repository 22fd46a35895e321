"""GRPO groups: the unit an RL trainer consumes, not the single rollout. A `GroupTracker`
closes each group and counts stragglers, informative groups and RL goodput.
Why: docs/design/rl.md.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.results.runs import GroupSummary
from autotune.results.stages import StageLatency

TAIL_QUANTILE = 0.9  # a step's tail begins when this share of its samples has ended


def completion_s(starts: Sequence[float], ends: Sequence[float]) -> float:
    """A group's completion time: its first sample's start to its last sample's end."""
    return max(ends) - min(starts)


def straggler_ratio(durations: Sequence[float]) -> float:
    """The slowest sample's time over the median one's (1.0: no straggler)."""
    median = statistics.median(durations)
    return max(durations) / median if median > 0 else math.inf


def is_informative(rewards: Sequence[float]) -> bool:
    """Reward variance above zero: at least two samples, not all rewarded alike."""
    return len(rewards) > 1 and max(rewards) != min(rewards)


def tail_share(ends: Sequence[float], start: float, end: float) -> float | None:
    """The share of a step [start, end] after TAIL_QUANTILE of its samples had ended:
    how long the trainer waits on the last tenth (None for an empty or instant step)."""
    if not ends or end <= start:
        return None
    ordered = sorted(ends)
    reached = ordered[math.ceil(TAIL_QUANTILE * len(ordered)) - 1]
    return (end - reached) / (end - start)


@dataclass(slots=True)
class ClosedGroup:
    """A group whose last sample just ended."""

    task_index: int
    complete: bool
    informative: bool
    completion_s: float
    output_tokens: int
    straggler_ratio: float | None = None  # complete groups only


class _Open:
    """A group still running: what its closing figures need, nothing per sample but times
    and rewards."""

    __slots__ = ("durations", "ended", "failed", "first_start", "last_end", "rewards", "tokens")

    def __init__(self) -> None:
        self.ended = 0
        self.first_start = math.inf
        self.last_end = -math.inf
        self.durations: list[float] = []
        self.rewards: list[float] = []
        self.tokens = 0
        self.failed = False


class GroupTracker:
    """Every group of a run: `ended` for each sample (completed or not), totals on close."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._open: dict[int, _Open] = {}
        self.complete = 0
        self.informative = 0
        self.incomplete = 0
        self.informative_tokens = 0
        self._completion = array("d")
        self.straggler_ratios = array("d")  # one a complete group, in the order they closed
        self.on_close: Callable[[ClosedGroup], None] | None = None  # a batch step's runner

    def ended(
        self,
        task_index: int,
        start: float,
        end: float,
        reward: float | None = None,
        output_tokens: int = 0,
        completed: bool = True,
    ) -> ClosedGroup | None:
        """One sample of `task_index`'s group ended; the group, when this was its last."""
        group = self._open.get(task_index)
        if group is None:
            group = self._open[task_index] = _Open()
        group.ended += 1
        if start < group.first_start:
            group.first_start = start
        if end > group.last_end:
            group.last_end = end
        if completed and reward is not None:
            group.durations.append(end - start)
            group.rewards.append(reward)
            group.tokens += output_tokens
        else:
            group.failed = True
        if group.ended < self.size:
            return None
        del self._open[task_index]
        closed = self._close(task_index, group)
        if self.on_close is not None:
            self.on_close(closed)
        return closed

    def _close(self, task_index: int, group: _Open) -> ClosedGroup:
        took = group.last_end - group.first_start
        if group.failed:
            self.incomplete += 1
            return ClosedGroup(task_index, False, False, took, group.tokens)
        self.complete += 1
        self._completion.append(took)
        straggler = straggler_ratio(group.durations)
        self.straggler_ratios.append(straggler)
        informative = is_informative(group.rewards)
        if informative:
            self.informative += 1
            self.informative_tokens += group.tokens
        return ClosedGroup(task_index, True, informative, took, group.tokens, straggler)

    def summary(self, elapsed_s: float) -> GroupSummary:
        """The run's group figures over `elapsed_s` seconds."""
        elapsed = max(elapsed_s, 1e-9)
        return GroupSummary(
            size=self.size,
            complete=self.complete,
            informative=self.informative,
            incomplete=self.incomplete,
            informative_share=self.informative / self.complete if self.complete else None,
            informative_groups_per_s=self.informative / elapsed,
            informative_tokens_per_s=self.informative_tokens / elapsed,
            completion_s=StageLatency.of(self._completion),
            straggler_ratio=StageLatency.of(self.straggler_ratios),
        )


def summarise_closed(size: int, closed: Sequence[ClosedGroup], elapsed_s: float) -> GroupSummary:
    """The figures of the groups `closed` within `elapsed_s` seconds: a probe's window
    counts the groups that ended inside it, as it counts rollouts."""
    complete = [group for group in closed if group.complete]
    informative = [group for group in complete if group.informative]
    elapsed = max(elapsed_s, 1e-9)
    return GroupSummary(
        size=size,
        complete=len(complete),
        informative=len(informative),
        incomplete=len(closed) - len(complete),
        informative_share=len(informative) / len(complete) if complete else None,
        informative_groups_per_s=len(informative) / elapsed,
        informative_tokens_per_s=sum(group.output_tokens for group in informative) / elapsed,
        completion_s=StageLatency.of([group.completion_s for group in complete]),
        straggler_ratio=StageLatency.of(
            [group.straggler_ratio for group in complete if group.straggler_ratio is not None]
        ),
    )
