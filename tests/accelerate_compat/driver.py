"""Runs one HF test script case by case on 2 CPU ranks, relaunching after each failing case.

The same runner serves both sides: `accelerate` (HF Accelerate itself, under torchrun with
`ACCELERATE_USE_CPU`, which is how HF's multi-CPU mode is entered) and `accelify` (through
`accelify launch --cpu`, with `accelerate` names resolved to accelify's).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).with_name("case_runner.py")
#: A case that has not finished on every rank by then hangs (the slowest case here takes ~5 s).
#: HF's own run hangs in one case on every run (test_can_join_uneven_inputs, see
#: tests/test_accelerate_scripts.py), and only the cases it passes matter: it waits less.
CASE_TIMEOUT_S = {"accelify": 60.0, "accelerate": 20.0}
RANKS = 2
#: Calls of a script's functions made instead of its `main()`: `(function, arguments)`.
Calls = list[tuple[str, list[Any]]]


@dataclass(frozen=True)
class CaseResult:
    index: int
    case: str
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class ScriptRun:
    """A script's cases, and what went wrong outside them: `main()` failing before or between
    cases, or a rank dying after the last one (HF under torch 2.13 sometimes aborts at exit)."""

    cases: list[CaseResult]
    problems: list[str]


def hf_script(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.origin is not None, "accelerate is in the test extra"
    return Path(spec.origin).parent / "test_utils" / "scripts" / f"{name}.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(
    runtime: str, script: Path, results: Path, start: int, calls: Calls | None
) -> list[str]:
    runner_args = [str(RUNNER), str(script), str(results), str(start), runtime]
    if calls is not None:
        runner_args.append(json.dumps(calls))
    if runtime == "accelify":
        return [sys.executable, "-m", "accelify", "launch", "--cpu", "-n", str(RANKS), *runner_args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(RANKS),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        *runner_args,
    ]


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _launch(
    runtime: str, script: Path, results: Path, start: int, log: Path, calls: Calls | None
) -> None:
    """One launch from case `start`, killed when a case outlives its CASE_TIMEOUT_S."""
    timeout = CASE_TIMEOUT_S[runtime]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("a") as out:
        out.write(f"--- launch from case {start}\n")
        out.flush()
        process = subprocess.Popen(
            _command(runtime, script, results, start, calls),
            cwd=results.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started: dict[str, float] = {}
        while process.poll() is None:
            now = time.monotonic()
            for marker in results.glob("*.start"):
                index = marker.name.split(".")[0]
                if int(index) < start:
                    # an earlier launch's case: the one it hung in has no results, and counting
                    # it here killed every launch after a hang CASE_TIMEOUT_S into its run
                    continue
                started.setdefault(index, now)
                finished = len(list(results.glob(f"{index}.*.json")))
                if finished < RANKS and now - started[index] > timeout:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    _kill_ranks(results, start, int(index))
                    (results / f"{index}.hang").write_text(
                        f"not finished on {RANKS - finished} rank(s) after {timeout:.0f} s"
                    )
                    return
            time.sleep(0.1)


def _kill_ranks(results: Path, start: int, hung: int) -> None:
    """The ranks of this launch, by the pids their case markers hold: both launchers run ranks
    in sessions of their own, which outlive the launcher's process group."""
    for marker in results.glob("*.start"):
        if start <= int(marker.name.split(".")[0]) <= hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(_read(marker)["pid"], signal.SIGKILL)


def run_cases(runtime: str, name: str, workdir: Path, calls: Calls | None = None) -> ScriptRun:
    """Every case of HF's `name` script, in order, with its outcome on `runtime`: the calls its
    `main()` makes, or the given `calls` (`(function, arguments)`) instead of `main()`."""
    script = hf_script(name)
    results = workdir / f"{runtime}-{name}{'-calls' if calls is not None else ''}"
    results.mkdir(parents=True)
    log = results.with_name(f"{results.name}.log")
    outcomes: list[CaseResult] = []
    start = 0
    while True:
        _launch(runtime, script, results, start, log, calls)
        indices = sorted({int(p.name.split(".")[0]) for p in results.glob("[0-9]*.start")})
        for index in [i for i in indices if i >= start]:
            outcomes.append(_outcome(results, index))
            if not outcomes[-1].ok:
                break
        if outcomes and not outcomes[-1].ok and outcomes[-1].index >= start:
            start = outcomes[-1].index + 1
            continue
        problems = [
            f"main() outside any case, rank {path.name.split('.')[1]}: {_read(path)['error']}"
            for path in sorted(results.glob("setup.*.json"))
        ]
        finished = len(list(results.glob("done.*.json")))
        if not problems and finished < RANKS:
            problems.append(f"{RANKS - finished} rank(s) died after the last case: see {log}")
        return ScriptRun(outcomes, problems)


def _outcome(results: Path, index: int) -> CaseResult:
    stem = f"{index:03d}"
    label = _read(next(results.glob(f"{stem}.*.start")))["case"]
    errors = []
    for rank in range(RANKS):
        path = results / f"{stem}.{rank}.json"
        if not path.exists():
            errors.append(f"rank {rank}: no result")
            continue
        outcome = _read(path)
        if not outcome["ok"]:
            errors.append(f"rank {rank}: {outcome['error']}")
    hang = results / f"{stem}.hang"
    if hang.exists():
        errors.insert(0, f"hang: {hang.read_text()}")
    return CaseResult(index, label, not errors, "; ".join(errors))
