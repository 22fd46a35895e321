"""The drift watch: does a collect still hold the throughput it was tuned for? Pure; no I/O.
Steady-state windows against an Expectation raise one DriftWarning.
Why: docs/design/live.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.results.runs import DriftWarning, Expectation
from autotune.stats import RateEstimate
from autotune.window import BATCH_LATENCIES, MIN_BATCHES, pooled_estimate

# The stages a slowdown can be blamed on (total is their sum; ttft is part of model).
BLAMED_STAGES = ("queue", "model", "ttft", "tool", "verify_wait", "verify")
MIN_AUTO_WINDOW_S = 60.0


def auto_window_s(mean_latency_s: float) -> float:
    """A window long enough for MIN_BATCHES batches of completions, at least a minute."""
    return max(MIN_AUTO_WINDOW_S, MIN_BATCHES * BATCH_LATENCIES * mean_latency_s)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One window of the run: its steady-state rate and each stage's mean latency."""

    start_s: float  # seconds since the run began
    end_s: float
    rate: RateEstimate
    stage_means_s: Mapping[str, float]


def window_rate(
    done_at: Sequence[float], start: float, end: float, latency_s: float
) -> RateEstimate:
    """Completions per second in the window with its 95% interval, as a probe measures
    it (`done_at` in time order; `latency_s` the window's mean rollout latency)."""
    estimate, _ = pooled_estimate(done_at, [(start, end)], latency_s)
    return estimate


class DriftWatch:
    """Fed one window at a time; warns once."""

    def __init__(
        self,
        expectation: Expectation,
        windows: int,
        window_s: float,
        hint: str,
        workload_differs: list[str] | None = None,
    ) -> None:
        self.expectation = expectation
        # how this run's workload differs from the expectation's: a shortfall is then the
        # workload's to explain, and the warning says so instead of calling it drift
        self.workload_differs = workload_differs or []
        self.windows = windows
        self.window_s = window_s
        self.hint = hint  # the command that would find out why, e.g. `autotune diagnose ...`
        self.baseline: WindowFigures | None = None
        self.counted = 0  # windows compared so far
        self.below = 0  # windows below the expectation in a row
        self.warning: DriftWarning | None = None

    def add(self, window: WindowFigures) -> DriftWarning | None:
        """The warning, the first time `windows` windows in a row are below; else None."""
        if self.baseline is None:
            self.baseline = window
        self.counted += 1
        if window.rate.high < self.expectation.low:
            self.below += 1
        else:
            self.below = 0
        if self.warning is not None or self.below < self.windows:
            return None
        self.warning = self._warning(window)
        return self.warning

    def _warning(self, window: WindowFigures) -> DriftWarning:
        assert self.baseline is not None
        before, now = self.baseline.stage_means_s, window.stage_means_s
        grown = {s: now[s] - before[s] for s in BLAMED_STAGES if s in now and s in before}
        stage = max(grown, key=lambda s: grown[s]) if grown else None
        if stage is not None and grown[stage] <= 0:
            stage = None  # nothing slowed: it was below from the first window on
        expected = self.expectation
        rate = window.rate
        differs = self.workload_differs
        head = (
            "throughput below the expectation on another workload, not drift"
            if differs
            else "throughput drifted"
        )
        text = (
            f"{head}: {rate.rate:.3g} rollouts/s (95% interval "
            f"{rate.low:.3g}-{rate.high:.3g}) in the last of {self.windows} windows of "
            f"{self.window_s:.3g} s in a row below the {expected.low:.3g} expected "
            f"({expected.source})"
        )
        if stage is not None:
            text += (
                f"; the {stage} stage slowed most: {before[stage] * 1000:.1f} ms per rollout "
                f"in the first window, {now[stage] * 1000:.1f} ms now"
            )
        else:
            text += "; no stage slowed since the first window: it was slow from the start"
        if differs:
            text += (
                f"; this run's workload differs from the expectation's ({'; '.join(differs)}): "
                "rerun on the same workload (the recommendation's `autotune` line) to tell"
            )
        return DriftWarning(
            t_s=window.end_s,
            windows=self.windows,
            window_s=self.window_s,
            rollouts_per_s=rate.rate,
            rollouts_per_s_ci=(rate.low, rate.high),
            expected_low=expected.low,
            stage=stage,
            stage_before_s=before[stage] if stage is not None else None,
            stage_now_s=now[stage] if stage is not None else None,
            message=f"{text}; find out why with: {self.hint}",
            workload_differs=list(differs),
        )
