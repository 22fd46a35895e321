"""The calibrated prior (multi-fidelity search, sweep/prior.py): a study ranks its
configurations on the simulator calibrated to measured runs before launching any, then
launches the prior's best first and never the ones it puts far below it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.study import PriorSpec, Study, load_study
from autotune.errors import UsageError
from autotune.probe import ProbeSettings
from autotune.probe.virtual import VirtualProbe, VirtualSimLauncher
from autotune.sweep.calibration import fit_profile
from autotune.sweep.prior import Prior, params_key
from autotune.sweep.search import check_space, rank_on_prior
from autotune.sweep.sweep_job import run_sweep

BLOCK = {"hw": "h100", "model": "gpt-oss-120b", "image": "v0.11.2", "isl": "1024", "osl": "1024"}
HELD = ["--max-num-seqs", "32"]  # small batches keep the virtual curves quick
PROMPT, OUTPUT = (1024, 0), (128, 0)


def study(profile: Path, keep_within: float | None = None) -> Study:
    spec: dict[str, Any] = {
        "name": "prior",
        "target": {"kind": "sim", "args": ["--profile", str(profile), *HELD]},
        "workload": {"synthetic": {"prompt_tokens": list(PROMPT), "output_tokens": list(OUTPUT)}},
        "search_space": {
            "parallelism": {"low": 4, "high": 256},
            "tensor_parallel_size": {"choices": [2, 4, 8]},
        },
        "resources": {"gpus": 8},
        "budget": {"trials": 6, "patience": 3, "validate_rollouts": 0},
    }
    if keep_within is not None:
        spec["prior"] = {"profile": str(profile), "args": HELD, "keep_within": keep_within}
    return Study.model_validate(spec)


@pytest.fixture
def profile(tmp_path: Path, table: Path) -> Path:
    fitted, _ = fit_profile(table, BLOCK)
    path = tmp_path / "profile.json"
    fitted.save(path)
    return path


class Counting:
    """The simulated engine in virtual time (the study's truth), noting each launch."""

    def __init__(self, profile: Path) -> None:
        self.engine = VirtualSimLauncher(
            ["--profile", str(profile), *HELD], ProbeSettings(1), PROMPT, OUTPUT
        )
        self.launched: list[dict[str, Any]] = []

    @asynccontextmanager
    async def running(self, knobs: Mapping[str, Any]) -> AsyncIterator[VirtualProbe]:
        self.launched.append(dict(knobs))
        async with self.engine.running(knobs) as probe:
            yield probe


def _split(knobs: Mapping[str, Any]) -> str:
    return f"{knobs['num_engines']}x{knobs['tensor_parallel_size']}"


async def test_the_prior_launches_its_best_first_and_skips_what_it_rules_out(
    profile: Path, tmp_path: Path
) -> None:
    spec = study(profile, keep_within=0.05)
    prior = await rank_on_prior(spec)
    assert len(prior.values) == 3  # every split of the 8 GPUs, each a whole curve
    best_key, best_value = prior.best or ((), 0.0)
    kept = {dict(key)["split"] for key, value in prior.values.items() if value >= 0.95 * best_value}
    assert kept != {"4x2", "2x4", "1x8"}, prior.values  # something to rule out

    launcher = Counting(profile)
    result = await run_sweep(spec, storage=f"sqlite:///{tmp_path / 'p.db'}", launcher=launcher)
    assert _split(launcher.launched[0]) == dict(best_key)["split"]
    assert {_split(knobs) for knobs in launcher.launched} <= kept
    skipped = [t for t in result.trials if "calibrated prior" in (t.pruned_reason or "")]
    assert skipped and all(_split(t.knobs) not in kept for t in skipped)
    assert all("not launched" in (t.pruned_reason or "") for t in skipped)

    without = Counting(profile)
    storage = f"sqlite:///{tmp_path / 'n.db'}"
    plain = await run_sweep(study(profile), storage=storage, launcher=without)
    assert len({_split(k) for k in without.launched}) > len({_split(k) for k in launcher.launched})
    # The same truth: both find the same best split.
    assert _split(result.best().knobs) == _split(plain.best().knobs)  # type: ignore[union-attr]


def test_ruled_out_is_relative_to_the_best_and_silent_on_the_unseen(profile: Path) -> None:
    spec = PriorSpec(profile=profile, keep_within=0.25)
    prior = Prior({params_key({"split": "a"}): 10.0, params_key({"split": "b"}): 7.4}, spec, 0.0)
    assert prior.ruled_out({"split": "a"}) is None
    why = prior.ruled_out({"split": "b"})
    assert why is not None and "74% of its best configuration, below the 75%" in why
    assert prior.ruled_out({"split": "c"}) is None  # not ranked: launched as usual
    kept = Prior({params_key({"split": "b"}): 7.6, params_key({"split": "a"}): 10.0}, spec, 0.0)
    assert kept.ruled_out({"split": "b"}) is None


def test_a_prior_profile_that_is_not_one_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text("{}")
    with pytest.raises(UsageError, match=r"^study prior: --profile .* is not a simulator profile"):
        check_space(study(bad, keep_within=0.25), 0)


def test_a_study_files_prior_profile_is_found_beside_it(profile: Path, tmp_path: Path) -> None:
    folder = tmp_path / "studies"
    folder.mkdir()
    (folder / "profile.json").write_bytes(profile.read_bytes())
    spec = study(profile, keep_within=0.2).model_dump(mode="json")
    spec["prior"]["profile"] = "profile.json"
    (folder / "s.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_study(folder / "s.yaml")
    assert loaded.prior is not None and loaded.prior.profile == folder / "profile.json"


def test_the_step_objective_refuses_a_prior(profile: Path) -> None:
    spec = study(profile, keep_within=0.2).model_dump(mode="json")
    spec["objective"] = {"metric": "informative_groups_per_s"}
    spec["workload"]["num_repeats"] = 4
    with pytest.raises(ValueError, match="prior ranks throughput curves"):
        Study.model_validate(spec)
