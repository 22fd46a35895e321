"""Groups launched and not yet ended, and the client's parallelism as slots a sample holds
while it is sent: the one bookkeeping of batch steps (rl/batch.py) and the RL loop
(rl/trainer.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass(slots=True)
class GroupInFlight:
    """A launched group: its task index, its samples and what a runner notes of it."""

    index: int
    size: int
    pending: int  # samples not yet ended
    launched_step: int = 0  # the batch step it was launched in
    version: int | None = None  # the oldest policy version any of its samples was sent under
    failed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


Item = TypeVar("Item")


class GroupsInFlight:
    """The groups in flight by task index, and `parallelism` slots (None: unbounded)."""

    def __init__(self, parallelism: int | None) -> None:
        self._slots = asyncio.Semaphore(parallelism) if parallelism is not None else None
        self.running: dict[int, GroupInFlight] = {}

    def __len__(self) -> int:
        return len(self.running)

    def launch(
        self,
        group: GroupInFlight,
        items: Sequence[Item],
        sample: Callable[[GroupInFlight, Item], Coroutine[Any, Any, None]],
    ) -> GroupInFlight:
        """Start one task a sample; the group is in flight until `end` or `cancel`."""
        self.running[group.index] = group
        group.tasks = [asyncio.create_task(sample(group, item)) for item in items]
        return group

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One sample's slot of the client's parallelism, held while it is sent."""
        if self._slots is not None:
            await self._slots.acquire()
        try:
            yield
        finally:
            if self._slots is not None:
                self._slots.release()

    def end(self, index: int) -> GroupInFlight | None:
        """The group is no longer in flight (its last sample ended); None if it was not."""
        return self.running.pop(index, None)

    async def cancel(self, indices: Iterable[int] | None = None) -> tuple[int, list[GroupInFlight]]:
        """Cancel these groups' samples still running (None: every group's); how many
        samples were cancelled, and the groups, now out of flight."""
        groups = [self.running[i] for i in (list(self.running) if indices is None else indices)]
        tasks = [task for group in groups for task in group.tasks if task.cancel()]
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in groups:
            self.running.pop(group.index, None)
        return len(tasks), groups
