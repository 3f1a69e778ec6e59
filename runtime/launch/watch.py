"""Watch the ranks while the run goes on, and say at once when they can no longer finish.

Each rank keeps a record of the collective it is in (`accelify.runtime.collective_record`).
Read side by side, the records show the three ways a distributed run hangs:

- ranks waiting in *different* collectives (another call, or the same call at another place in
  the sequence): neither can finish (a collective under ``if accelerator.is_main_process:``,
  one rank leaving the loop while the others train on);
- a rank waiting in a collective while a peer has left the script: its peer will never come;
- a rank waiting longer than ``--hang-timeout`` while a peer is busy outside any collective: the
  peer's Python stack says where it is (a rank looping alone, a slow main-process-only section).

The first two are certain once they have lasted a few seconds (`GRACE`: a healthy rank leaves a
collective within milliseconds of its peers), so they are reported then, not after torch's
30-minute timeout. A rank that has left for good is certain at once: its exit guard records that
it is past its last collective (or its process is gone), and a peer waiting in a collective
numbered after that one waits for good; it is reported at the next poll. The report names each
rank's place as the user's ``file:line`` and source line.
The watcher then stops the ranks (a rank that is leaving is let finish, so that its own exit code
is the run's); the launcher's final report (`outcome`) uses the `Verdict`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import linecache
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from accelify.runtime import collective_record as records
from accelify.runtime.collective_record import (
    CRASHED,
    IN_COLLECTIVE,
    LEAVING,
    RUNNING,
    SAME_SHAPES,
    STACK_SIGNAL,
    Record,
)
from accelify.runtime.failure_record import (
    Failure,
    exit_call,
    exit_handler_errors,
    exit_place,
    is_peer_gone,
    recorded_failures,
)
from accelify.runtime.launch.rank_guards import RankGuard, rank_guard
from accelify.runtime.launch.shapes import other_shapes, shapes_words

PREFIX = "accelify launch:"
#: How long a situation that cannot resolve itself must last before it is reported.
GRACE = 5.0
POLL = 0.5
#: How long a rank has to dump its stack when asked, and how long the dump must stay the same
#: size to count as whole: faulthandler writes it a few bytes per ``write`` with no end marker,
#: and a rank descheduled mid-dump (a loaded node) left a file that ended at a line's end with
#: none of the main thread's frames yet.
STACK_WAIT = 10.0
STACK_SETTLED = 0.2
STACK_SETTLED_WITHOUT_FRAMES = 10  # polls (2 s): a main thread in library code has no user frame
#: After SIGTERM, how long a rank has to end before SIGKILL.
STOP_WAIT = 10.0
#: How long a leaving rank waits for its peers at exit (`accelify.runtime.state._ExitGuard`).
EXIT_WAIT = 10.0
#: How long a stop waits for a record caught mid-write to be whole (`Watcher.halt`): a write
#: takes microseconds, unless its rank is descheduled inside it (a loaded machine), or was
#: killed there (then the rank is left out after this long). Read again every `TORN_POLL`.
TORN_WAIT = 0.5
TORN_POLL = 0.005


@dataclass(frozen=True)
class Moment:
    """Each rank's record at one moment (`Watcher.halt`), and which ranks' processes lived."""

    time: float
    ranks: dict[int, Record]
    alive: frozenset[int]


@dataclass(frozen=True)
class Verdict:
    """What the watcher found: the report it printed, and the rank it names as the cause (None
    when the ranks are at fault together, as in mismatched collectives)."""

    text: str
    culprit: int | None
    kind: str  # "mismatch", "shapes", "left", "hang"


class Watcher:
    def __init__(
        self,
        root: Path,
        hang_timeout: float,
        out: TextIO | None = None,
        grace: float = GRACE,
        poll: float = POLL,
        max_restarts: int = 0,
    ) -> None:
        self.root = root
        self.max_restarts = max_restarts
        self._announced = 0  # the last restart attempt the user was told of
        self.hang_timeout = hang_timeout
        self.out = out or sys.stderr
        self.grace = grace
        self.poll = poll
        self.verdicts: dict[int, Verdict] = {}  # attempt -> what was found in it
        self._stop = threading.Event()
        #: set by `halt`: the launcher was stopped by a signal, nothing more is said or done
        self._halted = threading.Event()
        #: held to print, and to halt: a report is printed whole before the halt, or not at all
        #: (reentrant: a second signal may come while the launcher's main thread holds it)
        self._saying = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="accelify-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; a restart the watch had not yet seen is announced now, before the
        run's last word: forked ranks can start again and fail within one poll, and the agent
        returns before the watch sees their attempt (the announcement went missing). After
        `halt` nothing is waited for: the watch says and does nothing more."""
        self._stop.set()
        if self._halted.is_set():
            return
        self._thread.join(timeout=5)
        attempt = self.last_attempt()
        if not self._thread.is_alive() and attempt is not None and attempt > self._announced:
            self._announce_restart(attempt)

    def halt(self) -> Moment:
        """The launcher is stopped by a signal (Ctrl-C, SIGTERM), before any rank is told: each
        rank's record as it stands, what it was doing then. From here the watch prints nothing
        and signals no rank. A report it was putting together is dropped, not waited for: asking
        a busy rank for its stack (up to `STACK_WAIT` for one that was stopped first) and
        finding a rank test in the script (the analysis imports libcst: seconds on a loaded
        machine) held a Ctrl-C's end back, and the report was printed after the stop. A record
        caught mid-write is read again until whole (up to `TORN_WAIT`): read once, a rank that
        was inside a write (descheduled there, on a loaded machine) had no line in the stop."""
        with self._saying:
            self._halted.set()
            self._stop.set()
        attempt = self.last_attempt()
        directory = None if attempt is None else records.attempt_directory(self.root, attempt)
        ranks = {} if directory is None else read_all(directory, TORN_WAIT)
        alive = frozenset(rank for rank, rec in ranks.items() if _alive(rec.pid))
        return Moment(time.time(), ranks, alive)

    def _say(self, text: str) -> bool:
        """Print ``text`` unless the watch was halted; whether it was printed."""
        with self._saying:
            if self._halted.is_set():
                return False
            print(text, file=self.out, flush=True)
            return True

    def verdict(self, attempt: int) -> Verdict | None:
        return self.verdicts.get(attempt)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            attempt = self.last_attempt()
            if attempt is not None and attempt > self._announced:
                self._announce_restart(attempt)
            if attempt is None or attempt in self.verdicts:
                continue
            directory = records.attempt_directory(self.root, attempt)
            ranks = read_all(directory)
            verdict = self.inspect(ranks, time.time(), directory)
            if verdict is None:
                continue
            with self._saying:
                if not self._say(verdict.text):
                    return  # the launcher was stopped while the report was put together
                self.verdicts[attempt] = verdict
            records.release(directory)  # a rank waiting for its peers at exit stops waiting
            self._end(verdict, directory)

    def _announce_restart(self, attempt: int) -> None:
        """torchrun's agent restarts every rank without a word (``--max-restarts``): what follows
        on the terminal is a new run of the script, and the user must know it, and why."""
        self._announced = attempt
        previous = attempt - 1
        failures = recorded_failures(self.root, previous, set(read_all(
            records.attempt_directory(self.root, previous))))  # fmt: skip
        causes = [f for f in failures.values() if not is_peer_gone(f.summary)]
        first = min(causes or failures.values(), key=lambda f: f.time_ns, default=None)
        if first is None:
            why = "a rank failed"
        else:
            path, _, line = first.where.rpartition(":")
            where = f" at {_shown_path(path)}:{line}" if path and line.isdigit() else ""
            why = f"rank {first.rank} failed first: {first.summary}{where}"
        self._say(
            f"{PREFIX} attempt {previous + 1} of the run ended ({why}); restarting every rank "
            f"from the start of the script (restart {attempt} of {self.max_restarts})"
        )

    def last_attempt(self) -> int | None:
        """The latest restart attempt whose ranks wrote records (None: none did)."""
        try:
            attempts = [int(p.name) for p in self.root.iterdir() if p.name.isdigit()]
        except OSError:
            return None
        return max(attempts, default=None)

    # --- what the records say ---------------------------------------------------------------
    def inspect(self, ranks: dict[int, Record], now: float, directory: Path) -> Verdict | None:
        if any(rec.state == CRASHED for rec in ranks.values()):
            return None  # a rank that raised ends the run through the agent, with its traceback
        in_collective = {
            r: rec for r, rec in ranks.items() if rec.state == IN_COLLECTIVE and _alive(rec.pid)
        }
        for rec in in_collective.values():
            if rec.shaped_operation in SAME_SHAPES and other_shapes(ranks, rec):
                # certain once it lasts: a reduction that communicates nothing
                # (``reduce(x, "none")``) is left within microseconds
                if now - rec.since < self.grace:
                    return None
                text = "\n".join([*shapes_words(ranks, rec, place), _STOPPING])
                return Verdict(text, None, "shapes")
        stranded = _left_for_good(ranks, in_collective)
        if stranded is not None:
            leaver, waiting = stranded
            return _left(ranks, waiting, {leaver: ranks[leaver]}, directory, self._halted)
        waiting = {r: rec for r, rec in in_collective.items() if now - rec.since >= self.grace}
        if not waiting:
            return None
        if len({(rec.operation, rec.sequence) for rec in waiting.values()}) > 1:
            stacks = {
                r: _stack(directory, r, rec.pid, self._halted) for r, rec in sorted(waiting.items())
            }
            return _mismatch(ranks, waiting, stacks)
        left = {
            r: rec
            for r, rec in ranks.items()
            if rec.state == LEAVING and now - rec.since >= self.grace
        }
        if left:
            return _left(ranks, waiting, left, directory, self._halted)
        if self.hang_timeout <= 0:
            return None
        stuck = {r: rec for r, rec in waiting.items() if now - rec.since >= self.hang_timeout}
        busy = {r: rec for r, rec in ranks.items() if rec.state == RUNNING and _alive(rec.pid)}
        if stuck and busy:
            stacks = {r: _stack(directory, r, rec.pid, self._halted) for r, rec in busy.items()}
            return _hang(stuck, busy, stacks, now, self.hang_timeout)
        return None

    # --- ending the run -----------------------------------------------------------------------
    def _end(self, verdict: Verdict, directory: Path) -> None:
        """Stop the ranks. A rank that is leaving is let go first (its exit code is the run's),
        then the ranks left waiting, which cannot finish, are stopped."""
        ranks = read_all(directory)
        leaving = [rec.pid for rec in ranks.values() if rec.state == LEAVING]
        deadline = time.monotonic() + STOP_WAIT + EXIT_WAIT
        while any(_alive(pid) for pid in leaving) and time.monotonic() < deadline:
            if self._stop.wait(self.poll):
                return
        if self._stop.wait(self.grace if leaving else 0):
            return  # ranks that failed on their own once their peer left: the run is over
        others = [rec.pid for rec in read_all(directory).values() if rec.pid not in leaving]
        _terminate(others, self._stop)


def read_all(directory: Path, torn_wait: float = 0.0) -> dict[int, Record]:
    """Every rank's record in one attempt's folder. A record caught mid-write is read again
    for up to ``torn_wait`` seconds, then left out (the watch reads again at its next poll; a
    stop reads once, and a rank left out had no line in it)."""
    found: dict[int, Record] = {}
    try:
        names = [p.name for p in directory.iterdir() if p.suffix == ".state"]
    except OSError:
        return found
    deadline = time.monotonic() + torn_wait
    for name in names:
        rank = name.partition(".")[0]
        if rank.isdigit():
            record = records.read(directory, int(rank))
            while record is None and time.monotonic() < deadline:
                time.sleep(TORN_POLL)
                record = records.read(directory, int(rank))
            if record is not None:
                found[int(rank)] = record
    return found


def _left_for_good(
    ranks: dict[int, Record], in_collective: dict[int, Record]
) -> tuple[int, dict[int, Record]] | None:
    """A rank that has left for good (past its last collective, `collectives_over`, or its
    process gone) while peers wait in collectives it never entered (numbered after its
    last): they wait for good, from the moment both are so, with no `GRACE` to let pass. The
    leaver and those peers; None when no rank has. (A peer still in the leaver's last
    collective may be taking its result: that one waits `GRACE`.)"""
    for rank, record in sorted(ranks.items()):
        if record.state != LEAVING or not (record.over or not _alive(record.pid)):
            continue
        waiting = {r: rec for r, rec in in_collective.items() if rec.sequence > record.sequence}
        if waiting:
            return rank, waiting
    return None


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for the agent to collect it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not sys.platform.startswith("linux")


def _terminate(pids: list[int], stopped: threading.Event) -> None:
    for pid in pids:
        if stopped.is_set():  # the run ended, or the launcher was stopped: the agent stops them
            return
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        if stopped.wait(POLL):
            return
    for pid in pids:
        if _alive(pid) and not stopped.is_set():
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


# --- the words ----------------------------------------------------------------------------------
def place(record: Record) -> str:
    """``train.py:88 (`total = accelerator.gather(loss)`)``: the user's line, as they wrote it."""
    if not record.where:
        return "an unknown place"
    return source_place(record.file, record.line)


def source_place(path: str, line: int) -> str:
    shown = _shown_path(path)
    text = linecache.getline(path, line).strip()
    return f"{shown}:{line} (`{text}`)" if text else f"{shown}:{line}"


def _shown_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


#: How ranks stop together: with the runtime, or in a script of its own.
AGREED_BREAK = (
    "a break or return on one rank's own value must be taken by every rank: "
    "accelerator.set_trigger() and check_trigger(), or without an Accelerator an all_reduce of a "
    "stop flag"
)

#: Collectives the user did not call by name, said so.
_OPERATION_WORDS = {
    "forward": "the model's forward (DDP synchronises buffers and buckets there)",
    "backward": "backward (DDP reduces gradients there)",
    "init_process_group": "init_process_group (every rank must come to start the group)",
}


_STOPPING = f"{PREFIX} stopping every rank"


def _waits(record: Record) -> str:
    operation = _OPERATION_WORDS.get(record.operation, record.operation)
    return (
        f"rank {record.rank} waits in {operation} at {place(record)}"
        f"{_number(record)}{_passes_if_counted(record)}"
    )


def _number(record: Record) -> str:
    """``, collective #8``; nothing in the rendezvous that starts the group (before the first)."""
    return f", collective #{record.sequence}" if record.sequence else ""


def _passes_if_counted(record: Record) -> str:
    """``, after 4 backward passes``; nothing for a rank that counts none (a script that calls
    torch.distributed itself: its backward passes are not seen)."""
    return f", {passes_words(record)}" if record.passes else ""


def passes_words(record: Record) -> str:
    count = record.passes
    return f"after {count} backward pass{'es' if count != 1 else ''}"


Frames = list[tuple[str, int, str]]


def _mismatch(
    ranks: dict[int, Record], waiting: dict[int, Record], stacks: dict[int, Frames]
) -> Verdict:
    """``stacks``: the waiting ranks' user frames, oldest first: a collective called in a helper
    is named with the lines that called it (the guarded call is the line to fix)."""
    lines = [
        f"{PREFIX} mismatched collectives: the ranks wait in different calls, none can finish:"
    ]
    lines += [
        f"  {_waits(rec)}{_called_from(stacks.get(r) or [])}" for r, rec in sorted(waiting.items())
    ]
    for rank, rec in sorted(ranks.items()):
        if rank not in waiting:
            lines.append(f"  rank {rank} is {_state_words(rec)}")
    guarded = {
        rank: found
        for rank, rec in sorted(waiting.items())
        if (found := guarded_call(rec, stacks.get(rank) or [])) is not None
    }
    culprit = min(guarded) if guarded and len(guarded) < len(waiting) else _fewest_passes(waiting)
    if culprit in guarded:
        others = [rank for rank in sorted(waiting) if rank not in guarded]
        lines.append(guarded_words(culprit, guarded[culprit], others, "went on"))
    elif culprit is not None:
        most = max(rec.passes for rec in waiting.values())
        ahead = next(r for r, rec in sorted(waiting.items()) if rec.passes == most)
        if _in_the_loop_of(stacks.get(culprit) or [], stacks.get(ahead) or []):
            lines.append(
                f"{PREFIX} rank {culprit} went into a collective inside the training loop that "
                f"the others did not: it waits after {waiting[culprit].passes} backward passes, "
                f"the others went on to {most} (a collective under a condition only some ranks "
                "take, such as is_main_process, is reached by those ranks alone)"
            )
        else:
            lines.append(
                f"{PREFIX} rank {culprit} left the training loop early: it stopped after "
                f"{waiting[culprit].passes} backward passes, the others went on to {most} "
                f"({AGREED_BREAK})"
            )
    lines.append(
        f"{PREFIX} every rank must make the same collective calls in the same order: look for "
        "one under a condition that differs between ranks (is_main_process, a rank's own "
        "metric, a loop of a different length); stopping every rank"
    )
    return Verdict("\n".join(lines), culprit, "mismatch")


def guarded_words(
    rank: int, found: tuple[tuple[str, int], RankGuard], others: list[int], then: str
) -> str:
    """The line that names a collective only some ranks reach (`guarded_call`) as the cause."""
    (path, line), guard = found
    named = ", ".join(str(other) for other in others)
    where, did = ("in the else of", "took") if guard.in_else else ("under", "skipped")
    return (
        f"{PREFIX} rank {rank} went into a collective that only some ranks reach: "
        f"{source_place(path, line)} runs {where} `{guard.text}` "
        f"({_shown_path(path)}:{guard.line}), which rank{'s' if len(others) > 1 else ''} "
        f"{named} {did} and {then}; every rank must make the call: take the "
        "collective out of the guard (gather or wait on every rank, then print or save "
        "on the main process only)"
    )


def guarded_call(record: Record, frames: Frames) -> tuple[tuple[str, int], RankGuard] | None:
    """The outermost of the rank's own lines that runs on some ranks only (the guarded call of
    a helper that makes the collective, or the collective itself), with its guard."""
    places = [(path, line) for path, line, _ in frames]
    if record.where and (record.file, record.line) not in places:
        places.append((record.file, record.line))
    for path, line in places:
        guard = rank_guard(path, line)
        if guard is not None:
            return (path, line), guard
    return None


def _called_from(frames: Frames) -> str:
    """``; called from train.py:14 (`log_loss(loss)`)``, the callers outermost first."""
    callers = [source_place(path, line) for path, line, _ in frames[:-1]]
    return f"; called from {', from '.join(reversed(callers))}" if callers else ""


def _in_the_loop_of(behind: Frames, ahead: Frames) -> bool:
    """Whether the rank behind waits inside the loop the rank ahead is still in: their stacks
    part at one frame of the same function, and the loop around the ahead rank's line there
    also holds the behind rank's line. (Unknown, without stacks: not said.)"""
    for mine, theirs in zip(behind, ahead, strict=False):
        if (mine[0], mine[2]) != (theirs[0], theirs[2]):
            return False
        if mine[1] != theirs[1]:
            loop = _innermost_loop(mine[0], theirs[1])
            return loop is not None and loop[0] <= mine[1] <= loop[1]
    return False


def _innermost_loop(path: str, line: int) -> tuple[int, int] | None:
    """The first and last line of the innermost ``for``/``while`` around ``line``."""
    try:
        tree = ast.parse(Path(path).read_bytes(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    spans = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return max(spans, default=None)


def _fewest_passes(waiting: dict[int, Record]) -> int | None:
    """The rank behind the others in backward passes left the training loop early; when all
    made as many, no one rank is to blame."""
    counts = {rank: rec.passes for rank, rec in waiting.items()}
    fewest = min(counts.values())
    behind = [rank for rank, count in counts.items() if count == fewest]
    return behind[0] if len(behind) == 1 and len(set(counts.values())) > 1 else None


def _left(
    ranks: dict[int, Record],
    waiting: dict[int, Record],
    left: dict[int, Record],
    directory: Path,
    stopped: threading.Event | None = None,
) -> Verdict:
    leaver, record = min(left.items())
    handler_errors = exit_handler_errors(directory)
    how = "is leaving" if _alive(record.pid) else "has exited"
    last = (
        f"its last collective: {record.operation} at {place(record)}"
        if record.sequence
        else "it made no collective call"
    )
    error = handler_errors.get(leaver)
    if error is not None:
        # the cause is the exception, not the loop: Python went on exiting after it
        lines = [f"{PREFIX} rank {leaver} {how}: {handler_error_words(error)}, while:"]
        lines += [f"  {_waits(rec)}: it cannot finish" for _, rec in sorted(waiting.items())]
        lines.append(
            f"{PREFIX} the peers wait for a collective that rank {leaver}'s handler never "
            "reached: Python ignores an exception in an atexit handler and goes on exiting"
        )
        return Verdict("\n".join(lines), leaver, "left")
    lines = [
        f"{PREFIX} rank {leaver} {how} ({leaving_words(directory, leaver)})"
        f"{_passes_if_counted(record).removeprefix(',')} ({last}), while:"
    ]
    lines += [f"  {_waits(rec)}: it cannot finish" for _, rec in sorted(waiting.items())]
    guarded = {
        rank: found
        for rank, rec in sorted(waiting.items())
        if (found := guarded_call(rec, _stack(directory, rank, rec.pid, stopped))) is not None
    }
    if guarded:
        # the leaver skipped a guarded collective and ran out of script: the guard is the cause
        culprit = min(guarded)
        lines.append(guarded_words(culprit, guarded[culprit], sorted(left), "left"))
        return Verdict("\n".join(lines), culprit, "mismatch")
    if exit_place(directory, leaver) is not None:
        lines.append(
            f"{PREFIX} rank {leaver} called {exit_call(directory, leaver)} alone while the "
            "others are still in the "
            "loop: to stop every rank on one rank's condition, accelerator.set_trigger() there "
            "and `if accelerator.check_trigger(): sys.exit(...)` on every rank (without an "
            "Accelerator, an all_reduce of a stop flag)"
        )
    else:
        lines.append(
            f"{PREFIX} rank {leaver} left the loop the others are still in: every rank must run "
            f"as many steps ({AGREED_BREAK})"
        )
    return Verdict("\n".join(lines), leaver, "left")


def leaving_words(directory: Path, rank: int) -> str:
    """``it called sys.exit at train.py:40 (`sys.exit(3)`)``, or that its script ended."""
    at = exit_place(directory, rank)
    if at is None:
        return "its script ended, or it called sys.exit"
    return f"it called {exit_call(directory, rank)} at {source_place(*at)}"


def handler_error_words(error: Failure) -> str:
    """``its atexit handler save raised at train.py:11 (`...`): OSError: disk full``."""
    file, _, line = error.where.rpartition(":")
    at = f" at {source_place(file, int(line))}" if file and line.isdigit() else ""
    summary = next((text for text in error.summary.splitlines() if text.strip()), "an exception")
    return f"its atexit handler {error.handler} raised{at}: {summary}"


def _hang(
    stuck: dict[int, Record],
    busy: dict[int, Record],
    stacks: dict[int, list[tuple[str, int, str]]],
    now: float,
    timeout: float,
) -> Verdict:
    lines = [
        f"{PREFIX} rank {rank} has waited {now - rec.since:.0f} s in {rec.operation} at "
        f"{place(rec)}{_number(rec)}"
        for rank, rec in sorted(stuck.items())
    ]
    for rank, rec in sorted(busy.items()):
        frames = stacks.get(rank) or []
        here = frames[-1] if frames else None
        at = f"; it is at {source_place(here[0], here[1])}" if here else ""
        lines.append(
            f"{PREFIX} rank {rank} has not reached a collective for {now - rec.since:.0f} s{at}"
        )
        if frames:
            lines.append("  its stack (most recent call last):")
            lines += [f'    File "{_shown_path(p)}", line {n}, in {f}' for p, n, f in frames]
        guarded = next(
            ((p, n, g) for p, n, _ in frames if (g := rank_guard(p, n)) is not None), None
        )
        if guarded is not None:
            # a call whose own gathers the record does not see (DeepSpeed's get_state_dict
            # under is_main_process; FSDP's are recorded as one collective at the user's line)
            path, line, guard = guarded
            lines.append(
                f"{PREFIX} rank {rank} is in {source_place(path, line)}, which runs under "
                f"`{guard.text}` ({_shown_path(path)}:{guard.line}): the other ranks skip it; "
                "if it reaches a collective (FSDP's or DeepSpeed's get_state_dict and "
                "save_model gather from every rank), take that out of the guard: every rank "
                "calls it, then save or print on the main process only"
            )
    lines.append(
        f"{PREFIX} no rank can go on (--hang-timeout {timeout:g} s); if a rank was meant to "
        "work alone that long (a long main-process-only section), raise --hang-timeout; "
        "stopping every rank"
    )
    culprit = min(busy) if len(busy) == 1 else None
    return Verdict("\n".join(lines), culprit, "hang")


def doing_words(record: Record, moment: Moment) -> str:
    """What the rank was doing at the moment, said short (a stopped run's line for each rank):
    ``waiting in gather at train.py:88 (`...`) for 12 s``, ``running``, ``leaving the script``,
    ``failing with an exception``, or ``no longer running`` (its process was gone)."""
    if record.rank not in moment.alive:
        return "no longer running"
    if record.state == IN_COLLECTIVE:
        waited = moment.time - record.since
        return f"waiting in {record.operation} at {place(record)}" + (
            f" for {waited:.0f} s" if waited >= 1 else ""
        )
    if record.state == RUNNING:
        return "running"
    return _state_words(record)


def _state_words(record: Record) -> str:
    if record.state == LEAVING:
        return f"leaving the script{_in_parentheses_if_counted(record)}"
    if record.state == CRASHED:
        return "failing with an exception"
    return f"outside any collective{_in_parentheses_if_counted(record)}"


def _in_parentheses_if_counted(record: Record) -> str:
    return f" ({passes_words(record)})" if record.passes else ""


# --- stacks -------------------------------------------------------------------------------------
def _stack(
    directory: Path, rank: int, pid: int, stopped: threading.Event | None = None
) -> list[tuple[str, int, str]]:
    """The rank's main-thread Python stack, oldest frame first, without accelify's, torch's and
    the standard library's frames below the user's (faulthandler on `STACK_SIGNAL`); none once
    ``stopped`` is set (the watch was halted: nobody waits for the report any more)."""
    stopped = stopped or threading.Event()
    path = records.stack_path(directory, rank)
    try:
        before = path.stat().st_size
    except OSError:
        return []
    if stopped.is_set():
        return []
    _signal(pid, STACK_SIGNAL)
    deadline = time.monotonic() + STACK_WAIT
    dump, seen, still = "", before, 0
    while time.monotonic() < deadline:
        if stopped.wait(STACK_SETTLED):
            return []
        try:
            data = path.read_bytes()
        except OSError:
            return []
        header = data.partition(b"\n")[0]
        # only this dump: an earlier one's main-thread section must not stand in for it
        dump = (header + b"\n" + data[before:]).decode("utf-8", errors="replace")
        still = still + 1 if len(data) == seen > before and data.endswith(b"\n") else 0
        seen = len(data)
        # the main thread is dumped last: its frames, then no growth, mean the dump is whole
        if still and (parse_stack(dump) or still >= STACK_SETTLED_WITHOUT_FRAMES):
            break
    return parse_stack(dump)


#: How faulthandler begins the dump it writes when the process dies of a fatal signal.
FATAL_DUMP = "Fatal Python error:"


def crash_stack(directory: Path, rank: int) -> list[tuple[str, int, str]]:
    """The stack the rank dumped as it died of a fatal signal (none when it did not)."""
    try:
        text = records.stack_path(directory, rank).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    header, _, dumps = text.partition("\n")
    at = dumps.rfind(FATAL_DUMP)
    return parse_stack(f"{header}\n{dumps[at:]}") if at >= 0 else []


def parse_stack(text: str) -> list[tuple[str, int, str]]:
    """faulthandler's dump (the last one in the file) → the main thread's frames, oldest first,
    cut to begin at the user's outermost frame and end at the user's innermost, without the
    library's frames between two of the user's (``@torch.no_grad()``'s wrapper around the user's
    function, a library's loop calling back into the script): a call chain names the user's
    lines only."""
    header, _, dumps = text.partition("\n")
    try:
        info = json.loads(header)
        main = int(info["main_thread"])
        skip = tuple(info["skip"])
    except (ValueError, KeyError, TypeError):
        return []
    sections = _thread_sections(dumps)
    frames = sections.get(main) or []
    frames = list(reversed(frames))  # faulthandler lists the most recent call first
    # the library's frames below the user's, the import system's (``<frozen importlib...>``)
    # between them when the user's line is an ``import`` still running, those that started the
    # script (the rank's entry, runpy) and a decorator's wrapper between two of the user's
    return [frame for frame in frames if not _not_the_users(frame, skip)]


def _not_the_users(frame: tuple[str, int, str], skip: tuple[str, ...]) -> bool:
    return frame[0].startswith((*skip, "<"))


def _thread_sections(text: str) -> dict[int, list[tuple[str, int, str]]]:
    """Only the last dump counts (the file keeps every dump the launcher asked for)."""
    sections: dict[int, list[tuple[str, int, str]]] = {}
    current: list[tuple[str, int, str]] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("Thread 0x", "Current thread 0x")):
            ident = int(stripped.split("0x", 1)[1].split()[0], 16)
            current = sections[ident] = []
        elif stripped.startswith('File "') and current is not None:
            path, _, rest = stripped[len('File "') :].partition('", line ')
            number, _, function = rest.partition(" in ")
            if number.isdigit():
                current.append((path, int(number), function))
    return sections
