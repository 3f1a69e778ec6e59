"""Run a script under the probe: one plain process, or K ranks through `accelify launch`, in a
scratch working directory, bounded by a timeout that turns a hang into a result."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from accelify.verify.records import (
    ENV_DEADLINE,
    ENV_OUT,
    ENV_PATH,
    ENV_SEED,
    ENV_STEPS,
    PROBE_FAILED,
    LoaderPass,
    StepRecord,
    hang_marker,
    read_passes,
    read_records,
)

OUTPUT_TAIL = 4000
GRACE = 15.0  # seconds past the ranks' own deadline before the parent steps in


@dataclass
class Run:
    label: str
    processes: int
    returncode: int | None  # None: stopped by the parent
    output: str
    ranks: list[list[StepRecord]] = field(default_factory=list)
    timed_out: bool = False  # a rank was still running at the deadline
    stdout: str = ""  # what the script printed (the output above also holds stderr)
    passes: list[list[LoaderPass]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def tail(self) -> str:
        return self.output[-OUTPUT_TAIL:]


@dataclass(frozen=True)
class RunSettings:
    steps: int
    timeout: float
    seed: int = 0
    search_path: Path | None = None  # where the script's own imports are found
    #: a run's own search path, by label: a converted project's runs import its converted
    #: modules, the original's its own (`search_path` for a label not here)
    search_paths: tuple[tuple[str, Path], ...] = ()
    args: tuple[str, ...] = ()

    def search_path_of(self, label: str) -> Path | None:
        return dict(self.search_paths).get(label, self.search_path)


@dataclass
class StartedRun:
    """A run in flight: started with `start_runs`, collected with `finish`. Runs are started
    together and run side by side (they are independent processes)."""

    label: str
    processes: int
    process: ProcessLike
    records: Path
    log: Path
    errors: Path
    deadline: float

    def finish(self) -> Run:
        returncode = _wait(self.process, max(0.0, self.deadline - time.time()) + GRACE)
        timed_out = returncode is None or any(
            hang_marker(self.records, rank).exists() for rank in range(self.processes)
        )
        stdout = self.log.read_bytes().decode("utf-8", errors="replace")
        stderr = self.errors.read_bytes().decode("utf-8", errors="replace")
        return Run(
            self.label,
            self.processes,
            returncode,
            stdout + stderr,
            [read_records(self.records, rank) for rank in range(self.processes)],
            timed_out,
            stdout,
            [read_passes(self.records, rank) for rank in range(self.processes)],
        )

    def stop(self) -> None:
        _stop_group(self.process)


def start_runs(
    runs: list[tuple[Path, str, int]], scratch: Path, settings: RunSettings
) -> list[StartedRun]:
    """Start each (script, label, processes) run; they run side by side. On Linux they are
    forked from one process that has imported torch (`accelify.verify.forks`: torch is imported
    once, not once a run), elsewhere each is a process of its own."""
    deadline = time.time() + settings.timeout
    placed = [
        _place_run(script, label, scratch, processes, settings) for script, label, processes in runs
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
    env.update(_run_env(settings, deadline))
    if sys.platform != "linux":  # fork after importing torch is Linux's to rely on
        return [_start_alone(run, env, deadline) for run in placed]
    spec = scratch / "forks.json"
    spec.write_text(json.dumps([run.spec() for run in placed]), encoding="utf-8")
    with placed[0].errors.open("ab") as errors:  # the supervisor's own errors: the first run's
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "accelify.verify.forks", str(spec)],
            cwd=scratch,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,
        )
    forked = Forked(supervisor)
    return [run.started(ForkedProcess(forked, run.label), deadline) for run in placed]


@dataclass(frozen=True)
class _PlacedRun:
    """A run's command, folders and files, before it starts."""

    label: str
    processes: int
    arguments: list[str]  # after `python -m accelify` (launch) or `-m accelify.verify.probe`
    workdir: Path
    records: Path
    log: Path
    errors: Path
    env: dict[str, str]  # the run's own: where its records go, where its imports are found

    @property
    def launched(self) -> bool:
        return self.processes > 1

    def command(self) -> list[str]:
        module = "accelify" if self.launched else "accelify.verify.probe"
        return [sys.executable, "-m", module, *self.arguments]

    def spec(self) -> dict:
        return {
            "label": self.label,
            "launch": self.launched,
            "arguments": self.arguments,
            "workdir": str(self.workdir),
            "stdout": str(self.log),
            "stderr": str(self.errors),
            "env": self.env,
        }

    def started(self, process: ProcessLike, deadline: float) -> StartedRun:
        return StartedRun(
            self.label, self.processes, process, self.records, self.log, self.errors, deadline
        )


def _place_run(
    script: Path, label: str, scratch: Path, processes: int, settings: RunSettings
) -> _PlacedRun:
    records = scratch / f"{label}-records"
    workdir = scratch / f"{label}-work"
    records.mkdir(parents=True)
    workdir.mkdir(parents=True)
    if settings.search_path is not None:
        copy_beside(settings.search_path, workdir)
    probe = [str(script), *settings.args]
    # No device flag: the launcher runs on the CPU where there is no GPU, and the parent need
    # not import torch to ask.
    arguments = (
        ["launch", "-n", str(processes), "-m", "accelify.verify.probe", *probe]
        if processes > 1
        else probe
    )
    log, errors = scratch / f"{label}.log", scratch / f"{label}.err"
    # Output goes to a file, not a pipe: nothing can keep the parent waiting on a pipe end.
    log.touch()
    errors.touch()
    search_path = settings.search_path_of(label)
    env = {ENV_OUT: str(records)}
    if search_path is not None:
        env[ENV_PATH] = str(search_path)
    return _PlacedRun(label, processes, arguments, workdir, records, log, errors, env)


#: How much of the script's folder a run's working directory gets, in all (a data set beside
#: the script is read where it is only through an absolute path: a copy per run would cost more
#: than the run)
COPIED_AT_MOST = 64 * 1024 * 1024
#: The most files a folder beside the script may hold to be copied (a walk of a big tree costs)
COPIED_FILES = 1000


def copy_beside(folder: Path, workdir: Path, budget: int = COPIED_AT_MOST) -> None:
    """Copy what lies beside the script (``config.yaml``, a vocabulary, a small data folder)
    into the run's working directory, so that its relative paths open what they open for the
    user, while what the run writes (a checkpoint, a log, an edited config) lands in the copy,
    never in the user's folder. Not copied: Python modules and packages (the imports are found
    in the script's own folder, or a converted project's, by the search path: a copy in the
    working directory would shadow them), hidden entries and caches, links, and whatever would
    take the copies past ``budget`` (or a folder of more than `COPIED_FILES` files). Nothing at
    all from the temporary folder itself or from a folder that holds the working directory (a
    script run from ``/tmp``): what lies there is other runs' scratch folders and other users'
    files, not the script's."""
    import shutil
    import tempfile

    try:
        here = folder.resolve()
        if here == Path(tempfile.gettempdir()).resolve() or workdir.resolve().is_relative_to(here):
            return
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if name.startswith(".") or name == "__pycache__" or entry.is_symlink():
            continue
        if entry.suffix == ".py" or (entry / "__init__.py").is_file():
            continue
        size = _size(entry, budget)
        if size > budget:
            continue
        try:
            if entry.is_dir():
                shutil.copytree(entry, workdir / name, symlinks=True)
            elif entry.is_file():
                shutil.copy2(entry, workdir / name)
        except OSError:
            continue
        budget -= size


def _size(entry: Path, limit: int) -> int:
    """The bytes of a file, or of a folder's files (counting stops past ``limit``)."""
    if not entry.is_dir():
        with contextlib.suppress(OSError):
            return entry.stat().st_size
        return limit + 1
    total = 0
    for count, path in enumerate(entry.rglob("*")):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        if total > limit or count >= COPIED_FILES:
            return limit + 1
    return total


def _run_env(settings: RunSettings, deadline: float) -> dict[str, str]:
    env = {
        ENV_STEPS: str(settings.steps),
        ENV_SEED: str(settings.seed),
        ENV_DEADLINE: str(deadline),
    }
    return env


def _start_alone(run: _PlacedRun, env: dict[str, str], deadline: float) -> StartedRun:
    with run.log.open("wb") as output, run.errors.open("wb") as error_output:
        process = subprocess.Popen(
            run.command(),
            cwd=run.workdir,
            env={**env, **run.env},
            stdout=output,
            stderr=error_output,
            start_new_session=True,
        )
    return run.started(process, deadline)


class Forked:
    """The supervisor of the forked runs (`accelify.verify.forks`) and what it has reported on
    its stdout: each run's pid as it starts, its exit code as it ends."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.pids: dict[str, int] = {}
        self.codes: dict[str, int] = {}
        self._pending = b""
        self._ended = False

    def code(self, label: str, timeout: float | None) -> int | None:
        """The run's exit code, waiting up to ``timeout`` seconds (None: as long as it takes)
        for it; None when it has not ended by then. A run the supervisor never reported (it
        failed before starting them) ends with the supervisor's own code, never with 0."""
        until = None if timeout is None else time.monotonic() + timeout
        while label not in self.codes and not self._ended:
            if not self._read(until):
                return None
        if label not in self.codes:
            self.codes[label] = self.process.wait() or PROBE_FAILED
        return self.codes[label]

    def pid(self, label: str) -> int | None:
        """The run's process (and process group) id, once started; None before."""
        while label not in self.pids and not self._ended and self._read(time.monotonic()):
            pass
        return self.pids.get(label)

    def _read(self, until: float | None) -> bool:
        """Read what the supervisor has written, waiting until ``until`` (monotonic; None:
        forever) for something; False when nothing came by then."""
        stream = self.process.stdout
        assert stream is not None
        wait = None if until is None else max(0.0, until - time.monotonic()) * 1000
        poll = select.poll()  # not select(): a parent with over 1024 files open reads it too
        poll.register(stream, select.POLLIN)
        if not poll.poll(wait):
            return False
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            self._ended = True
            stream.close()
            self.process.wait()
            return True
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            what, label, number = line.decode().split(" ")
            (self.pids if what == "started" else self.codes)[label] = int(number)
        return True

    def close(self) -> None:
        """Once every run has ended or been stopped: the supervisor ends too."""
        try:
            self.process.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class ProcessLike(Protocol):
    """What a run needs of its process: `subprocess.Popen`'s wait, poll and pid."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def poll(self) -> int | None: ...


@dataclass
class ForkedProcess:
    """A forked run, waited for through its supervisor's reports as a `subprocess.Popen` is."""

    forked: Forked
    label: str

    @property
    def pid(self) -> int:
        """Its own, or its supervisor's while it has not been started (stopping the supervisor
        before it forks stops the run)."""
        return self.forked.pid(self.label) or self.forked.process.pid

    def wait(self, timeout: float | None = None) -> int:
        code = self.forked.code(self.label, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.label, timeout or 0.0)
        return code

    def poll(self) -> int | None:
        return self.forked.code(self.label, 0.0)


def stop_all(runs: list[StartedRun]) -> None:
    """Stop whatever still runs; then the forked runs' supervisor ends."""
    for run in runs:
        run.stop()
    for forked in {
        id(run.process.forked): run.process.forked
        for run in runs
        if isinstance(run.process, ForkedProcess)
    }.values():
        forked.close()


def _wait(process: ProcessLike, timeout: float) -> int | None:
    """The exit code, or None when it had to be stopped: SIGTERM first (the launcher passes it
    on to its workers), SIGKILL for whatever is left."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        return None


def _stop_group(process: ProcessLike) -> None:
    if process.poll() is not None:
        return  # ended and reaped: its process group id may belong to someone else by now
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
