"""A calibrated prior (multi-fidelity search): the study run first on the simulated engine
with a calibrated profile, in virtual time, so that the real study launches only the
configurations it puts near its best, its best first. Why: docs/design/sweep.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config.study import PriorSpec, Study
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualSimLauncher

Params = tuple[tuple[str, Any], ...]  # a trial's Optuna parameters, sorted


def params_key(params: dict[str, Any]) -> Params:
    return tuple(sorted(params.items()))


@dataclass(frozen=True, slots=True)
class Prior:
    """Each configuration's value on the calibrated simulator, by its Optuna parameters."""

    values: dict[Params, float]
    spec: PriorSpec
    seconds: float  # the CPU time the ranking took

    @property
    def best(self) -> tuple[Params, float] | None:
        return max(self.values.items(), key=lambda item: item[1], default=None)

    def ruled_out(self, params: dict[str, Any]) -> str | None:
        """Why the configuration is not worth a launch, or None."""
        best, value = self.best, self.values.get(params_key(params))
        if best is None or value is None or best[1] <= 0:
            return None
        share = value / best[1]
        if share >= 1 - self.spec.keep_within:
            return None
        return (
            f"the calibrated prior ({self.spec.profile.name}) puts it at {share:.0%} of its "
            f"best configuration, below the {1 - self.spec.keep_within:.0%} worth a launch "
            "(prior.keep_within): not launched"
        )


def prior_launcher(study: Study, spec: PriorSpec) -> VirtualSimLauncher:
    """The simulated engines `sim serve --profile` runs, with the study's lengths."""
    synthetic = study.workload.synthetic
    return VirtualSimLauncher(
        ["--profile", str(spec.profile), *spec.args],
        ProbeSettings.of(study.probe, 1),
        prompt_tokens=spec.prompt_tokens or synthetic.prompt_tokens,
        output_tokens=spec.output_tokens or synthetic.output_tokens,
        seed=study.seed,
        num_repeats=study.workload.num_repeats,
    )
