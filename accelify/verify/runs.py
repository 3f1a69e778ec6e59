"""Run a script under the probe: one plain process, or K ranks through `accelify launch`, in a
scratch working directory, bounded by a timeout that turns a hang into a result."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelify.verify.records import (
    ENV_DEADLINE,
    ENV_OUT,
    ENV_PATH,
    ENV_SEED,
    ENV_STEPS,
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
    args: tuple[str, ...] = ()


@dataclass
class StartedRun:
    """A run in flight: started with `start_run`, collected with `finish`. Runs are started
    together and run side by side (they are independent processes)."""

    label: str
    processes: int
    process: subprocess.Popen[bytes]
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


def start_run(
    script: Path, label: str, scratch: Path, processes: int, settings: RunSettings
) -> StartedRun:
    records = scratch / f"{label}-records"
    workdir = scratch / f"{label}-work"
    log = scratch / f"{label}.log"
    errors = scratch / f"{label}.err"
    records.mkdir(parents=True)
    workdir.mkdir(parents=True)
    deadline = time.time() + settings.timeout
    env = {
        **os.environ,
        ENV_OUT: str(records),
        ENV_STEPS: str(settings.steps),
        ENV_SEED: str(settings.seed),
        ENV_DEADLINE: str(deadline),
        "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if settings.search_path is not None:
        env[ENV_PATH] = str(settings.search_path)
    probe = ["-m", "accelify.verify.probe", str(script), *settings.args]
    if processes == 1:
        command = [sys.executable, *probe]
    else:
        # No device flag: the launcher runs on the CPU where there is no GPU, and the parent
        # need not import torch to ask.
        command = [sys.executable, "-m", "accelify", "launch", "-n", str(processes), *probe]
    # Output goes to a file, not a pipe: nothing can keep the parent waiting on a pipe end.
    with log.open("wb") as output, errors.open("wb") as error_output:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=output,
            stderr=error_output,
            start_new_session=True,
        )
    return StartedRun(label, processes, process, records, log, errors, deadline)


def _wait(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code, or None when it had to be stopped: SIGTERM first (the launcher passes it
    on to its workers), SIGKILL for whatever is left."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        return None


def _stop_group(process: subprocess.Popen[bytes]) -> None:
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
