"""The loop report, built only from a saved loop (loop.json): what the trainer trained,
the generation, training and sync lanes over time, the staleness of what it trained, and
each step's timeline."""

from __future__ import annotations

from pathlib import Path

from autotune.report import html, plots
from autotune.results.codec import save
from autotune.results.runs import LoopResult, LoopStep, LoopSummary

Spans = dict[str, list[tuple[float, float]]]


RESULT_FILE = "loop.json"


def lane_spans(summary: LoopSummary) -> Spans:
    """When samples were in flight, when the trainer trained, and when generation stood
    paused for a weight sync (colocated: the server's sleep before training too)."""
    sync = [(s.sync_start, s.sync_end) for s in summary.steps]
    if summary.mode == "colocated":
        sync += [(s.train_start - s.pause_s, s.train_start) for s in summary.steps]
    return {
        "generation": list(summary.generating),
        "training": [(s.train_start, s.train_end) for s in summary.steps],
        "sync": sorted(sync),
    }


def _figures(summary: LoopSummary) -> list[list[object]]:
    stale = summary.staleness_histogram
    return [
        ["trained samples/s (the objective)", summary.trained_samples_per_s],
        ["trained samples", summary.trained_samples],
        ["elapsed s", summary.elapsed_s],
        ["trainer idle (waiting for a batch)", f"{summary.trainer_idle_share:.1%}"],
        ["generator idle (no sample in flight)", f"{summary.generator_idle_share:.1%}"],
        ["paused for weight syncs", f"{summary.sync_share:.1%}"],
        ["staleness: versions behind → samples", ", ".join(f"{k}: {v}" for k, v in stale.items())],
        ["staleness p50 / p95 / max", f"{summary.staleness_p50} / {summary.staleness_p95} / "
         f"{summary.staleness_max}"],
        ["dropped as stale (samples)", summary.dropped_stale_samples],
        ["aborted by a pause, sent again", summary.aborted_samples],
        ["failed samples", summary.failed_samples],
        ["cancelled at the end", summary.cancelled_samples],
        ["complete, not trained at the end", summary.untrained_samples],
        ["pause answer, mean ms", _ms(summary.pause_s.mean)],
        ["resume answer, mean ms", _ms(summary.resume_s.mean)],
    ]  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _step_row(step: LoopStep) -> list[object]:
    behind = ", ".join(str(s) for s in step.staleness)
    return [
        step.index,
        step.version,
        f"{step.wait_s:.3f}",
        f"{step.train_end - step.train_start:.3f}",
        f"{step.sync_end - step.sync_start:.3f}",
        _ms(step.pause_s),
        _ms(step.transfer_s),
        _ms(step.resume_s),
        step.samples,
        step.dropped_stale,
        behind,
    ]


STEP_COLUMNS = [
    "step", "version", "waited s", "trained s", "sync s", "pause ms", "transfer ms",
    "resume ms", "samples", "dropped", "staleness of its groups",
]  # fmt: skip


def render(result: LoopResult) -> str:
    summary = result.summary
    bound = f", at most {summary.max_ahead} groups ahead" if summary.mode == "async" else ""
    subtitle = (
        f"{summary.mode}: {summary.batch_groups} groups of {summary.group_size} a step{bound}; "
        f"pause {summary.pause_mode} ({summary.pause_source}); {summary.model} at "
        f"{summary.base_url}"
    )
    sections = [
        html.section("Figures", html.table(["figure", "value"], _figures(summary))),
        html.section(
            "Generation, training and syncs over time",
            html.svg(
                plots.lanes(
                    lane_spans(summary),
                    "What ran when",
                    key="lanes",
                    simulated=summary.simulated,
                ),
                "lanes of generation, training and weight syncs over the loop's time",
            ),
        ),
        html.section(
            "Steps", html.table(STEP_COLUMNS, [_step_row(step) for step in summary.steps])
        ),
        html.section(
            "Settings",
            html.definition_list([(k, str(v)) for k, v in sorted(result.settings.items())]),
        ),
    ]
    banner = (
        "SIMULATED — measured on autotune's simulated vLLM-like server, not real hardware"
        if summary.simulated
        else None
    )
    return html.page("autotune loop", sections, banner=banner, subtitle=subtitle)


def write(result: LoopResult, directory: Path) -> Path:
    return html.write_report(directory, render(result))


def write_outputs(result: LoopResult, directory: Path) -> list[Path]:
    """loop.json, then index.html rebuilt from it (also what `autotune report` calls)."""
    saved = save(result, directory / RESULT_FILE)
    return [saved, write(result, directory)]
