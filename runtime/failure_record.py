"""Which rank failed first: each rank records its uncaught exception, the launcher reads them.

When one rank raises, its peers fail a moment later with "Connection closed by peer" inside the
next collective, and torch's agent sees them all fail in the same poll, with timestamps in whole
seconds: it cannot tell cause from consequence. A rank knows the exact time of its own exception,
so it writes it down (``ACCELIFY_FAILURE_DIR``, set by `accelify launch`), and the launcher names
the earliest. With ``--max-restarts`` records go to one folder per attempt: the run fails only
once the restarts are spent, so only the last attempt's count. Nothing here imports torch: the
launcher reads the records.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from accelify.runtime.environment import FAILURE_DIR


@dataclass(frozen=True)
class Failure:
    rank: int
    time_ns: int
    summary: str  # "RuntimeError: boom"
    traceback: str

    @classmethod
    def read(cls, path: Path) -> Failure | None:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                int(record["rank"]), int(record["time_ns"]), record["summary"], record["traceback"]
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a rank killed while writing: no record, as if it had none


ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def install(rank: int, on_exception: Callable[[], None]) -> None:
    """Chain a `sys.excepthook` that records the exception (when launched by accelify) and calls
    `on_exception`, then shows the traceback as before. An interrupt the launcher forwarded
    (Ctrl-C) is not a failure of this rank: no record, and no traceback on every rank."""
    previous: ExceptHook = sys.excepthook
    directory = os.environ.get(FAILURE_DIR)

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        on_exception()
        if directory and issubclass(kind, KeyboardInterrupt):
            return
        if directory:
            _write(Path(directory), rank, error)
        previous(kind, error, tb)

    sys.excepthook = hook


def _write(directory: Path, rank: int, error: BaseException) -> None:
    record = {
        "rank": rank,
        "time_ns": time.time_ns(),
        "summary": "".join(traceback.format_exception_only(error)).strip(),
        "traceback": "".join(traceback.format_exception(error)),
    }
    attempt = directory / os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    temporary = attempt / f".{rank}.json.tmp"
    try:
        attempt.mkdir(exist_ok=True)
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, attempt / f"{rank}.json")
    except OSError:
        pass  # the record only improves the launcher's report; the traceback still prints


def first_failure(directory: Path, attempt: int, ranks: set[int]) -> Failure | None:
    """The earliest exception recorded in `attempt` among `ranks` (the ones the agent saw
    fail)."""
    failures = [Failure.read(directory / str(attempt) / f"{rank}.json") for rank in ranks]
    recorded = [failure for failure in failures if failure is not None]
    return min(recorded, key=lambda failure: failure.time_ns, default=None)
