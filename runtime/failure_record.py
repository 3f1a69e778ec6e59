"""Which rank failed first: each rank records its uncaught exception, the launcher reads them.

When one rank raises, its peers fail a moment later with "Connection closed by peer" inside the
next collective, and torch's agent sees them all fail in the same poll, with timestamps in whole
seconds: it cannot tell cause from consequence. A rank knows the exact time of its own exception,
so it writes it down (``ACCELIFY_FAILURE_DIR``, set by `accelify launch`), and the launcher names
the earliest that is not a consequence of a peer's leaving (`PEER_GONE`). With
``--max-restarts`` records go to one folder per attempt: the run fails only once the restarts
are spent, so only the last attempt's count. Nothing here imports torch: the
launcher reads the records.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import signal
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any

from accelify.runtime.collective_record import library_prefixes
from accelify.runtime.environment import FAILURE_DIR, RANK_TRACEBACKS


@dataclass(frozen=True)
class Failure:
    rank: int
    time_ns: int
    summary: str  # "RuntimeError: boom"
    traceback: str
    where: str = ""  # "path:line" of the innermost frame in the user's code; "" when none
    handler: str = ""  # the atexit handler that raised it, when one did ("" for the script)

    @classmethod
    def read(cls, path: Path) -> Failure | None:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                int(record["rank"]),
                int(record["time_ns"]),
                record["summary"],
                record["traceback"],
                str(record.get("where", "")),
                str(record.get("handler", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a rank killed while writing: no record, as if it had none


ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


#: What a rank raises when a peer has gone (exited, crashed, been stopped): it is a victim, and
#: the cause is elsewhere. Gloo, NCCL and the rendezvous store each say it their own way.
PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Connection refused",
    "DistStoreError",
    "Socket Timeout",
    "failed to recv, got 0 bytes",
    "NCCL communicator was aborted",
    "remote process exited or there was a network error",
    "Timed out waiting",
)


def is_peer_gone(summary: str) -> bool:
    """Whether the exception says a peer has gone. torch says it with its own errors
    (RuntimeError from gloo, DistBackendError, DistStoreError); Python's own connection errors
    (``ConnectionResetError: [Errno 104] Connection reset by peer``) come from the script's own
    sockets, a download or a tracker's server, and are the rank's own failure."""
    kind = summary.partition(":")[0].strip()
    if kind in _PYTHONS_OS_ERRORS:
        return False
    return any(words in summary for words in PEER_GONE)


_PYTHONS_OS_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, OSError)
)


#: What each installer asks to be told of an uncaught exception (the runtime marks its exit
#: guard; the rank's entry marks its collective record), and the hook that tells them.
_ON_EXCEPTION: list[Callable[[], None]] = []
_HOOK: list[ExceptHook] = []
#: The code of the frame that ran the user's script (`accelify.runtime.rank_entry`): it and the
#: frames above it are not the user's, and tracebacks start below it.
_ENTRY: list[CodeType] = []


def install(rank: int, on_exception: Callable[[], None], entry: CodeType | None = None) -> None:
    """Chain a `sys.excepthook` that records the exception (when launched by accelify) and calls
    `on_exception`. A recorded traceback is printed once, by the launcher, with the ranks it
    took down named in one line each; a rank prints its own only when the launcher will not
    (no record, or an elastic restart is still to come) or when its output is kept apart
    (``--tee``: each rank's log file holds its own traceback). An interrupt the launcher forwarded
    (Ctrl-C) is not a failure of this rank: no record, and no traceback on every rank.

    Installed once per process (by the rank's entry, then by the runtime's process group): a
    second call only adds its `on_exception`. ``entry``: the code that runs the script, whose
    frames and those of its callers are cut from the traceback. A process the rank forks (a
    multiprocessing child, ``os.fork``) inherits the hooks: its exceptions are its own, printed
    as Python prints them, never recorded as the rank's."""
    if on_exception not in _ON_EXCEPTION:
        _ON_EXCEPTION.append(on_exception)
    if entry is not None:
        _ENTRY[:] = [entry]
    if _HOOK and sys.excepthook is _HOOK[0]:
        return
    previous: ExceptHook = sys.excepthook
    directory = os.environ.get(FAILURE_DIR)
    rank_pid = os.getpid()

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        # first: a Ctrl-C that arrived as the exception left the script is taken here, not
        # raised further into this hook
        the_ranks_own = _ending_already(rank_pid)
        tb = _below_entry(tb)
        error.__traceback__ = tb
        if not the_ranks_own:
            previous(kind, error, tb)
            return
        for callback in _ON_EXCEPTION:
            callback()
        if directory and issubclass(kind, KeyboardInterrupt):
            return
        recorded = directory and _write(Path(directory), rank, error)
        if recorded and not _restarts_left() and not os.environ.get(RANK_TRACEBACKS):
            return
        previous(kind, error, tb)

    _HOOK[:] = [hook]
    sys.excepthook = hook
    if directory:
        _record_exit_handler_errors(Path(directory), rank)


def _ending_already(rank_pid: int) -> bool:
    """Whether this is the rank's own process (not a child it forked), which is ending of its
    exception: a Ctrl-C that reaches it is ignored from here on, where Python would raise it as
    a KeyboardInterrupt in this hook or in the exit handlers after it ("Error in sys.excepthook"
    and two tracebacks, the record unwritten, the exit guard's cleanup cut short). It comes late
    on the ranks whose peer it stopped first: the peer leaves, this rank's collective fails with
    "Connection closed by peer", and the launcher's relayed SIGINT arrives as that is printed. A
    SIGINT already pending is raised by the first call made here (`signal.signal` runs pending
    handlers before it changes one): taken, and the check made again, with nothing left to come.
    A handler of the script's own is left as it is."""
    while True:
        try:
            if os.getpid() != rank_pid:
                return False
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                # not the main thread: an exception there ends only its thread
                with contextlib.suppress(ValueError):
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
            return True
        except KeyboardInterrupt:
            continue  # the Ctrl-C this ignores, raised before it could be


#: How Python introduces an exception raised by an atexit handler (`sys.unraisablehook`).
ATEXIT_ERROR = "Exception ignored in atexit callback"


def _record_exit_handler_errors(directory: Path, rank: int) -> None:
    """An exception raised in an atexit handler does not end the rank: Python prints it, runs
    the other handlers and exits 0 all the same. That is the rank's real outcome, and the
    launcher keeps it (the run's exit code stays 0 when every rank's is), but it says what was
    lost, once, and a peer left waiting at exit learns why. Recorded apart from the script's
    own exception (`exit_handler_errors`), printed by the launcher as a script's is."""
    previous = sys.unraisablehook
    rank_pid = os.getpid()

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        if (
            os.getpid() == rank_pid
            and error is not None
            and (unraisable.err_msg or "").startswith(ATEXIT_ERROR)
            and not isinstance(error, KeyboardInterrupt)
        ):
            handler = getattr(unraisable.object, "__qualname__", "") or repr(unraisable.object)
            recorded = _write(directory, rank, error, handler)
            if recorded and not _restarts_left() and not os.environ.get(RANK_TRACEBACKS):
                return
        previous(unraisable)

    sys.unraisablehook = hook


def _below_entry(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's own first frame on (all of it when the script was not
    started by the rank's entry)."""
    if not _ENTRY:
        return tb
    cursor = tb
    while cursor is not None:
        if cursor.tb_frame.f_code is _ENTRY[0]:
            return cursor.tb_next
        cursor = cursor.tb_next
    return tb


def _restarts_left() -> bool:
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return restarts.isdigit() and attempt.isdigit() and int(attempt) < int(restarts)


def _write(directory: Path, rank: int, error: BaseException, handler: str = "") -> bool:
    record = {
        "rank": rank,
        "time_ns": time.time_ns(),
        "summary": "".join(traceback.format_exception_only(error)).strip(),
        "traceback": "".join(traceback.format_exception(error)),
        "where": _user_line(error),
        "handler": handler,
    }
    return _write_record(directory, f"{rank}{EXIT_HANDLER_SUFFIX if handler else '.json'}", record)


def _write_record(directory: Path, name: str, record: dict[str, Any]) -> bool:
    """Write ``record`` whole (a reader never sees half of it) in this attempt's folder."""
    attempt = directory / os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    temporary = attempt / f".{name}.tmp"
    try:
        attempt.mkdir(exist_ok=True)
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, attempt / name)
    except OSError:
        return False  # the record only improves the launcher's report; the rank prints it
    return True


#: The file a rank's ``sys.exit`` is recorded in, after the rank's number.
EXIT_SUFFIX = ".exit.json"


def record_exit(rank: int, leaving: SystemExit) -> None:
    """Where the script called ``sys.exit`` when that call is the user's choice to leave
    (``if rank == 1: sys.exit(3)``): a rank that leaves while its peers still need it, or with a
    code of its own, is named with the line that made it leave, not only with its last
    collective. Nothing for an exit raised in a library's code (argparse's ``--help`` or usage
    error) or for the script's own end (``sys.exit(main())`` at the top level: a rank that got
    there early left its training loop early, as its last collective already says)."""
    directory = os.environ.get(FAILURE_DIR)
    frames = traceback.extract_tb(leaving.__traceback__) if directory else []
    if not frames:
        return
    last = frames[-1]
    if not _in_user_code(last.filename):
        return
    if last.name == "<module>" and _exits_with_a_call_result(last.line or ""):
        return
    where = f"{last.filename}:{last.lineno}"
    _write_record(Path(directory), f"{rank}{EXIT_SUFFIX}", {"rank": rank, "where": where})


def record_exit_call(rank: int, frame: FrameType | None, call: str) -> None:
    """Where the script called ``call`` (``os._exit``, which leaves at once: no exception to
    read the line from, no atexit handler), found from ``frame`` out: the innermost of the
    user's frames. A rank that left with ``os._exit(5)`` is named with that line, as one that
    called ``sys.exit`` is (`record_exit`)."""
    directory = os.environ.get(FAILURE_DIR)
    while directory and frame is not None and not _in_user_code(frame.f_code.co_filename):
        frame = frame.f_back
    if not directory or frame is None:
        return
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    record = {"rank": rank, "where": where, "call": call}
    _write_record(Path(directory), f"{rank}{EXIT_SUFFIX}", record)


def exit_call(attempt_directory: Path, rank: int) -> str:
    """What ``rank`` left through (`exit_place`): ``sys.exit`` unless the record says."""
    try:
        path = attempt_directory / f"{rank}{EXIT_SUFFIX}"
        call = json.loads(path.read_text(encoding="utf-8")).get("call", "sys.exit")
    except (OSError, ValueError, AttributeError):
        return "sys.exit"
    return call if call in ("sys.exit", "os._exit") else "sys.exit"


def _exits_with_a_call_result(line: str) -> bool:
    """``sys.exit(main())``, ``raise SystemExit(app.run())``: the script ends with what its
    entry function returned, on every rank alike."""
    import ast  # a rank that leaves only; the runtime's import stays light

    try:
        statement = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return False
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(statement, ast.Raise):
        call = statement.exc
    return isinstance(call, ast.Call) and bool(call.args) and isinstance(call.args[0], ast.Call)


def exit_place(attempt_directory: Path, rank: int) -> tuple[str, int] | None:
    """The file and line where ``rank`` called ``sys.exit`` in this attempt (`record_exit`)."""
    try:
        path = attempt_directory / f"{rank}{EXIT_SUFFIX}"
        file, _, line = str(json.loads(path.read_text(encoding="utf-8"))["where"]).rpartition(":")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (file, int(line)) if file and line.isdigit() else None


def _user_line(error: BaseException) -> str:
    """The innermost line of the traceback in the user's code (not accelify, torch, DeepSpeed,
    the standard library or an installed package): the line the launcher's report names."""
    places = [(frame.filename, frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
    # A DataLoader worker's exception is raised again in the rank with the worker's traceback
    # as text: the line that failed is in there.
    places += [(file, int(line)) for file, line in _WORKER_FRAME.findall(str(error))]
    where = ""
    for file, line in places:
        if line is not None and _in_user_code(file):
            where = f"{file}:{line}"
    return where


def _in_user_code(file: str) -> bool:
    """Not accelify, torch, DeepSpeed, the standard library, an installed package or a
    ``<string>``: a file of the user's."""
    return not file.startswith((*library_prefixes(), *_installed_prefixes(), "<"))


#: A frame of the worker's traceback that torch's ExceptionWrapper puts in its message.
_WORKER_FRAME = re.compile(r'^  File "(.+)", line (\d+)', re.MULTILINE)
#: Where that traceback starts; the worker's own exception is its last line.
WORKER_TRACEBACK = "Original Traceback (most recent call last):"


def _installed_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(
        os.path.join(paths[key], "") for key in ("stdlib", "platstdlib", "purelib", "platlib")
    )


def recorded_failures(directory: Path, attempt: int, ranks: set[int]) -> dict[int, Failure]:
    """The exceptions recorded in `attempt` by `ranks` (the ones the agent saw fail)."""
    found = {rank: Failure.read(directory / str(attempt) / f"{rank}.json") for rank in ranks}
    return {rank: failure for rank, failure in found.items() if failure is not None}


#: The file an atexit handler's exception is recorded in, after the rank's number.
EXIT_HANDLER_SUFFIX = ".atexit.json"


def exit_handler_errors(attempt_directory: Path) -> dict[int, Failure]:
    """The exceptions atexit handlers raised in one attempt, by rank."""
    found: dict[int, Failure] = {}
    try:
        paths = list(attempt_directory.glob(f"*{EXIT_HANDLER_SUFFIX}"))
    except OSError:
        return found
    for path in paths:
        failure = Failure.read(path)
        if failure is not None:
            found[failure.rank] = failure
    return found
