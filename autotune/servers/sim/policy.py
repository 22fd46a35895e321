"""The simulated model as an RL policy: samples of one prompt that differ.

A GRPO group sends one prompt n times; a real model samples n different answers, some
long, some right. With neither flag set the simulator keeps its plain behaviour (one
length per prompt text, no answer). With them, each prompt gets a difficulty d in
(0, 1), a draw keyed on its text and `--seed`, and each sample of it (the k-th time the
server sees that text) its own draw:

- `--output-length-sigma S`: the sample stops after a lognormal number of tokens, median
  `--natural-output-tokens`, log-scale S, half of its log-variance from the prompt's
  difficulty (harder prompts run longer) and half from the sample. Over all samples
  p99/p50 = e^(2.33 S): S = 1 gives a tail ten times the median.
- `--uninformative-share U`: the answer ends in `\\boxed{42}` (right: synthetic tasks
  expect 42) or `\\boxed{0}`. The easiest U/2 of prompts are solved by every sample, the
  hardest U/2 by none; the rest by alternate samples, so any two samples in a row differ
  and exactly a share U of groups (of two samples or more) is uninformative.
"""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist

RIGHT, WRONG = "\\boxed{42}", "\\boxed{0}"
_FROM_PROMPT = math.sqrt(0.5)  # the share of log-length spread that the difficulty sets
_NORMAL = NormalDist()


def uniform(text: str, key: str) -> float:
    """A draw in (0, 1] fixed by `text` and `key`."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=key.encode()).digest()
    return (int.from_bytes(digest, "big") + 1) / 2.0**64


def _z(u: float) -> float:
    return _NORMAL.inv_cdf(min(u, 1.0 - 1e-12))


class Policy:
    """Per-sample lengths and answers (see the module's docstring)."""

    def __init__(
        self, seed: int, median_tokens: int, sigma: float | None, uninformative: float | None
    ) -> None:
        self._seed = seed
        self._median = median_tokens
        self._sigma = sigma
        self._uninformative = uninformative
        self._seen: dict[int, int] = {}  # hash of a prompt's text → samples of it so far

    @property
    def active(self) -> bool:
        return self._sigma is not None or self._uninformative is not None

    def sample(self, text: str) -> tuple[int | None, str]:
        """(this sample's natural length, or None to keep the plain draw; its answer text)."""
        key = hash(text)
        k = self._seen.get(key, 0)
        self._seen[key] = k + 1
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
