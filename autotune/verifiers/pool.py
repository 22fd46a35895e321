"""Process-pool verifiers: code execution, the synthetic CPU burner, user callables.
A script that uses them must keep its top-level code under `if __name__ == "__main__":`.
Why: docs/design/verifiers.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib
import importlib.util
import math
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from autotune.errors import UsageError
from autotune.processes.lifeline import forkserver_context
from autotune.results.responses import response_text

if sys.platform != "win32":
    import resource

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    from autotune.verifiers import VerifierOptions

UNIT_TEST_TIMEOUT_S = 6.0  # LiveCodeBench's per-test default; capped by options.timeout_s
_SHUTDOWN_GRACE_S = 0.5  # idle workers exit on their own within this; busy ones are killed


def default_workers() -> int:
    """CPUs this process may use (respects taskset/cgroup pinning where the OS says)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _mp_context() -> BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        return forkserver_context()  # its workers die with autotune, even on kill -9
    return multiprocessing.get_context("spawn")


class PoolVerifier:
    """Base: owns the executor; subclasses say which worker function a row goes to."""

    name: str
    capacity: int | None

    def __init__(
        self,
        name: str,
        workers: int,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        self.name = name
        self.capacity = workers
        self._workers = workers
        self._initializer = initializer
        self._initargs = initargs
        self._executor: ProcessPoolExecutor | None = None
        self._calls: dict[ProcessPoolExecutor, int] = {}  # calls awaiting each pool
        self._retired: set[ProcessPoolExecutor] = set()  # stuck or broken: kill once idle
        self._killing: set[asyncio.Task[None]] = set()
        self._warming: asyncio.Future[list[Any]] | None = None  # a fresh pool's start-up
        self._closed = False

    def _pool(self) -> ProcessPoolExecutor:
        if self._closed:
            raise RuntimeError(f"verifier {self.name!r} is closed")
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self._workers,
                mp_context=_mp_context(),
                initializer=_init_worker,
                initargs=(self._initializer, self._initargs),
            )
        return self._executor

    async def start(self) -> None:
        """Start every worker now (they would otherwise start lazily, one per call)."""
        loop = asyncio.get_running_loop()
        pool = self._pool()
        # Each submit finds no idle worker yet, so each spawns one; the short sleep
        # keeps the first from going idle before the last is submitted.
        calls = [loop.run_in_executor(pool, _warm_up, 0.05) for _ in range(self._workers)]
        try:
            await asyncio.gather(*calls)
        except BrokenProcessPool as exc:
            await self.aclose()
            raise UsageError(
                f"verifier {self.name!r}: its worker processes failed to start ({exc}); "
                "check that the verifier imports cleanly in a fresh Python process and that "
                "a script using autotune keeps its top-level code under "
                "`if __name__ == '__main__':`."
            ) from exc
        except BaseException:
            # Stopped while starting (a Ctrl-C, say): no caller holds the pool yet to close
            # it, and a pool left open races concurrent.futures' exit hook over its pipes.
            await self.aclose()
            raise

    async def _run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """`fn(*args)` in a worker; TimeoutError after `timeout_s` (None: no limit)."""
        if self._warming is not None and not self._warming.done():
            # A failed start-up breaks the pool: the call below then meets it and retires it.
            await asyncio.wait([self._warming])
        pool = self._pool()
        self._calls[pool] = self._calls.get(pool, 0) + 1
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except TimeoutError:
            if not deadline.expired():
                raise  # the user's function raised it: its worker is fine
            self._retire(pool)
            raise TimeoutError(
                f"verifier {self.name!r} took longer than {timeout_s:g} s (--verifier-timeout); "
                "its worker was replaced"
            ) from None
        except BrokenProcessPool:
            # A worker died (segfault, os._exit, OOM kill): this call fails, the next
            # one gets a fresh pool instead of the same error forever.
            self._retire(pool)
            raise
        finally:
            self._calls[pool] -= 1
            if pool in self._retired and not self._calls[pool]:
                self._kill(pool)

    def _retire(self, pool: ProcessPoolExecutor) -> None:
        """Send later calls to a fresh, warmed pool; `pool` dies once its calls end."""
        if self._closed:
            return  # aclose stops every pool
        self._retired.add(pool)
        if self._executor is pool:
            self._executor = None
            fresh = self._pool()
            loop = asyncio.get_running_loop()
            self._warming = asyncio.gather(
                *(loop.run_in_executor(fresh, _warm_up, 0.05) for _ in range(self._workers)),
                return_exceptions=True,
            )

    def _kill(self, pool: ProcessPoolExecutor) -> None:
        self._retired.discard(pool)
        del self._calls[pool]
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(_shutdown, pool))
        self._killing.add(task)
        task.add_done_callback(self._killing.discard)

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Stop the pool: cancel queued calls, let idle workers exit, kill busy ones."""
        if self._closed:
            return
        self._closed = True
        pools = [*self._retired, *([self._executor] if self._executor is not None else [])]
        self._executor = None
        self._retired.clear()
        await asyncio.gather(
            *(asyncio.to_thread(_shutdown, pool) for pool in pools), *self._killing
        )


def _shutdown(pool: ProcessPoolExecutor) -> None:
    """Shut `pool` down without waiting on a worker stuck in user code.

    The pool's manager thread is joined at the end: the first `shutdown(wait=False)`
    forgets it, and one still closing its wake-up pipe when the interpreter exits races
    concurrent.futures' exit hook, which then writes to the closed pipe ("Exception
    ignored ... Bad file descriptor" after a Ctrl-C or SIGTERM).
    """
    processes = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + _SHUTDOWN_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(0.5)
        if process.is_alive():
            process.kill()
            process.join(0.5)
    pool.shutdown(wait=True)
    if manager is not None:
        manager.join(_SHUTDOWN_GRACE_S)


def _init_worker(initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    """Every worker's initializer: ignore SIGINT, then run the verifier's own, if any."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def _warm_up(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


# --- synthetic ---------------------------------------------------------------------


def synthetic_reward(text: str, expected: Any = None) -> float:
    """1.0 when the text ends in `\\boxed{<expected>}`, 0.0 when in another boxed answer
    (the simulated policy answers so: servers/sim/policy.py); otherwise 0.0 or 1.0 fixed
    by the text (crc32: the same in every process, unlike hash())."""
    if expected is not None and text.endswith("}"):
        start = text.rfind("\\boxed{", max(0, len(text) - 64))
        if start >= 0:
            return 1.0 if text[start + 7 : -1] == str(expected) else 0.0
    return float(zlib.crc32(text.encode("utf-8", "surrogatepass")) & 1)


def burn_cpu(seconds: float) -> None:
    """Spin for `seconds` of this thread's CPU time: a real load, unlike sleep()."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _synthetic_in_worker(text: str, expected: Any, seconds: float) -> dict[str, Any]:
    burn_cpu(seconds)
    return {"reward": synthetic_reward(text, expected)}


class SyntheticVerifier(PoolVerifier):
    """The embedded default's verifier: `cost_ms` of real CPU per rollout, hashed reward.

    With cost_ms == 0 it is inline (capacity None) and measures nothing but the engine;
    otherwise it occupies a pool worker per rollout, so it can be the bottleneck.
    """

    def __init__(self, options: VerifierOptions) -> None:
        super().__init__("synthetic", options.workers or default_workers())
        self._seconds = options.cost_ms / 1000.0
        if self._seconds <= 0:
            self.capacity = None

    async def start(self) -> None:
        if self.capacity is not None:
            await super().start()

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        text = response_text(row.get("response"))
        expected = row.get("expected_answer")
        if self.capacity is None:
            return {"reward": synthetic_reward(text, expected)}
        result: dict[str, Any] = await self._run(
            _synthetic_in_worker, text, expected, self._seconds
        )
        return result


# --- code (NeMo Gym code_gen) ------------------------------------------------------


class CodeVerifier(PoolVerifier):
    """NeMo Gym code_gen: run the answer's last ```python block against its unit tests.

    Each test is a fresh `python -I` subprocess (stdin in, stdout compared line by line
    after stripping, numbers by Decimal value) with a per-test timeout; the first
    failing test ends the run, as in NeMo Gym. Fields added, as in code_gen rollouts:
    `extracted_model_output` (the whole answer text), `extracted_model_code`,
    `result` (True pass, -2 wrong answer, -3 timeout, -4 runtime error) and `metadata`
    (failure details, or {"execution time": s} when all pass). As in NeMo Gym there is
    no sandbox beyond a temporary working directory and a CPU-time limit: run it only
    where model-written code may run.
    """

    def __init__(self, options: VerifierOptions) -> None:
        super().__init__("code", options.workers or default_workers())
        self._test_timeout_s = min(UNIT_TEST_TIMEOUT_S, options.timeout_s)

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        text = response_text(row.get("response"))
        metadata = row.get("verifier_metadata")
        result: dict[str, Any] = await self._run(
            run_unit_tests, text, metadata, self._test_timeout_s
        )
        return result


def extract_code(text: str) -> str | None:
    """The last ```python (or ```py) fenced block; else the last fenced block; else None."""
    blocks: list[tuple[str, str]] = []
    lines = text.split("\n")
    opening: int | None = None
    language = ""
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("```"):
            continue
        if opening is None:
            opening, language = index, stripped[3:].strip().lower()
        else:
            blocks.append((language, "\n".join(lines[opening + 1 : index])))
            opening = None
    for language, code in reversed(blocks):
        if language in ("python", "python3", "py"):
            return code
    return blocks[-1][1] if blocks else None


def _unit_tests(metadata: Any) -> tuple[list[str], list[str]]:
    """(inputs, outputs) from `verifier_metadata` (a dict, or a JSON string of one)."""
    if isinstance(metadata, str):
        metadata = orjson.loads(metadata)
    tests = (metadata or {}).get("unit_tests") if isinstance(metadata, dict) else None
    if isinstance(tests, str):
        tests = orjson.loads(tests)
    if isinstance(tests, dict) and "packed" in tests:  # NeMo Gym's compressed form
        unpacked = orjson.loads(zlib.decompress(base64.b64decode(tests["packed"])))
        tests = {**unpacked, "fn_name": tests.get("fn_name")}
    if not isinstance(tests, dict) or not tests.get("inputs"):
        raise ValueError("the row has no verifier_metadata.unit_tests with inputs and outputs")
    if tests.get("fn_name"):
        raise ValueError("call-based unit tests (fn_name) are not supported; only stdin/stdout")
    inputs, outputs = tests["inputs"], tests.get("outputs") or []
    if len(inputs) != len(outputs):
        raise ValueError(f"unit_tests has {len(inputs)} inputs but {len(outputs)} outputs")
    return [str(i) for i in inputs], [str(o) for o in outputs]


def _truncate(value: str, length: int = 300) -> str:
    if len(value) <= length:
        return value
    return value[: length // 2] + "...(truncated) ..." + value[-length // 2 :]


def _output_lines(value: str) -> list[str]:
    return [line.strip() for line in value.strip().split("\n")]


def _as_decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(item) for item in line.split()]
    except InvalidOperation:
        return None


def compare_output(output: str, expected: str) -> str | None:
    """None when `output` matches `expected`, else NeMo Gym's wrong-answer message."""
    got, want = _output_lines(output), _output_lines(expected)
    if len(got) != len(want):
        return "Wrong answer: mismatched output length"
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a == b:
            continue
        da, db = _as_decimals(a), _as_decimals(b)
        if da is None or db is None or da != db:
            return f"Wrong answer at output_line_idx={index}: {_truncate(a)} != {_truncate(b)}"
    return None


def _limit_cpu(seconds: float) -> Callable[[], None]:
    """A pre-exec hook capping the test's CPU time, so no orphan outlives a killed worker."""

    def apply() -> None:
        limit = math.ceil(seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
        # The worker ignores SIGINT and exec keeps an ignored signal ignored: let Ctrl-C
        # stop the test program as it would any child.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return apply


def run_unit_tests(text: str, metadata: Any, timeout_s: float) -> dict[str, Any]:
    """Runs in a pool worker: extract the code, run each test in a subprocess, grade."""
    if not text.strip():
        return {
            "reward": 0.0,
            "extracted_model_output": None,
            "extracted_model_code": None,
            "result": None,
            "metadata": None,
        }
    code = extract_code(text)
    if not code:
        return {
            "reward": 0.0,
            "extracted_model_output": text,
            "extracted_model_code": None,
            "result": None,
            "metadata": None,
        }
    inputs, outputs = _unit_tests(metadata)
    results: list[bool | int] = []
    details: dict[str, Any] | None = None
    elapsed = 0.0
    preexec = _limit_cpu(timeout_s) if sys.platform != "win32" else None
    with tempfile.TemporaryDirectory(prefix="autotune-code-") as workdir:
        script = Path(workdir, "solution.py")
        script.write_text(code, encoding="utf-8")
        for test_input, expected in zip(inputs, outputs, strict=True):
            failure = {"inputs": _truncate(test_input), "expected": _truncate(expected)}
            started = time.perf_counter()
            try:
                done = subprocess.run(
                    [sys.executable, "-I", "-X", "utf8", str(script)],
                    input=test_input,
                    capture_output=True,
                    text=True,
                    encoding="utf-8",
                    errors="replace",
                    timeout=timeout_s,
                    cwd=workdir,
                    preexec_fn=preexec,  # safe: pool workers are single-threaded
                )
            except subprocess.TimeoutExpired:
                results.append(-3)
                details = {
                    "error": f"TimeoutExpired({timeout_s:g} s)",
                    "error_code": -3,
                    "error_message": "Time Limit Exceeded",
                    **failure,
                }
                break
            elapsed += time.perf_counter() - started
            crashed = done.returncode < 0 or "Traceback (most recent call last)" in done.stderr
            if crashed:
                lines = done.stderr.strip().splitlines()
                results.append(-4)
                details = {
                    "output": _truncate(done.stdout),
                    "error": lines[-1] if lines else f"exit status {done.returncode}",
                    "error_code": -4,
                    "error_message": "Runtime Error",
                    **failure,
                    "traceback": _truncate(done.stderr, 2000),
                }
                break
            message = compare_output(done.stdout, expected)
            if message is not None:
                results.append(-2)
                details = {
                    "output": _truncate(done.stdout),
                    **failure,
                    "error_code": -2,
                    "error_message": message,
                }
                break
            results.append(True)
    passed = details is None and len(results) == len(inputs)
    return {
        "reward": 1.0 if passed else 0.0,
        "extracted_model_output": text,
        "extracted_model_code": code,
        "result": results,
        "metadata": details if details is not None else {"execution time": elapsed},
    }


# --- user callables ----------------------------------------------------------------

_user_function: Callable[[dict[str, Any]], Any] | None = None


def _module_name_for(path: Path) -> str:
    """A stable, unique module name for a file, the same in the parent and the workers.

    The parent imports the file under this name too, so an exception class defined in
    the file unpickles in the parent when a worker raises it.
    """
    digest = hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:12]
    return f"autotune_user_verifier_{path.stem}_{digest}"


def _import_target(location: str, attribute: str, is_file: bool) -> Any:
    """The named attribute, importing its file (by path) or module (by dotted name)."""
    if is_file:
        path = Path(location)
        name = _module_name_for(path)
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            added = str(path.parent) not in sys.path
            if added:  # so the file can import its neighbours
                sys.path.insert(0, str(path.parent))
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
    else:
        if os.getcwd() not in sys.path:  # `mypkg.score:fn` resolves from the working dir
            sys.path.append(os.getcwd())
        module = importlib.import_module(location)
    return getattr(module, attribute)


def _init_user_worker(location: str, attribute: str, is_file: bool, cwd: str) -> None:
    global _user_function
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    _user_function = _import_target(location, attribute, is_file)


def _call_user(row: dict[str, Any]) -> dict[str, Any]:
    """Runs in a worker: call the user's function, normalise its answer to a dict."""
    assert _user_function is not None, "worker initializer did not run"
    try:
        value = _user_function(row)
    except BaseException as exc:
        if isinstance(exc, Exception) and _pickles(exc):
            raise
        # The parent could not rebuild this exception (a failed unpickle breaks the
        # whole pool), or it is a SystemExit or KeyboardInterrupt (never Ctrl-C: workers
        # ignore SIGINT) that must not end the parent: send one it can handle, keeping
        # the class name in the text.
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
    if isinstance(value, dict):
        if "reward" not in value:
            raise TypeError("the verifier function returned a dict without a 'reward' key")
        reward = value["reward"]
        return {**value, "reward": None if reward is None else float(reward)}
    if isinstance(value, int | float):
        return {"reward": float(value)}
    raise TypeError(
        f"the verifier function returned {type(value).__name__}; "
        "return a float or a dict with 'reward'"
    )


def _pickles(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True


class CallableVerifier(PoolVerifier):
    """A user function `path/to/file.py:fn` or `package.module:fn`, run in a pool.

    The function gets the row dict and returns a float or a dict with `reward`. Its
    exceptions reach the caller with their own class. Each call is bounded by
    `options.timeout_s` (TimeoutError); the worker of a call that never returns is
    killed and replaced (see the module's docstring), so later calls still run.
    """

    def __init__(
        self, spec: str, location: str, attribute: str, is_file: bool, options: VerifierOptions
    ) -> None:
        super().__init__(
            spec,
            options.workers or default_workers(),
            initializer=_init_user_worker,
            initargs=(location, attribute, is_file, os.getcwd()),
        )
        self._timeout_s = options.timeout_s

    @classmethod
    def from_spec(cls, spec: str, options: VerifierOptions) -> CallableVerifier:
        """Validate `spec` in this process (file, import, attribute, callable) or raise."""
        location, _, attribute = spec.rpartition(":")
        location, attribute = location.strip(), attribute.strip()
        if not location or not attribute or not attribute.isidentifier():
            raise UsageError(
                f"verifier {spec!r}: write it as path/to/file.py:function or "
                "package.module:function, with a function name after the colon."
            )
        is_file = location.endswith(".py") or "/" in location or os.sep in location
        if is_file:
            path = Path(location).expanduser().resolve()
            where = location
            if not path.is_file():
                raise UsageError(
                    f"verifier {spec!r}: {location} does not exist; "
                    "check the path before the colon."
                )
            location = str(path)
        else:
            where = f"module {location}"
        try:
            target = _import_target(location, attribute, is_file)
        except AttributeError:
            raise UsageError(
                f"verifier {spec!r}: {where} has no function {attribute!r}; "
                "check the name after the colon."
            ) from None
        except ModuleNotFoundError as exc:
            if is_file:
                cause = f"importing {where} failed ({exc})"
            else:
                cause = f"{where} cannot be imported ({exc})"
            raise UsageError(
                f"verifier {spec!r}: {cause}; check the module path or install what it needs."
            ) from None
        except (Exception, SystemExit) as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise UsageError(
                f"verifier {spec!r}: importing {where} failed with "
                f"{type(exc).__name__}: {first_line}; fix the error in that file."
            ) from None
        if not callable(target):
            raise UsageError(
                f"verifier {spec!r}: {attribute!r} in {where} is not a function but a "
                f"{type(target).__name__} value; point the name after the colon at a function."
            )
        return cls(spec, location, attribute, is_file, options)

    async def verify(self, row: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(_call_user, row, timeout_s=self._timeout_s)
        return result
