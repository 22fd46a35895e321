"""The simulated model as an RL policy: samples of one prompt that differ in length and
answer (`--output-length-sigma`, `--uninformative-share`, or real rows from `--rollouts`).
Why: docs/design/simulator.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import orjson

from autotune.hardware.deployment import SimConfigError
from autotune.results.responses import CHARS_PER_TOKEN, response_text

RIGHT, WRONG = "\\boxed{42}", "\\boxed{0}"
_FROM_PROMPT = math.sqrt(0.5)  # the share of log-length spread that the difficulty sets
_NORMAL = NormalDist()


def uniform(text: str, key: str) -> float:
    """A draw in (0, 1] fixed by `text` and `key`."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=key.encode()).digest()
    return (int.from_bytes(digest, "big") + 1) / 2.0**64


def _z(u: float) -> float:
    return _NORMAL.inv_cdf(min(u, 1.0 - 1e-12))


@dataclass(frozen=True, slots=True)
class Replayed:
    """One row of a rollouts file: how long its answer was, and whether it passed."""

    tokens: int
    passed: bool


class RolloutReplay:
    """The rows of a rollouts file, by prompt (see the module's docstring)."""

    def __init__(self, groups: Sequence[Sequence[Replayed]]) -> None:
        self.groups = [list(group) for group in groups]
        if all(len(group) == 1 for group in self.groups):
            self.groups = [[row for group in self.groups for row in group]]
            self.pooled = True  # no prompt was sampled twice: samples draw from every row
        else:
            self.pooled = False

    @classmethod
    def load(cls, path: str) -> RolloutReplay:
        """Read FILE; SimConfigError, in one sentence, for a file it cannot replay."""
        try:
            lines = Path(path).read_bytes().splitlines()
        except OSError as error:
            raise SimConfigError(f"--rollouts {path} cannot be read ({error.strerror}).") from None
        groups: dict[bytes, list[Replayed]] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                replayed = Replayed(_tokens(row), float(row["reward"]) > 0)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                raise SimConfigError(
                    f"--rollouts {path}: line {number} is not a rollout row with a numeric "
                    "reward; pass a rollouts JSONL (ng_collect_rollouts' or autotune collect's)."
                ) from None
            groups.setdefault(_prompt_key(row), []).append(replayed)
        if not groups:
            raise SimConfigError(f"--rollouts {path} holds no rows; pass a rollouts JSONL.")
        return cls(list(groups.values()))

    def sample(self, text: str, k: int, seed: int) -> Replayed:
        """The k-th sample of the prompt `text`."""
        if self.pooled:
            rows = self.groups[0]
            return rows[int(uniform(text, f"{seed}/replay/{k}") * len(rows)) % len(rows)]
        pick = int(uniform(text, f"{seed}/replay") * len(self.groups)) % len(self.groups)
        group = self.groups[pick]
        return group[k % len(group)]


def _tokens(row: dict[str, Any]) -> int:
    """A row's output tokens: its usage, else its text at CHARS_PER_TOKEN a token."""
    response = row.get("response") or {}
    usage = response.get("usage") or {}
    counted = usage.get("output_tokens") or usage.get("completion_tokens")
    if isinstance(counted, int) and counted > 0:
        return counted
    return max(1, len(response_text(response)) // CHARS_PER_TOKEN)


def _prompt_key(row: dict[str, Any]) -> bytes:
    """What identifies a row's prompt: its request's input (NeMo Gym) or messages."""
    request = row.get("responses_create_params") or {}
    prompt = request.get("input", row.get("messages", row.get("prompt")))
    return orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS)


class Policy:
    """Per-sample lengths and answers (see the module's docstring)."""

    def __init__(
        self,
        seed: int,
        median_tokens: int,
        sigma: float | None,
        uninformative: float | None,
        replay: RolloutReplay | None = None,
    ) -> None:
        self._seed = seed
        self._median = median_tokens
        self._sigma = sigma
        self._uninformative = uninformative
        self._replay = replay
        self._seen: dict[int, int] = {}  # hash of a prompt's text → samples of it so far

    @property
    def active(self) -> bool:
        return (
            self._sigma is not None or self._uninformative is not None or self._replay is not None
        )

    def sample(self, text: str) -> tuple[int | None, str]:
        """(this sample's natural length, or None to keep the plain draw; its answer text)."""
        key = hash(text)
        k = self._seen.get(key, 0)
        self._seen[key] = k + 1
        if self._replay is not None:
            row = self._replay.sample(text, k, self._seed)
            return row.tokens, " " + (RIGHT if row.passed else WRONG)
        difficulty = uniform(text, f"{self._seed}/difficulty")
        length = None
        if self._sigma is not None:
            mixed = _FROM_PROMPT * _z(difficulty) + _FROM_PROMPT * _z(
                uniform(text, f"{self._seed}/{k}")
            )
            length = max(1, round(self._median * math.exp(self._sigma * mixed)))
        answer = ""
        if self._uninformative is not None:
            answer = " " + (RIGHT if self._solves(difficulty, k) else WRONG)
        return length, answer

    def _solves(self, difficulty: float, k: int) -> bool:
        half = (self._uninformative or 0.0) / 2
        if difficulty <= half:
            return True
        if difficulty > 1 - half:
            return False
        return k % 2 == 0
