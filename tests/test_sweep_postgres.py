"""`autotune sweep --storage postgresql://…` on a real PostgreSQL server: two workers share
one study, a SIGKILLed worker's trial is failed through heartbeats, workers that start at
once on a new database all get in, and no password reaches the saved results.

The server is a throwaway cluster that the `postgres` fixture creates in a temp dir
(`initdb`, `pg_ctl`) and removes afterwards: tests start what they need. Host connections
use scram-sha-256 with a password, so the URL's password is really checked.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from autotune.sweep.search import GRACE_PERIOD_S
from tests.helpers import REPO, free_port
from tests.test_sweep import servers_alive, write_study

PASSWORD = "pw-never-logged-7f3a"
USER = "postgres"


@dataclass(frozen=True, slots=True)
class Postgres:
    """A running throwaway cluster on 127.0.0.1."""

    port: int

    def url(self, database: str, password: str = PASSWORD) -> str:
        return f"postgresql+psycopg2://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> Any:
        import psycopg2

        connection = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname=database
        )
        connection.autocommit = True
        return connection

    def query(self, database: str, sql: str) -> list[tuple[Any, ...]]:
        connection = self.connect(database)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchall())
        finally:
            connection.close()


def _unavailable(reason: str) -> None:
    """Skip on a developer's machine; in CI (which installs PostgreSQL) it is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must install it: see .ci/run)")
    pytest.skip(reason)


def _bindir() -> Path | None:
    """Debian keeps initdb and pg_ctl in /usr/lib/postgresql/N/bin, not on PATH."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(Path(found.stdout.strip()))
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _as_owner(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: there, run it as the `postgres` system user."""
    return ["runuser", "-u", USER, "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(_as_owner(command), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done


def _server_owner() -> pwd.struct_passwd | None:
    """The `postgres` system user when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        _unavailable("there is no `postgres` system user to run PostgreSQL as")
        raise


def _initdb(bindir: Path, base: Path, owner: pwd.struct_passwd | None) -> Path:
    """A new cluster in base/data: trust on the socket, scram-sha-256 with PASSWORD on TCP."""
    password_file = base / "password"
    password_file.write_text(PASSWORD + "\n")
    if owner is not None:
        os.chown(password_file, owner.pw_uid, owner.pw_gid)
    data = base / "data"
    auth = [f"--pwfile={password_file}", "--auth-local=trust", "--auth-host=scram-sha-256"]
    initdb = [str(bindir / "initdb"), "--pgdata", str(data), "--username", USER, *auth]
    _run([*initdb, "--encoding=UTF8", "--locale=C", "--no-sync"], "initdb")
    return data


def _start(bindir: Path, data: Path, base: Path) -> int | None:
    """Starts the cluster on a free 127.0.0.1 port; None if another process took that port."""
    port = free_port()
    log = base / "server.log"
    # Durability off: a throwaway server, and the tests are about correctness, not crashes.
    options = (
        f"-p {port} -c listen_addresses=127.0.0.1 -k {base} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    command = [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60"]
    start = subprocess.run(
        _as_owner([*command, "-o", options, "start"]), capture_output=True, text=True, timeout=90
    )
    if start.returncode == 0:
        return port
    text = log.read_text() if log.exists() else ""
    if "could not bind" in text or "already in use" in text:
        return None
    raise RuntimeError(f"pg_ctl start failed: {start.stderr}\n{text[-2000:]}")


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A fresh cluster in a temp dir (its socket there too), stopped and removed afterwards."""
    bindir = _bindir()
    if bindir is None:
        _unavailable("PostgreSQL is not installed (apt-get install postgresql)")
    assert bindir is not None
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _unavailable("psycopg2 is not installed (pip install -e '.[dev]')")
    owner = _server_owner()
    # Not under pytest's tmp_path, which is private to root: the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-", dir="/tmp" if owner else None))
    port = None
    try:
        if owner is not None:
            os.chown(base, owner.pw_uid, owner.pw_gid)
        data = _initdb(bindir, base, owner)
        for _attempt in range(3):  # a free port can be taken before the server binds it
            port = _start(bindir, data, base)
            if port is not None:
                break
        assert port is not None, "PostgreSQL found no free port in three tries"
        yield Postgres(port)
    finally:
        if port is not None:
            _run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], "stop")
        shutil.rmtree(base, ignore_errors=True)


def _create_database(postgres: Postgres) -> str:
    name = f"study_{uuid.uuid4().hex[:12]}"
    connection = postgres.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
    finally:
        connection.close()
    return name


@pytest.fixture
def database(postgres: Postgres) -> str:
    """An empty database per test: Optuna creates its tables, as on a new server."""
    return _create_database(postgres)


def start_worker(study: Path, url: str, directory: Path) -> tuple[subprocess.Popen[str], Path]:
    """`autotune sweep STUDY --storage URL` in the background (its study is named `shared`),
    output to directory/log."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "worker.log"
    log: IO[str] = log_path.open("w")
    dirs = ["--studies-dir", str(directory / "studies"), "--output-dir", str(directory / "shared")]
    process = subprocess.Popen(  # not --quiet: its `trial N:` lines say which trials it ran
        [sys.executable, "-m", "autotune", "sweep", str(study), "--storage", url, *dirs],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log.close()  # the child holds its own copy
    return process, log_path


def finish(process: subprocess.Popen[str], log: Path, timeout: float = 150) -> str:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"worker still running after {timeout} s:\n{log.read_text()[-3000:]}")
    return log.read_text()


def trials_run(output: str) -> set[int]:
    """The trial numbers a worker ran itself (its `trial N: …` lines)."""
    return {int(n) for n in re.findall(r"^trial (\d+): ", output, flags=re.MULTILINE)}


def load(url: str, name: str) -> Any:
    """The study as a plain reader sees it (no heartbeats, no sampler)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=url)


def fast_study(tmp_path: Path, name: str, marker: str, trials: int) -> Path:
    """Three probes a trial (parallelism 4, 8, 16), about a second each."""
    return write_study(
        tmp_path,
        name,
        marker,
        search_space={
            "parallelism": {"low": 4, "high": 16},
            "max_num_seqs": {"choices": [8, 32]},
            "max_num_batched_tokens": {"choices": [2048, 8192]},
        },
        probe={"min_s": 0.5, "max_s": 1.5},
        budget={"trials": trials},
    )


def wait_for_servers_to_go(marker: str) -> None:
    deadline = time.monotonic() + 15
    while servers_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert servers_alive(marker) == [], "a simulated server outlived its worker"


def test_two_workers_share_one_study(tmp_path: Path, postgres: Postgres, database: str) -> None:
    from optuna.trial import TrialState

    budget = 4
    marker = f"sim/pg-{uuid.uuid4().hex[:8]}"
    study = fast_study(tmp_path, "shared", marker, budget)
    url = postgres.url(database)
    workers = [start_worker(study, url, tmp_path / f"worker{i}") for i in range(2)]
    outputs = [finish(process, log) for process, log in workers]
    for (process, _), output in zip(workers, outputs, strict=True):
        assert process.returncode == 0, output

    trials = load(url, "shared").get_trials(deepcopy=False)
    complete = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert [t for t in trials if t.state == TrialState.RUNNING] == []
    # Each worker stops once the study holds `budget` finished (complete or pruned)
    # trials that are not copies, so the two may each have started the last one.
    judged = [t for t in complete if "copied_from" not in t.user_attrs]
    assert budget <= len(judged) <= budget + 1, [t.state for t in trials]
    for trial in complete:
        assert {"knobs", "points"} <= trial.user_attrs.keys(), trial.number
    ran = [trials_run(output) for output in outputs]
    assert all(ran), f"a worker ran no trial of its own: {ran}"
    assert not ran[0] & ran[1], "both workers ran the same trial"
    assert ran[0] | ran[1] == {t.number for t in complete}
    for i in range(2):
        saved = json.loads((tmp_path / f"worker{i}" / "shared" / "sweep.json").read_text())
        assert PASSWORD not in json.dumps(saved)
        assert saved["storage"].endswith(f"@127.0.0.1:{postgres.port}/{database}")
    assert servers_alive(marker) == []


def test_killed_workers_trial_fails_through_heartbeats(
    tmp_path: Path, postgres: Postgres, database: str
) -> None:
    from optuna.trial import TrialState

    marker = f"sim/pg-kill-{uuid.uuid4().hex[:8]}"
    study = fast_study(tmp_path, "killed", marker, 1)
    url = postgres.url(database)
    process, log = start_worker(study, url, tmp_path / "killed")
    try:
        _wait_for_a_heartbeat(process, log, postgres, database, marker)
    finally:
        process.kill()  # SIGKILL, mid-trial
        process.wait()
    wait_for_servers_to_go(marker)
    running = load(url, "killed").get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert len(running) == 1
    dead = running[0].number

    # Until the grace period has passed the trial may belong to a live worker: wait it out.
    deadline = time.monotonic() + GRACE_PERIOD_S + 30
    while (age := _heartbeat_age_s(postgres, database)) <= GRACE_PERIOD_S + 1:
        assert time.monotonic() < deadline, f"the heartbeat is {age} s old, and not ageing"
        time.sleep(0.5)

    later, later_log = start_worker(study, url, tmp_path / "later")
    output = finish(later, later_log)
    assert later.returncode == 0, output
    trials = load(url, "killed").get_trials(deepcopy=False)
    assert trials[dead].state == TrialState.FAIL
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 1
    assert servers_alive(marker) == []


def _wait_for_a_heartbeat(
    process: subprocess.Popen[str], log: Path, postgres: Postgres, database: str, marker: str
) -> None:
    """Until the worker's first trial has its server up and its heartbeat recorded."""
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, f"its trial recorded no heartbeat:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no trial started:\n{log.read_text()}"
        if servers_alive(marker):
            exists = "SELECT to_regclass('trial_heartbeats') IS NOT NULL"
            if postgres.query(database, exists)[0][0]:
                count = "SELECT count(*) FROM trial_heartbeats"
                if postgres.query(database, count)[0][0]:
                    return
        time.sleep(0.1)


def _heartbeat_age_s(postgres: Postgres, database: str) -> float:
    """By the server's clock, which also stamped the heartbeat."""
    age = "SELECT extract(epoch FROM now() - max(heartbeat)) FROM trial_heartbeats"
    return float(postgres.query(database, age)[0][0])


OPEN_WHEN_TOLD = """
import sys, time
from pathlib import Path
from autotune.sweep.search import open_study
from autotune.config.study import load_study
study = load_study(Path(sys.argv[1]))
Path(sys.argv[3]).touch()
while not Path(sys.argv[4]).exists():
    time.sleep(0.001)
open_study(study, sys.argv[2])
"""


def test_workers_starting_together_on_a_new_database_all_open_the_study(
    tmp_path: Path, postgres: Postgres
) -> None:
    """What a cluster launcher does: start every worker at once on an empty database."""
    study = write_study(tmp_path, "together", "sim/unused")
    for round_ in range(3):
        url = postgres.url(_create_database(postgres))
        go = tmp_path / f"go{round_}"
        ready = [tmp_path / f"ready{round_}-{i}" for i in range(3)]
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_WHEN_TOLD, str(study), url, str(flag), str(go)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for flag in ready
        ]
        try:
            deadline = time.monotonic() + 60
            while not all(flag.exists() for flag in ready):
                assert time.monotonic() < deadline, "the workers did not get ready"
                assert all(w.poll() is None for w in workers), [w.poll() for w in workers]
                time.sleep(0.01)
            go.touch()
            errors = [w.communicate(timeout=60)[1] for w in workers]
        finally:
            for worker in workers:
                worker.kill()  # only those still waiting: a finished one is left alone
                worker.wait()
        failed = [
            e.strip().splitlines()[-1] for w, e in zip(workers, errors, strict=True) if w.returncode
        ]
        assert failed == [], failed


def test_storage_url_password_is_hidden() -> None:
    from autotune.sweep.search import with_storage_hidden

    hidden = with_storage_hidden(f"postgresql+psycopg2://{USER}:{PASSWORD}@db.example:5432/s")
    assert PASSWORD not in hidden and hidden.endswith("@db.example:5432/s")
    assert with_storage_hidden("sqlite:///studies/x.db") == "sqlite:///studies/x.db"
