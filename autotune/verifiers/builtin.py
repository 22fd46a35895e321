"""Inline verifiers: cheap string checks that run on the event loop (capacity None).
Why: docs/design/verifiers.md.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from autotune.results.responses import response_text

if TYPE_CHECKING:
    from autotune.verifiers import VerifierOptions

_BRACE = re.compile(r"[{}]")
_TEXT_WRAP = re.compile(r"\\text(?:bf|rm|tt|it|sf)?\{\s*(.*?)\s*\}", re.S)
_FINAL_ANSWER = re.compile(r"(?i)(?:final\s+answer|answer)\s*[:：]\s*(.+)")
_MATH_DELIMS = re.compile(r"\\[()\[\]]|\$")
_NUMBER_SEP = re.compile(r"(?<=\d),(?=\d{3})")

# NeMo Gym mcqa: one capital letter in a box, anything but letters around it.
_STRICT_BOXED = re.compile(r"\\boxed\{\s*[^A-Za-z]*([A-Z])[^A-Za-z]*\s*\}")
_BOXED_CONTENT = re.compile(r"\\boxed\{\s*(.*?)\s*\}", re.S)
_ANSWER_COLON = re.compile(r"(?i)answer\s*[:：]\s*(.+)")
_LONE_LETTER = re.compile(r"\(?\s*([A-Za-z])\s*\)?(?:[.:)]|\s|$)")
_ALL_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class NoneVerifier:
    """No verification: reward None, so a run measures the model side alone."""

    name = "none"
    capacity: int | None = None

    def __init__(self, options: VerifierOptions | None = None) -> None:
        pass

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"reward": None}

    async def aclose(self) -> None:
        pass


class ExactVerifier:
    """Reward 1.0 when the whole answer, stripped, equals `expected_answer` stripped.

    Case-sensitive unless the row says `case_sensitive: false`. The cheapest real
    verifier: the engine's throughput target (>3,000 rollouts/s) is measured with it.
    """

    name = "exact"
    capacity: int | None = None

    def __init__(self, options: VerifierOptions | None = None) -> None:
        pass

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        text = response_text(row.get("response")).strip()
        expected = row.get("expected_answer")
        if expected is None:
            return {"reward": 0.0, "extracted_answer": text}
        wanted = str(expected).strip()
        if row.get("case_sensitive") is False:
            ok = text.casefold() == wanted.casefold()
        else:
            ok = text == wanted
        return {"reward": 1.0 if ok else 0.0, "extracted_answer": text}

    async def aclose(self) -> None:
        pass


class BoxedVerifier:
    """NeMo Gym string_match: extract by `extraction_mode`, compare with `expected_answer`.

    Modes: `boxed` (default here, so math_with_judge rows with only `expected_answer`
    work), `final_answer` (last "Final answer:"/"Answer:", else the last box),
    `last_line`, `full_response`. Both sides are normalised (LaTeX delimiters and
    \\text{} dropped, whitespace collapsed, outer quotes and trailing .!? removed,
    case folded unless `case_sensitive` is true); numbers also match by value.
    """

    name = "boxed"
    capacity: int | None = None

    def __init__(self, options: VerifierOptions | None = None) -> None:
        pass

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        text = response_text(row.get("response"))
        extracted = extract_answer(text, row.get("extraction_mode") or "boxed")
        expected = row.get("expected_answer")
        reward = 0.0
        if extracted is not None and expected is not None and str(expected) != "":
            fold = not row.get("case_sensitive", False)
            reward = 1.0 if answers_match(extracted, str(expected), fold) else 0.0
        return {"reward": reward, "extracted_answer": extracted}

    async def aclose(self) -> None:
        pass


class McqaVerifier:
    """NeMo Gym mcqa: the chosen letter, compared with `expected_answer`.

    `grading_mode` `strict_single_letter_boxed` (the default) takes the first
    \\boxed{X} holding one capital letter among the options' letters; any other mode
    (`lenient_boxed`, `lenient_answer_colon`) also accepts an option's text inside the
    box, "Answer: X" (letter or option text) and a reply that is a lone letter.
    """

    name = "mcqa"
    capacity: int | None = None

    def __init__(self, options: VerifierOptions | None = None) -> None:
        pass

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        text = response_text(row.get("response")).strip()
        options = _option_pairs(row.get("options"))
        allowed = frozenset(letter for letter, _ in options) if options else _ALL_LETTERS
        mode = row.get("grading_mode") or "strict_single_letter_boxed"
        pred = _strict_letter(text, allowed)
        if pred is None and mode != "strict_single_letter_boxed":
            pred = _lenient_letter(text, options, allowed)
        gold = str(row.get("expected_answer") or "").strip().upper()
        reward = 1.0 if pred is not None and gold and pred == gold else 0.0
        return {"reward": reward, "extracted_answer": pred}

    async def aclose(self) -> None:
        pass


# --- string_match extraction -------------------------------------------------------


def extract_answer(text: str, mode: str) -> str | None:
    """The answer in `text` by NeMo Gym string_match's `extraction_mode`."""
    if mode == "boxed":
        return extract_boxed(text)
    if mode == "final_answer":
        found = _FINAL_ANSWER.findall(text)
        if found:
            return found[-1].strip().strip("*").strip().rstrip(".").strip()
        return extract_boxed(text)
    if mode == "last_line":
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line:
                return line
        return None
    if mode == "full_response":
        return text.strip() or None
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...} (nested braces kept), \\text{} unwrapped."""
    end = len(text)
    while True:
        start = text.rfind("\\boxed", 0, end)
        if start < 0:
            return None
        brace = start + 6
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace < len(text) and text[brace] == "{":
            depth = 1
            for match in _BRACE.finditer(text, brace + 1):
                depth += 1 if match.group() == "{" else -1
                if depth == 0:
                    return _unwrap_text(text[brace + 1 : match.start()].strip()).strip()
        end = start


def _unwrap_text(value: str) -> str:
    while (match := _TEXT_WRAP.fullmatch(value)) is not None:
        value = match.group(1)
    return value


def normalise_answer(value: str, fold: bool) -> str:
    """Comparable form of an answer: no LaTeX delimiters, one space, no trailing .!?"""
    value = _unwrap_text(_MATH_DELIMS.sub("", value).strip())
    value = " ".join(value.split())
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1].strip()
    value = value.rstrip(".!?") or value
    return value.casefold() if fold else value


def answers_match(extracted: str, expected: str, fold: bool) -> bool:
    """Whether two answers agree after normalising (and, for numbers, by value)."""
    a = normalise_answer(extracted, fold)
    b = normalise_answer(expected, fold)
    if a == b:
        return True
    if a and b and (a[0].isdigit() or a[0] in "-+.") and (b[0].isdigit() or b[0] in "-+."):
        try:
            return float(_NUMBER_SEP.sub("", a)) == float(_NUMBER_SEP.sub("", b))
        except ValueError:
            return False
    return False


# --- mcqa extraction ---------------------------------------------------------------


def _option_pairs(options: Any) -> list[tuple[str, str]]:
    """(LETTER, text) pairs from `[{"A": ...}, ...]` or `{"A": ..., ...}`."""
    if not options:
        return []
    items = (
        options.items()
        if isinstance(options, dict)
        else (pair for entry in options if isinstance(entry, dict) for pair in entry.items())
    )
    return [
        (key.upper(), str(value))
        for key, value in items
        if isinstance(key, str) and len(key) == 1 and key.isalpha()
    ]


def _strict_letter(text: str, allowed: frozenset[str]) -> str | None:
    match = _STRICT_BOXED.search(text)
    if match is None or match.group(1) not in allowed:
        return None
    return match.group(1)


def _lenient_letter(
    text: str, options: list[tuple[str, str]], allowed: frozenset[str]
) -> str | None:
    boxed = _BOXED_CONTENT.search(text)
    if boxed is not None and options:
        inner = boxed.group(1)
        candidates = {_squash(inner), _squash(_unwrap_text(inner))}
        hits = {
            letter
            for letter, option in options
            if (norm := _squash(option)) and any(norm in c for c in candidates)
        }
        if len(hits) == 1:
            return hits.pop()
    colon = _ANSWER_COLON.findall(text)
    if colon:
        candidate = _unwrap_text(colon[-1].strip().strip("*").strip())
        letter = _letter_of(candidate, allowed)
        if letter is not None:
            return letter
        squashed = _squash(candidate.rstrip("."))
        for letter, option in options:
            if _squash(option) == squashed:
                return letter
    return _letter_of(text, allowed) if len(text) <= 4 else None


def _letter_of(candidate: str, allowed: frozenset[str]) -> str | None:
    match = _LONE_LETTER.match(candidate)
    if match is None:
        return None
    letter = match.group(1).upper()
    return letter if letter in allowed else None


def _squash(value: str) -> str:
    return " ".join(value.lower().split())
