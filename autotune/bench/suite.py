"""A benchmark suite: named cases in a YAML file, validated once, before anything runs, by
pydantic specs built from those a study file shares.
An example suite, and why: docs/design/bench.md.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import orjson
import yaml
from pydantic import Discriminator, Field, Strict, Tag, ValidationError, model_validator

from autotune.config.collection import (
    SYNTHETIC,
    CollectConfig,
    ProbeSpec,
    RequestFields,
    ServerFields,
    SyntheticSpec,
    VerifierFields,
    WorkloadSpec,
    collect_config,
    target_config,
)
from autotune.config.fields import (
    Count,
    Count0,
    Share,
    SpecModel,
    Text,
    Tokens,
    Words,
    must_be,
    problem,
    spec_problem,
)
from autotune.config.flags import server_flags
from autotune.config.knobs import ServerArgs
from autotune.errors import UsageError
from autotune.probe import ProbeSettings

MAX_REPETITIONS = 20  # the exact test takes at most 40 values in all (stats.MAX_EXACT_SAMPLES)
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

Repetitions = Annotated[
    int,
    Strict(),
    Field(ge=1, le=MAX_REPETITIONS),
    must_be(f"a whole number of at least 1 and at most {MAX_REPETITIONS}"),
]
CaseName = Annotated[
    str,
    Strict(),
    Field(pattern=f"^{NAME}$"),
    must_be("letters, digits, '.', '_' or '-' (starting with a letter or digit)"),
]
Requests = Annotated[int, Strict(), Field(ge=100), must_be("a whole number of at least 100")]
ExtraBody = Annotated[dict[str, Any], must_be("a mapping of extra request fields")]


# -- the file ------------------------------------------------------------------------------


class CaseTarget(RequestFields, ServerFields):
    """The server of a probe case: at base_url, launched on {port}, or the simulator."""

    what: ClassVar[str] = "a target"
    launch: Words | None = None  # a command serving on {port}, started for the case
    sim_args: Words = ()  # flags of the embedded simulator (neither base_url nor launch)
    extra_body: ExtraBody = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_server(self) -> CaseTarget:
        launch = list(self.launch) if self.launch is not None else None
        if self.base_url and launch is not None:
            expected = "absent when base_url is given (one server per case)"
            raise problem(expected, launch, "launch")
        if self.sim_args and (self.base_url or launch is not None):
            expected = "absent unless the case runs on the embedded simulator"
            raise problem(expected, list(self.sim_args), "sim_args")
        if launch is not None and not any("{port}" in part for part in launch):
            raise problem("a command with {port} where the server's port goes", launch, "launch")
        return self


class CaseWorkload(SpecModel):
    """The tasks: a JSONL file (relative to the suite), else synthetic ones."""

    what: ClassVar[str] = "a workload"
    input: Text | None = None
    # A study's workload.synthetic, flat: its fields' types and defaults.
    synthetic: Count = SYNTHETIC.num_tasks  # the number of synthetic tasks
    prompt_tokens: Tokens = SYNTHETIC.prompt_tokens
    output_tokens: Tokens = SYNTHETIC.output_tokens
    seed: Count0 = SYNTHETIC.seed
    limit: Count0 | None = None


class _CaseSpec(SpecModel):
    name: CaseName
    kind: str
    repetitions: Repetitions | None = None  # None: the suite's
    warmup: Count0 | None = None
    threshold: Share | None = None


class ProbeCaseSpec(VerifierFields, _CaseSpec):
    what: ClassVar[str] = "a probe case"
    kind: Literal["probe"] = "probe"
    recommendation: Text | None = None  # a recommendation.json from `autotune sweep`
    parallelism: Count | None = None  # None: the recommendation's
    server_args: ServerArgs | None = None  # None: the recommendation's
    target: CaseTarget = CaseTarget()
    workload: CaseWorkload = CaseWorkload()
    probe: ProbeSpec = ProbeSpec()


class OverheadCaseSpec(_CaseSpec):
    what: ClassVar[str] = "an overhead case"
    kind: Literal["overhead"]
    concurrency: Count = 64
    requests: Requests = 10_000


def _kind(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "probe"  # (reported as a probe case that is not a mapping)
    kind = entry.get("kind", "probe")
    return kind if isinstance(kind, str) else None


CaseSpec = Annotated[
    Annotated[ProbeCaseSpec, Tag("probe")] | Annotated[OverheadCaseSpec, Tag("overhead")],
    Discriminator(_kind),
]


class SuiteSpec(SpecModel):
    what: ClassVar[str] = "a suite"
    repetitions: Repetitions = 5  # measured repetitions of each case
    warmup: Count0 = 1  # repetitions run first and thrown away
    threshold: Share = 0.05  # a larger (and significant) fall of the median is a regression
    alpha: Share = 0.01  # significance level of the exact Mann-Whitney U test
    cases: Annotated[
        list[CaseSpec], Field(min_length=1), must_be("a list of at least one case", inner=False)
    ]


# -- what the runner measures --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeCase:
    """Steady-state probes of one workload at one parallelism against one server."""

    kind: ClassVar[str] = "probe"
    name: str
    collect: CollectConfig  # target, workload, verifier, parallelism
    probe: ProbeSettings
    launch: tuple[str, ...] | None  # a command serving on {port}, started for the case
    startup_timeout_s: float
    recommendation: str | None
    repetitions: int
    warmup: int
    threshold: float

    def settings(self) -> dict[str, Any]:
        """The configuration under test, recorded with the results (never secrets)."""
        c, t = self.collect, self.collect.target
        workload: dict[str, Any] = (
            {"input": str(c.input), "limit": c.limit}
            if c.input is not None
            else {"synthetic": asdict(c.synthetic)}
        )
        return {
            "parallelism": c.parallelism,
            "verifier": c.verifier,
            "verifier_workers": c.verifier_workers,
            "verifier_cost_ms": c.verifier_cost_ms,
            "base_url": t.base_url,
            "launch": list(self.launch) if self.launch else None,
            "sim_args": list(t.sim_args),
            "model": t.model,
            "api": t.api,
            "stream": t.stream,
            "extra_body": t.extra_body,
            "workload": workload,
            "probe": asdict(self.probe),
            "recommendation": self.recommendation,
        }


@dataclass(frozen=True, slots=True)
class OverheadCase:
    """The engine against a bare aiohttp loop on the null server: their ratio."""

    kind: ClassVar[str] = "overhead"
    name: str
    concurrency: int
    requests: int
    repetitions: int
    warmup: int
    threshold: float

    def settings(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "requests": self.requests}


Case = ProbeCase | OverheadCase


@dataclass(frozen=True, slots=True)
class Suite:
    path: Path
    alpha: float
    cases: tuple[Case, ...]

    def select(
        self,
        names: list[str] | None = None,
        repetitions: int | None = None,
        warmup: int | None = None,
    ) -> Suite:
        """Only the named cases (all without names), with repetitions/warm-up overridden."""
        known = [case.name for case in self.cases]
        for name in names or ():
            if name not in known:
                raise UsageError(
                    f"--case {name!r} is not in {self.path}; its cases are {', '.join(known)}."
                )
        if repetitions is not None and not 1 <= repetitions <= MAX_REPETITIONS:
            raise UsageError(f"--repetitions must be from 1 to {MAX_REPETITIONS}.")
        if warmup is not None and warmup < 0:
            raise UsageError("--warmup must be zero or more.")
        cases = tuple(
            replace(
                case,
                repetitions=case.repetitions if repetitions is None else repetitions,
                warmup=case.warmup if warmup is None else warmup,
            )
            for case in self.cases
            if not names or case.name in names
        )
        return replace(self, cases=cases)

    def with_launch(self, command: str) -> Suite:
        """Every probe case against the server `command` starts (`{port}` where the port
        goes), in place of its own target; overhead cases, which use no server, are left
        out. How `bench ab --baseline-cmd/--candidate-cmd` A/Bs two servers."""
        try:
            argv = tuple(shlex.split(command))
        except ValueError as error:
            raise UsageError(
                f"the server command cannot be split ({error}); check its quotes."
            ) from None
        if not argv or "{port}" not in command:
            raise UsageError(
                "the server command needs {port} where its port goes, e.g. "
                "'python -m autotune.servers.sim --max-num-seqs 64 --port {port}'."
            )
        cases = tuple(
            replace(
                case,
                launch=argv,
                collect=replace(case.collect, target=replace(case.collect.target, base_url=None)),
            )
            for case in self.cases
            if isinstance(case, ProbeCase)
        )
        if not cases:
            raise UsageError(f"{self.path} has no probe case to run against a server command.")
        return replace(self, cases=cases)


def load_suite(path: Path) -> Suite:
    """Read and validate a suite file; UsageError, one sentence naming the field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist; pass a suite YAML file.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {path} ({error}).") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{path} is not valid YAML ({' '.join(str(error).split())}).") from None
    try:
        spec = SuiteSpec.model_validate(data)
    except ValidationError as error:
        raise UsageError(f"{path}: {spec_problem(SuiteSpec, error)}.") from None
    cases = tuple(_case(c, f"cases[{i}]", path, spec) for i, c in enumerate(spec.cases))
    names = [case.name for case in cases]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"{path}: two cases are named {name!r}; give each its own name.")
    return Suite(path, spec.alpha, cases)


def _fail(path: Path, where: str, expected: str, value: Any) -> UsageError:
    return UsageError(f"{path}: {where} must be {expected}, not {value!r}.")


def _case(spec: ProbeCaseSpec | OverheadCaseSpec, where: str, path: Path, suite: SuiteSpec) -> Case:
    repetitions = suite.repetitions if spec.repetitions is None else spec.repetitions
    warmup = suite.warmup if spec.warmup is None else spec.warmup
    threshold = suite.threshold if spec.threshold is None else spec.threshold
    if isinstance(spec, OverheadCaseSpec):
        return OverheadCase(
            spec.name, spec.concurrency, spec.requests, repetitions, warmup, threshold
        )
    base = path.parent
    rec_path = spec.recommendation
    rec_parallelism, rec_server_args = _recommendation(base / rec_path) if rec_path else (None, {})
    parallelism = rec_parallelism if spec.parallelism is None else spec.parallelism
    if parallelism is None:
        expected = "a whole number of at least 1 (or come from a recommendation)"
        raise _fail(path, f"{where}.parallelism", expected, None)
    server_args = rec_server_args if spec.server_args is None else spec.server_args
    flags = tuple(server_flags(server_args))

    t = spec.target
    if t.base_url and flags:
        expected = "absent for a server at a base_url (autotune cannot set them)"
        raise _fail(path, f"{where}.server_args", expected, flags)
    embedded = not (t.base_url or t.launch is not None)
    target = target_config(
        t, t, extra_body=dict(t.extra_body), sim_args=(*t.sim_args, *flags) if embedded else ()
    )

    w = spec.workload
    task_file = base / w.input if w.input else None
    if task_file is not None and not task_file.is_file():
        expected = "a task JSONL file (relative to the suite)"
        raise _fail(path, f"{where}.workload.input", expected, w.input)
    synthetic = SyntheticSpec(
        num_tasks=w.synthetic,
        prompt_tokens=w.prompt_tokens,
        output_tokens=w.output_tokens,
        seed=w.seed,
    )
    workload = WorkloadSpec(
        input=task_file,
        synthetic=synthetic,
        limit=w.limit,
        **spec.model_dump(include=set(VerifierFields.model_fields)),
    )
    collect = collect_config(workload, target, parallelism=parallelism, progress=False)
    launch = (*t.launch, *flags) if t.launch is not None else None
    return ProbeCase(
        spec.name, collect, ProbeSettings.of(spec.probe, parallelism), launch,
        t.startup_timeout_s, rec_path, repetitions, warmup, threshold,
    )  # fmt: skip


def _recommendation(path: Path) -> tuple[int, dict[str, Any]]:
    """(parallelism, server knobs) from the recommendation.json `autotune sweep` writes:
    `recommended.parallelism` and `server` ({"max_num_seqs": 64, ...})."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"the recommendation {path} does not exist.") from None
    except orjson.JSONDecodeError as error:
        raise UsageError(f"the recommendation {path} is not valid JSON ({error}).") from None
    recommended = data.get("recommended") if isinstance(data, dict) else None
    parallelism = recommended.get("parallelism") if isinstance(recommended, dict) else None
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise UsageError(
            f"the recommendation {path} has no recommended.parallelism; pass the "
            "recommendation.json that `autotune sweep` wrote."
        )
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise UsageError(f"the recommendation {path} has a server field that is not a mapping.")
    return parallelism, server
