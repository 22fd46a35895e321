"""A measured response surface: one configuration's per-token latency against concurrency,
read from a table of real serving benchmarks, for the replay target (`sim serve
--replay-table`): one engine on one node, or a disaggregated deployment keyed by its decode
TP. How a step's cost is read from it: docs/design/hardware.md.
"""

from __future__ import annotations

import csv
import statistics
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The columns a key may name, and the defaults a key leaves out. A disaggregated run's
# deployment (its prefill and decode workers) is part of its key; its `tp` and `ep` are
# read as its decode workers' (see _as_replayed).
ENGINE_COLUMNS = ("hw", "model", "framework", "precision", "image", "isl", "osl", "tp", "ep")
DEPLOYMENT_COLUMNS = (
    "prefill_tp", "prefill_ep", "prefill_num_workers", "decode_tp", "decode_ep",
    "decode_num_workers", "num_prefill_gpu", "num_decode_gpu",
)  # fmt: skip
KEY_COLUMNS = (*ENGINE_COLUMNS, *DEPLOYMENT_COLUMNS)
DEFAULT_KEY = {"framework": "vllm", "ep": "1"}
SINGLE_NODE = {"is_multinode": "False", "disagg": "False", "spec_decoding": "none"}
Row = dict[str, str]
REPLAY_FLAGS = ("--replay-table", "--replay-where")


class SurfaceError(ValueError):
    """A table, or a key into it, that gives no surface; str() is one sentence."""


@dataclass(frozen=True, slots=True)
class MeasuredSurface:
    """Median TPOT and TTFT (seconds) at each measured concurrency of one configuration."""

    key: dict[str, str]
    concurrency: tuple[int, ...]  # ascending
    tpot_s: tuple[float, ...]
    ttft_s: tuple[float, ...]
    input_tokens: int
    output_tokens: int
    repeats: int  # runs pooled, in all

    @property
    def lowest(self) -> int:
        return self.concurrency[0]

    @property
    def highest(self) -> int:
        return self.concurrency[-1]

    @property
    def disaggregated(self) -> bool:
        """Prompts are prefilled on GPUs of their own, off the decode workers' steps."""
        return "num_prefill_gpu" in self.key

    def tpot_at(self, running: float) -> float:
        """The measured time per output token with `running` sequences in flight,
        interpolated between measured concurrencies (held at the lowest below it)."""
        return interpolate(self.concurrency, self.tpot_s, running)

    @property
    def prefill_s_per_token(self) -> float:
        """A prompt token's prefill: the lowest concurrency's TTFT less one step, spread
        over the input length."""
        return max(0.0, self.ttft_s[0] - self.tpot_s[0]) / self.input_tokens

    def decode_s(self, running: float) -> float:
        """A decode step of `running` sequences, without the prefills the measured TPOT
        holds on average (see the module's docstring)."""
        tpot = self.tpot_at(running)
        prefills = self.prefill_s_per_token * running * self.input_tokens / self.output_tokens
        return max(tpot - prefills, 0.1 * tpot)

    def step_s(self, decodes: int, prefill_tokens: int) -> float:
        """One engine step: `decodes` sequences each make a token, `prefill_tokens` of
        prompts are computed. Disaggregated, the decodes cost the measured TPOT and a
        prompt's wait on the prefill GPUs (TTFT less a step) is shared out over the step's
        sequences (docs/design/hardware.md)."""
        if self.disaggregated:
            tpot = self.tpot_at(decodes)
            wait = max(interpolate(self.concurrency, self.ttft_s, decodes) - tpot, 0.0)
            shared = prefill_tokens / self.input_tokens * wait / (decodes + 1)
            return (tpot if decodes else 0.0) + shared
        decode = self.decode_s(decodes) if decodes else 0.0
        return decode + prefill_tokens * self.prefill_s_per_token

    def describe(self) -> str:
        key = ", ".join(f"{k}={v}" for k, v in self.key.items())
        return (
            f"{key}: concurrency {self.lowest} to {self.highest} measured "
            f"({len(self.concurrency)} points, {self.repeats} runs)"
        )


def interpolate(concurrency: Sequence[float], values: Sequence[float], running: float) -> float:
    """The one model of a measured figure against concurrency (ascending), the replay's and
    the methods benchmark's: linear between measured concurrencies, held at the ends."""
    if running <= concurrency[0]:
        return values[0]
    if running >= concurrency[-1]:
        return values[-1]
    i = bisect_left(concurrency, running)
    share = (running - concurrency[i - 1]) / (concurrency[i] - concurrency[i - 1])
    return values[i - 1] + share * (values[i] - values[i - 1])


def parse_key(text: str) -> dict[str, str]:
    """`hw=h100,isl=1024,osl=1024` → {hw: h100, ...}; an unknown column is one sentence."""
    key: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in KEY_COLUMNS or not value:
            raise SurfaceError(
                f"--replay-where takes COLUMN=VALUE pairs of {', '.join(KEY_COLUMNS)}, not {part!r}"
            )
        key[name] = value
    return key


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    """One configuration at one concurrency, its repeats pooled by their medians."""

    output_tokens_per_s_per_gpu: float
    median_e2e_s: float
    p99_e2e_s: float
    median_tpot_s: float


@dataclass(frozen=True, slots=True)
class MeasuredBlock:
    """One model on one GPU type, engine image and lengths, measured at several TPs: the
    response surface a sweep over TP and client concurrency searches."""

    key: dict[str, str]  # every key column but tp
    points: dict[int, dict[int, MeasuredPoint]]  # TP → concurrency → point, ascending
    input_tokens: int
    output_tokens: int

    def at(self, tp: int, running: float) -> MeasuredPoint:
        """TP `tp` with `running` sequences in flight, by the replay's rule (`interpolate`):
        each figure between measured concurrencies, held at the ends; below the lowest,
        every sequence runs as fast as there (its latencies held), so throughput falls in
        proportion."""
        measured = self.points[tp]
        conc, points = list(measured), list(measured.values())

        def figure(name: str) -> float:
            return interpolate(conc, [getattr(p, name) for p in points], running)

        below = min(running / conc[0], 1.0)
        return MeasuredPoint(
            figure("output_tokens_per_s_per_gpu") * below,
            figure("median_e2e_s"),
            figure("p99_e2e_s"),
            figure("median_tpot_s"),
        )

    def gpus(self, tp: int) -> int:
        """The GPUs the figures at `tp` are per: the engine's, or a disaggregated
        deployment's prefill and decode GPUs (its TP is its decode workers')."""
        if "num_prefill_gpu" in self.key:
            return int(self.key["num_prefill_gpu"]) + int(self.key["num_decode_gpu"])
        return tp

    def describe(self) -> str:
        key = ", ".join(f"{k}={v}" for k, v in self.key.items())
        sizes = ", ".join(f"TP {tp}: {min(c)}–{max(c)}" for tp, c in self.points.items())
        return f"{key} (concurrency measured at {sizes})"


def read_runs(
    path: Path, where: Mapping[str, str], flags: tuple[str, str] = REPLAY_FLAGS
) -> list[Row]:
    """The runs (see _replayable; as _as_replayed reads them) of the one configuration
    `where` picks out of the table at `path` (every TP, unless `where` names one); a key
    that picks none, or several, is one sentence that names the choices. `flags`: the
    options the table and the key came by."""
    flag, where_flag = flags
    try:
        with path.open(newline="") as handle:
            rows = [_as_replayed(row) for row in csv.DictReader(handle)]
    except OSError as error:
        raise SurfaceError(f"cannot read {flag} {path} ({error.strerror})") from None
    needed = {"conc", "median_tpot", "median_ttft", *ENGINE_COLUMNS}
    if not rows or not needed <= set(rows[0]):
        raise SurfaceError(
            f"{flag} {path} is not a table of serving runs: it needs the columns "
            f"{', '.join(sorted(needed))}"
        )
    key = {**DEFAULT_KEY, **where}
    chosen = [
        row
        for row in rows
        if _replayable(row)
        and all(_matches(row.get(name, ""), value) for name, value in key.items())
    ]
    if not chosen:
        raise SurfaceError(f"{flag} {path} has no run of {_text(key)}; {_near(rows, key)}")
    columns = tuple(c for c in KEY_COLUMNS if c != "tp" or "tp" in key)
    configurations = {tuple(row.get(c, "") for c in columns) for row in chosen}
    if len(configurations) > 1:
        differ = [c for i, c in enumerate(columns) if len({conf[i] for conf in configurations}) > 1]
        choices = "; ".join(
            sorted(
                ", ".join(f"{c}={conf[columns.index(c)]}" for c in differ)
                for conf in configurations
            )
        )
        raise SurfaceError(
            f"{flag} {path} has {len(configurations)} configurations for "
            f"{_text(key)}; add {', '.join(differ)} to {where_flag} (one of: {choices})"
        )
    return chosen


def load_block(path: Path, where: Mapping[str, str], flags: tuple[str, str]) -> MeasuredBlock:
    """Every TP's measured points of the configuration `where` picks (see read_runs)."""
    chosen = read_runs(path, where, flags)
    grouped: dict[int, dict[int, list[Row]]] = {}
    for row in chosen:
        grouped.setdefault(int(row["tp"]), {}).setdefault(int(row["conc"]), []).append(row)
    points = {
        tp: {
            conc: MeasuredPoint(
                _median(runs, "output_tput_per_gpu"),
                _median(runs, "median_e2el"),
                _median(runs, "p99_e2el"),
                _median(runs, "median_tpot"),
            )
            for conc, runs in sorted(by_conc.items())
        }
        for tp, by_conc in sorted(grouped.items())
    }
    first = chosen[0]
    return MeasuredBlock(
        key={c: first[c] for c in KEY_COLUMNS if c != "tp" and first.get(c)},
        points=points,
        input_tokens=int(first["isl"]),
        output_tokens=int(first["osl"]),
    )


def load_surface(path: Path, where: Mapping[str, str], tp: int) -> MeasuredSurface:
    """The surface of the one configuration `where` and `tp` pick out of the table at
    `path`; a key that picks none, or several, is one sentence that names the choices."""
    chosen = read_runs(path, {**where, "tp": str(tp)})
    by_conc: dict[int, list[dict[str, str]]] = {}
    for row in chosen:
        by_conc.setdefault(int(row["conc"]), []).append(row)
    concs = sorted(by_conc)
    first = chosen[0]
    return MeasuredSurface(
        key={c: first[c] for c in KEY_COLUMNS if first.get(c)},
        concurrency=tuple(concs),
        tpot_s=tuple(_median(by_conc[c], "median_tpot") for c in concs),
        ttft_s=tuple(_median(by_conc[c], "median_ttft") for c in concs),
        input_tokens=int(first["isl"]),
        output_tokens=int(first["osl"]),
        repeats=len(chosen),
    )


def _replayable(row: Row) -> bool:
    """A run without speculative decoding of one engine on one node, or of a disaggregated
    deployment (its prefill and decode GPUs counted: see _as_replayed)."""
    if row.get("disagg") == "True" and row.get("spec_decoding", "none") == "none":
        return all(row.get(c) for c in DEPLOYMENT_COLUMNS)
    return all(row.get(k, v) == v for k, v in SINGLE_NODE.items())


def _as_replayed(row: Row) -> Row:
    """A disaggregated run as the replay takes it: its decode workers' TP and EP as `tp`
    and `ep`, and its output tokens/s per GPU over all its GPUs (InferenceX's column is
    over its decode GPUs alone; Little's law on its latencies says so)."""
    if row.get("disagg") != "True" or not all(row.get(c) for c in DEPLOYMENT_COLUMNS):
        return row
    decode = int(row["num_decode_gpu"])
    gpus = int(row["num_prefill_gpu"]) + decode
    replayed = {**row, "tp": row["decode_tp"], "ep": row["decode_ep"]}
    if row.get("output_tput_per_gpu"):
        replayed["output_tput_per_gpu"] = str(float(row["output_tput_per_gpu"]) * decode / gpus)
    return replayed


def _matches(value: str, wanted: str) -> bool:
    """A key's value matches a column exactly, or as the end of it (`gpt-oss-120b` for
    `openai/gpt-oss-120b`, `v0.13.0` for `vllm/vllm-openai:v0.13.0`)."""
    return value == wanted or value.endswith(("/" + wanted, ":" + wanted))


def _median(rows: Sequence[Row], column: str) -> float:
    return statistics.median(float(row[column]) for row in rows)


def _text(key: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in key.items())


def _near(rows: Sequence[dict[str, str]], key: Mapping[str, str]) -> str:
    """What the table does hold for the key less its last failing column."""
    for drop in reversed(list(key)):
        rest = {k: v for k, v in key.items() if k != drop}
        values = sorted(
            {
                row.get(drop, "")
                for row in rows
                if all(_matches(row.get(k, ""), v) for k, v in rest.items())
            }
        )
        if values:
            return f"with the rest of the key it has {drop} {', '.join(values)}"
    return "pick a configuration the table measured"
