"""The Optuna side of a sweep: storage, sampler, the ask/tell loop, and trials as records
(refused configurations as violated constraints, pruned curves, resumed studies).
Why: docs/design/sweep.md.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from autotune.config.knobs import ChoiceSpace, FloatSpace, IntSpace
from autotune.config.study import PriorSpec, Study
from autotune.errors import UsageError
from autotune.hardware.deployment import SimConfig, SimConfigError
from autotune.hardware.fit import Batch
from autotune.hardware.profiles import GPUS, MODELS, find_model
from autotune.probe import Launcher
from autotune.results.probes import CurvePoint
from autotune.results.runs import BatchSummary, LoopSummary
from autotune.results.stages import LATENCY_SLOS
from autotune.results.trials import CurveSummary, TrialOutcome, TrialRecord
from autotune.sweep.curve import Incumbent
from autotune.sweep.feasibility import (
    effective_knobs,
    knobs_of,
    parameters,
    prelaunch,
    roofline_share,
    seed_configuration,
    splits,
)
from autotune.sweep.objectives import objective_for
from autotune.sweep.objectives.base import TrialContext
from autotune.sweep.prior import Prior, params_key, prior_launcher

log = logging.getLogger("autotune")

IMPROVEMENT = 0.01  # patience counts trials that did not beat the best by 1%
EFFECTIVE = "effective_knobs"  # a trial's user attribute: the knobs that change its batches
COPIED = "copied_from"  # a trial's user attribute: the trial whose figures it reuses
# Proposals in a row that were all copies: the sampler has nothing new left to try.
COPIES_IN_A_ROW = 5
HEARTBEAT_INTERVAL_S = 10  # a shared study's running trial records a heartbeat this often
GRACE_PERIOD_S = 30  # and the next worker to start fails it once it is this stale


def storage_url(study: Study, storage: str | None, studies_dir: Path) -> str:
    if storage:
        return storage
    studies_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{studies_dir / (study.name + '.db')}"


def suggest_knobs(trial: Any, study: Study, gpu_count: int) -> dict[str, Any]:
    """The trial's server knobs, drawn over fit.parameters (tensor-parallel choices
    limited to the visible GPUs; a GPU budget's engines × TP as one categorical)."""
    params: dict[str, Any] = {}
    for name, space in parameters(study, gpu_count).items():
        if isinstance(space, ChoiceSpace):
            params[name] = trial.suggest_categorical(name, list(space.choices))
        elif isinstance(space, IntSpace):
            params[name] = trial.suggest_int(name, space.low, space.high, log=space.log)
        else:
            step = None if space.log else space.step
            value = trial.suggest_float(name, space.low, space.high, step=step, log=space.log)
            params[name] = round(value, 6)
    return knobs_of(params)


def space_size(study: Study, gpu_count: int) -> int | None:
    """How many configurations the sampler can draw; None where a knob is continuous."""
    size = 1
    for space in parameters(study, gpu_count).values():
        finite = isinstance(space, ChoiceSpace) or (
            not space.log and (isinstance(space, IntSpace) or space.step is not None)
        )
        if not finite:
            return None
        size *= len(grid_values(space))
    return size


def _covered(done: list[Any], size: int | None) -> bool:
    """Every configuration of a finite space has a finished trial (measured, or copied)."""
    return size is not None and len({tuple(sorted(t.params.items())) for t in done}) >= size


def grid_values(space: IntSpace | FloatSpace | ChoiceSpace) -> list[Any]:
    """A finite grid over one knob (powers of two for log ints), for exhaustive baselines."""
    if isinstance(space, ChoiceSpace):
        return list(space.choices)
    if isinstance(space, IntSpace):
        if space.log:
            values = [
                2**k
                for k in range(
                    math.ceil(math.log2(space.low)), math.floor(math.log2(space.high)) + 1
                )
            ]
            return sorted({space.low, *values, space.high})
        return list(range(space.low, space.high + 1))
    if space.high == space.low:
        return [space.low]
    step = space.step or (space.high - space.low) / 4
    count = round((space.high - space.low) / step)
    return [round(space.low + i * step, 6) for i in range(count + 1)]


def _record(trial: Any, outcome: TrialOutcome, study: Study) -> None:
    objective = study.objective
    trial.set_user_attr("knobs", outcome.knobs)
    trial.set_user_attr("points", [point.to_dict() for point in outcome.points])
    trial.set_user_attr("curve", outcome.curve.to_dict() if outcome.curve else None)
    trial.set_user_attr("probe_s", outcome.probe_s)
    trial.set_user_attr("wall_s", outcome.wall_s)
    trial.set_user_attr("p95_latency_s", outcome.p95_latency_s)
    trial.set_user_attr("error_rate", outcome.error_rate)
    if outcome.batch is not None:
        trial.set_user_attr("batch", outcome.batch.to_dict())
    if outcome.loop is not None:
        trial.set_user_attr("loop", outcome.loop.to_dict())
    if outcome.infeasible_reason is not None:
        trial.set_user_attr("infeasible_reason", outcome.infeasible_reason)
    if outcome.pruned_reason is not None:
        trial.set_user_attr("pruned_reason", outcome.pruned_reason)
    if outcome.copied_from is not None:
        trial.set_user_attr(COPIED, outcome.copied_from)
    usable = [p for p in outcome.points if p.error_rate <= objective.max_error_rate]
    ceiling, share = roofline_share(study, outcome.knobs, usable)
    if ceiling is not None:
        trial.set_user_attr("roofline_output_tokens_per_s", ceiling)
        trial.set_user_attr("roofline_share", share)
    trial.set_constraint("feasible", 0.0 if outcome.infeasible_reason is None else 1.0)
    trial.set_constraint("error_rate", outcome.error_rate - objective.max_error_rate)
    # An SLO is met when some usable point meets it (the value is the best such point's).
    for latency in LATENCY_SLOS:
        slo = getattr(objective, latency.field)
        if slo is not None:
            lowest = getattr(outcome, f"min_{latency.figure}")
            trial.set_user_attr(f"min_{latency.figure}", lowest)
            name = latency.figure.removesuffix("_s")
            trial.set_constraint(name, min(lowest if lowest is not None else math.inf, 1e9) - slo)
    objective_for(study.objective.metric).record_trial(study, trial, outcome)


def _values(outcome: TrialOutcome, study: Study) -> float | list[float]:
    if study.objective.second_objective == "p95_latency":
        p95 = outcome.p95_latency_s if outcome.p95_latency_s is not None else 1e9
        return [outcome.value, p95]
    return outcome.value


def is_feasible(trial: Any) -> bool:
    """Every constraint set with `trial.set_constraint` is ≤ 0 (Optuna's definition)."""
    return all(value <= 0 for value in trial.constraints.values())


def with_storage_hidden(url: str) -> str:
    """A storage URL without its password, for messages."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def open_study(study: Study, url: str) -> Any:
    """Create or resume the Optuna study; trials a crash left RUNNING become FAIL.

    SQLite (the default) is for one process, so at start every RUNNING trial is stale.
    A shared RDB (PostgreSQL) may hold other workers' live trials: there, heartbeats
    let Optuna fail only the trials whose worker died.
    """
    import optuna
    import sqlalchemy.exc
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shared = url.startswith(("postgresql", "mysql"))
    storage: Any = url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if shared:
            storage = _shared_storage(url)
        directions: list[Literal["maximize", "minimize"]] = ["maximize"]
        if study.objective.second_objective == "p95_latency":
            directions = ["maximize", "minimize"]
        sampler = optuna.samplers.TPESampler(
            # Workers sharing a study must not all draw the same random configurations, and
            # TPE must count the trials other workers are running as taken (constant liar).
            seed=None if shared else study.seed,
            multivariate=True,
            constant_liar=shared,
            n_startup_trials=startup_trials(study),
        )
        try:
            optuna_study = optuna.create_study(
                study_name=study.name,
                storage=storage,
                load_if_exists=True,
                directions=directions,
                sampler=sampler,
            )
        except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.OperationalError) as error:
            reason = str(error.orig if hasattr(error, "orig") else error).splitlines()[0]
            raise UsageError(
                f"cannot open the study storage {with_storage_hidden(url)} ({reason}); pass a "
                "URL such as sqlite:///studies/NAME.db or postgresql://user@host/db."
            ) from None
        if shared:
            optuna.storages.fail_stale_trials(optuna_study)
        else:
            for trial in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                optuna_study.tell(trial.number, state=TrialState.FAIL)
    return optuna_study


def _shared_storage(url: str) -> Any:
    """RDBStorage with heartbeats. Workers started together on a new database race to create
    its tables (PostgreSQL: a duplicate key in pg_type); the losers retry and find them."""
    import optuna
    import sqlalchemy.exc

    def storage() -> Any:
        try:
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_PERIOD_S
            )
        except ImportError as error:  # Optuna wraps the driver's ModuleNotFoundError
            missing = getattr(error.__cause__, "name", None) or getattr(error, "name", None)
            raise UsageError(
                f"the storage URL needs a database driver that is not installed ({missing}); "
                "install it, e.g. pip install 'rollout-autotune[postgres]'."
            ) from None

    for backoff_s in (0.1, 0.2, 0.4, 0.8):
        try:
            return storage()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            time.sleep(backoff_s)  # the winner is still creating them
    return storage()


def finished_trials(optuna_study: Any) -> list[Any]:
    """COMPLETE and PRUNED trials: both count towards the budget and are never rerun."""
    from optuna.trial import TrialState

    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    return [t for t in optuna_study.get_trials(deepcopy=False) if t.state in finished]


async def optimise(
    study: Study,
    optuna_study: Any,
    launcher: Launcher,
    gpu_count: int = 0,
    on_trial: Callable[[int, TrialOutcome], None] | None = None,
    *,
    seed_first: bool = True,
    prior: Prior | None = None,
    prune: bool = True,
) -> None:
    """Run trials until the budget (finished trials that are not copies, time, patience)
    is spent or the space is covered; a new study's first trial is the `prior`'s best
    configuration, else fit.seed_configuration unless `seed_first` is off (a benchmark of
    the sampler alone). A configuration the prior rules out is recorded PRUNED without a
    launch; `prune` off measures every curve whole (the prior's own run)."""
    from optuna.trial import TrialState

    budget = study.budget
    deadline = time.monotonic() + budget.time_s if budget.time_s else math.inf
    if not optuna_study.get_trials(deepcopy=False):
        first = dict(prior.best[0]) if prior and prior.best else None
        if first is None and seed_first:
            first = seed_configuration(study, gpu_count)
        if first is not None:
            optuna_study.enqueue_trial(first)
    size = space_size(study, gpu_count)
    copies_in_a_row = 0
    while True:
        done = finished_trials(optuna_study)
        # A copy measures nothing and costs nothing: it counts towards neither the budget
        # nor patience.
        judged = [t for t in done if COPIED not in t.user_attrs]
        if len(judged) >= budget.trials or time.monotonic() >= deadline:
            return
        if budget.patience and _stalled(judged, budget.patience, startup_trials(study)):
            log.info("no 1%% gain in the last %d trials: stopping early", budget.patience)
            return
        if _covered(done, size):
            log.info("every configuration of the search space was tried: stopping")
            return
        if copies_in_a_row >= COPIES_IN_A_ROW:
            log.info(
                "the sampler proposed %d configurations in a row that were measured already: "
                "the search space looks covered, stopping",
                copies_in_a_row,
            )
            return
        best = _best(done)
        with warnings.catch_warnings():  # ask/tell is fine: _heartbeat records it
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            trial = optuna_study.ask()
        try:
            with _heartbeat(optuna_study, trial):
                knobs = suggest_knobs(trial, study, gpu_count)
                known = prelaunch(study, knobs)
                same = effective_knobs(knobs, known)
                ruled_out = prior.ruled_out(trial.params) if prior else None
                outcome = (
                    _measured_before(done, knobs, same)
                    or (_not_started(knobs, pruned=ruled_out) if ruled_out else None)
                    or await _measure(study, launcher, trial, knobs, known, best if prune else None)
                )
        except BaseException:
            optuna_study.tell(trial, state=TrialState.FAIL)
            raise
        trial.set_user_attr(EFFECTIVE, same)
        _record(trial, outcome, study)
        if outcome.pruned_reason is not None:
            optuna_study.tell(trial, state=TrialState.PRUNED)
        else:
            optuna_study.tell(trial, _values(outcome, study))
        copies_in_a_row = copies_in_a_row + 1 if outcome.copied_from is not None else 0
        if on_trial is not None:
            on_trial(trial.number, outcome)


CACHING = "enable_prefix_caching"


async def measure_caching_twin(
    study: Study,
    optuna_study: Any,
    launcher: Launcher,
    gpu_count: int = 0,
    on_trial: Callable[[int, TrialOutcome], None] | None = None,
) -> None:
    """Where prefix caching is searched, the best trial's configuration with caching
    flipped is measured in full (never pruned), one trial past the budget, unless a
    complete trial already has it: what the cache buys is then two whole curves apart,
    not a curve against one stopped early. A resumed study finds it done."""
    from optuna.trial import TrialState

    done = finished_trials(optuna_study)
    feasible = [t for t in done if t.state == TrialState.COMPLETE and is_feasible(t)]
    best = max(feasible, key=_value, default=None)
    if best is None or CACHING not in best.params:
        return
    twin = {**best.params, CACHING: not best.params[CACHING]}
    if any(t.params == twin for t in done if t.state == TrialState.COMPLETE):
        return
    optuna_study.enqueue_trial(twin)
    trial = optuna_study.ask()
    try:
        with _heartbeat(optuna_study, trial):
            knobs = suggest_knobs(trial, study, gpu_count)
            known = prelaunch(study, knobs)
            outcome = await _measure(study, launcher, trial, knobs, known, None)
    except BaseException:
        optuna_study.tell(trial, state=TrialState.FAIL)
        raise
    trial.set_user_attr(EFFECTIVE, effective_knobs(knobs, known))
    _record(trial, outcome, study)
    optuna_study.tell(trial, _values(outcome, study))
    if on_trial is not None:
        on_trial(trial.number, outcome)


def _not_started(
    knobs: dict[str, Any], *, infeasible: str | None = None, pruned: str | None = None
) -> TrialOutcome:
    """A configuration settled without a launch: known not to fit (`infeasible`), or
    ruled out by the calibrated prior (`pruned`)."""
    return TrialOutcome(
        knobs=knobs,
        points=[],
        curve=None,
        value=0.0,
        p95_latency_s=None,
        error_rate=1.0 if infeasible else 0.0,
        infeasible_reason=infeasible,
        probe_s=0.0,
        wall_s=0.0,
        pruned_reason=pruned,
    )


async def rank_on_prior(study: Study, gpu_count: int = 0) -> Prior:
    """The study's own search, unpruned (every configuration it tries gets its whole
    curve), on the calibrated simulator (`study.prior`) in virtual time."""
    assert study.prior is not None
    started = time.process_time()
    with tempfile.TemporaryDirectory() as folder:
        optuna_study = open_study(study, f"sqlite:///{Path(folder) / 'prior.db'}")
        launcher = prior_launcher(study, study.prior)
        await optimise(study, optuna_study, launcher, gpu_count, prune=False)
        values: dict[tuple[tuple[str, Any], ...], float] = {}
        for trial in finished_trials(optuna_study):
            value = _value(trial) if trial.state.name == "COMPLETE" and is_feasible(trial) else 0.0
            key = params_key(trial.params)
            values[key] = max(values.get(key, 0.0), value)
    prior = Prior(values, study.prior, time.process_time() - started)
    log.info(
        "the calibrated prior ranked %d configurations in %.0f CPU-seconds",
        len(values),
        prior.seconds,
    )
    return prior


async def _measure(
    study: Study,
    launcher: Launcher,
    trial: Any,
    knobs: dict[str, Any],
    known: Batch,
    best: Incumbent | None,
) -> TrialOutcome:
    """Reject a configuration known not to fit without launching it; else run the trial,
    each rung reported to Optuna and, in a one-objective study, pruned once it cannot
    reach the best value so far."""
    if known.problem is not None:
        return _not_started(knobs, infeasible=f"{known.problem} (known before launch: not started)")
    objective = objective_for(study.objective.metric)
    return await objective.run_trial(study, launcher, knobs, TrialContext(trial, known, best))


def _heartbeat(optuna_study: Any, trial: Any) -> Any:
    """Records the trial's heartbeat while it runs (a no-op without RDB heartbeats).

    Only `Study.optimize` records heartbeats itself; with ask/tell a dead worker's trial
    would have none and stay RUNNING forever instead of failing after the grace period.
    """
    from optuna.storages._heartbeat import get_heartbeat_thread

    return get_heartbeat_thread(trial._trial_id, optuna_study._storage)


def _measured_before(
    done: list[Any], knobs: dict[str, Any], effective: dict[str, Any]
) -> TrialOutcome | None:
    """The sampler proposed a configuration already measured (or pruned, or rejected),
    or one that runs the same batches (fit.effective_knobs): reuse it, no restart.

    With categorical knobs TPE often proposes a repeat; a restart and a curve cost
    minutes on real hardware and would only re-measure the same thing.
    """
    for trial in done:
        attrs = trial.user_attrs
        if attrs.get(EFFECTIVE, attrs.get("knobs")) == effective and "points" in attrs:
            curve = attrs.get("curve")
            return TrialOutcome(
                knobs=knobs,
                points=[CurvePoint.from_dict(point) for point in attrs["points"]],
                curve=CurveSummary.from_dict(curve) if curve else None,
                value=_value(trial),
                p95_latency_s=attrs.get("p95_latency_s"),
                error_rate=attrs.get("error_rate", 0.0),
                infeasible_reason=attrs.get("infeasible_reason"),
                probe_s=0.0,
                wall_s=0.0,
                pruned_reason=attrs.get("pruned_reason"),
                min_p95_latency_s=attrs.get("min_p95_latency_s"),
                min_p95_ttft_s=attrs.get("min_p95_ttft_s"),
                min_p99_latency_s=attrs.get("min_p99_latency_s"),
                copied_from=trial.number,
                batch=_batch(attrs),
                loop=_loop(attrs),
            )
    return None


def _value(trial: Any) -> float:
    return float(trial.values[0]) if trial.values else 0.0


def _best(done: list[Any]) -> Incumbent | None:
    """The best complete feasible trial: its value, best measured parallelism, points."""
    feasible = [
        t
        for t in done
        if t.state.name == "COMPLETE" and is_feasible(t) and t.user_attrs.get("curve")
    ]
    if not feasible:
        return None
    best = max(feasible, key=_value)
    attrs = best.user_attrs
    return Incumbent(
        _value(best),
        int(attrs["curve"]["best_measured_parallelism"]),
        [CurvePoint.from_dict(point) for point in attrs["points"]],
        level=attrs["curve"].get("server_ceiling") is not None,
    )


STARTUP_TRIALS = 5  # after the seeded first trial; pruning keeps the poor ones cheap


def startup_trials(study: Study) -> int:
    """Random trials before TPE models the space (patience does not count them)."""
    return min(STARTUP_TRIALS, study.budget.trials)


def _stalled(done: list[Any], patience: int, startup: int) -> bool:
    """No 1% gain over the best in the last `patience` trials after the random start."""
    if len(done) < startup + patience:
        return False
    values = [_value(t) if is_feasible(t) else 0.0 for t in done]
    before = max(values[:-patience], default=0.0)
    return max(values[-patience:]) <= before * (1 + IMPROVEMENT)


def trial_records(optuna_study: Any) -> list[TrialRecord]:
    """Every finished, pruned or failed trial, as sweep.json saves it (a pruned trial's
    value is the best it measured before it was stopped; a copy's, its original's)."""
    records: list[TrialRecord] = []
    values: dict[int, float | None] = {}
    for trial in optuna_study.get_trials(deepcopy=False):
        if trial.state.name not in ("COMPLETE", "PRUNED", "FAIL"):
            continue
        attrs = trial.user_attrs
        complete = trial.state.name == "COMPLETE"
        pruned = trial.state.name == "PRUNED"
        curve = attrs.get("curve")
        copied_from = attrs.get(COPIED)
        value = _value(trial) if complete else None
        if pruned and trial.intermediate_values:
            value = max(trial.intermediate_values.values())
        elif pruned and copied_from is not None:
            value = values.get(copied_from)  # a copy reports no rungs of its own
        values[trial.number] = value
        records.append(
            TrialRecord(
                number=trial.number,
                state=trial.state.name,
                value=value,
                feasible=is_feasible(trial) if complete or pruned else False,
                knobs=attrs.get("knobs", dict(trial.params)),
                points=[CurvePoint.from_dict(point) for point in attrs.get("points", [])],
                curve=CurveSummary.from_dict(curve) if curve else None,
                probe_s=attrs.get("probe_s"),
                wall_s=attrs.get("wall_s"),
                p95_latency_s=attrs.get("p95_latency_s"),
                error_rate=attrs.get("error_rate"),
                infeasible_reason=attrs.get("infeasible_reason"),
                pruned_reason=attrs.get("pruned_reason"),
                roofline_output_tokens_per_s=attrs.get("roofline_output_tokens_per_s"),
                roofline_share=attrs.get("roofline_share"),
                batch=_batch(attrs),
                loop=_loop(attrs),
                copied_from=copied_from,
            )
        )
    return records


def _loop(attrs: Mapping[str, Any]) -> LoopSummary | None:
    """A loop trial's RL loop, as _record stored it."""
    saved = attrs.get("loop")
    return LoopSummary.from_dict(saved) if saved else None


def _batch(attrs: Mapping[str, Any]) -> BatchSummary | None:
    """A goodput trial's training steps, as _record stored them."""
    saved = attrs.get("batch")
    return BatchSummary.from_dict(saved) if saved else None


def importances(optuna_study: Any) -> dict[str, float]:
    """Parameter importances (Optuna's default PED-ANOVA, which ranks what leads to *low*
    target values, hence the negated objective); empty when too few feasible trials vary."""
    import optuna

    feasible = [t for t in finished_trials(optuna_study) if is_feasible(t)]
    if len(feasible) < 4 or not feasible[0].params:
        return {}
    try:
        with warnings.catch_warnings():  # it warns whenever a target is given: ours is negated
            warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
            # reused (equivalent) trials can tie: equal importances are then the answer
            warnings.filterwarnings("ignore", message="Target and region quantiles select")
            return dict(
                optuna.importance.get_param_importances(
                    optuna_study, target=lambda t: -(_value(t) if is_feasible(t) else 0.0)
                )
            )
    except (ValueError, RuntimeError):
        return {}


def check_space(study: Study, gpu_count: int) -> None:
    """Refuse a search space the machine cannot run before anything starts."""
    space: Mapping[str, Any] = study.search_space.server_knobs()
    tp = space.get("tensor_parallel_size")
    launched = study.target.engine is not None
    if (
        launched
        and gpu_count
        and study.resources is None
        and isinstance(tp, ChoiceSpace)
        and min(int(c) for c in tp.choices) > gpu_count
    ):
        raise UsageError(
            f"every tensor_parallel_size choice exceeds the {gpu_count} GPU(s) NVML sees; "
            "lower the choices."
        )
    resources = study.resources
    if resources is None:
        return
    if launched and gpu_count and resources.gpus > gpu_count:
        raise UsageError(
            f"resources.gpus is {resources.gpus} but NVML sees {gpu_count} GPU(s) here; "
            "lower resources.gpus or run the sweep where the GPUs are."
        )
    for field, name, found, names in (
        ("gpu", resources.gpu, GPUS.get, GPUS),
        ("model_profile", resources.model_profile, find_model, MODELS),
    ):
        if name is not None and found(name) is None:
            raise UsageError(
                f"resources.{field} {name!r} is not a known profile; name one of "
                f"{', '.join(names)}, or leave it out."
            )
    splits(study)  # raises for a TP the model cannot be sharded over, or none that fits
    if study.prior is not None:
        check_prior(study.prior)


def check_prior(prior: PriorSpec) -> None:
    """The prior's profile and flags as the simulated engine will read them."""
    try:
        SimConfig.from_args(["--profile", str(prior.profile), *prior.args])
    except SimConfigError as error:
        why = str(error).rstrip(".")
        raise UsageError(f"study prior: {why}; fix prior.profile or prior.args.") from None
