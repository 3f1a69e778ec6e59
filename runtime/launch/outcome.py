"""What `accelify launch` says when a run does not end well: which rank failed first and why,
or that the user stopped it. One short block, the root cause last, where the eye lands."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from accelify.runtime.failure_record import Failure, first_failure

PREFIX = "accelify launch:"
AGENT_STOPS = (-signal.SIGTERM, -signal.SIGKILL)


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {_signal_name(-exitcode)}"
    return f"failed with exit code {exitcode}"


def failed_run(failures: dict[int, Any], records: Path, attempt: int) -> tuple[str, int]:
    """The report and exit code for torch's `ChildFailedError.failures` (rank -> ProcessFailure)
    of restart `attempt` (the last: the agent gives up once the restarts are spent).

    The root cause is the rank whose exception came first by the ranks' own records; without
    records (a script that does not use accelify's runtime, a rank killed by a signal), the
    agent's first failure that the agent did not cause itself by stopping the group."""
    first = first_failure(records, attempt, set(failures))
    if first is None:
        rank = min(
            failures,
            key=lambda r: (failures[r].exitcode in AGENT_STOPS, failures[r].timestamp, r),
        )
        how = describe_exit(failures[rank].exitcode)
        if failures[rank].exitcode > 0:
            how += " (its traceback is above)"
        text = f"{PREFIX} rank {rank} {how}; the other ranks were stopped"
        return text, _exit_code(failures[rank].exitcode)
    # Ranks the agent ended itself (SIGTERM, then SIGKILL) are "the other ranks" below.
    others = [
        f"rank {rank} {describe_exit(failure.exitcode)}"
        for rank, failure in sorted(failures.items())
        if rank != first.rank and failure.exitcode not in AGENT_STOPS
    ]
    lines = [
        f"{PREFIX} rank {first.rank} failed first; its traceback:",
        first.traceback.rstrip(),
        f"{PREFIX} rank {first.rank} failed first: {_one_line(first)}",
    ]
    if others:
        lines.append(f"{PREFIX} after it, {', '.join(others)}")
    lines.append(f"{PREFIX} the other ranks were stopped")
    return "\n".join(lines), _exit_code(failures[first.rank].exitcode)


def stopped(signum: int) -> tuple[str, int]:
    """Ctrl-C or SIGTERM of the launcher: the agent has stopped every rank; exit as a shell
    does for a process ended by that signal (130 for SIGINT, 143 for SIGTERM)."""
    return f"{PREFIX} stopped by {_signal_name(signum)}; every rank was stopped", 128 + signum


def _one_line(failure: Failure) -> str:
    lines = failure.summary.splitlines()
    return lines[0] if lines else "an exception"


def _exit_code(exitcode: int) -> int:
    return exitcode if exitcode > 0 else 1


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
