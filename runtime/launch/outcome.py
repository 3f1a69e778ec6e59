"""What `accelify launch` says when a run does not end well: which rank caused it and why, the
ranks it took down, or that the user stopped it. One short block, the cause first and its
traceback once.

The cause is found in this order: what the watcher saw while the run went on (mismatched
collectives, a rank that left while its peers waited, a hang: `watch.Verdict`); else the earliest
exception a rank raised on its own, by the ranks' own records; else a rank that exited on its own
(``sys.exit(3)``, a signal); else a rank that left the run with exit code 0 while its peers still
needed it. A rank whose exception says its peer has gone ("Connection closed by peer", a broken
pipe, a store timeout) is a victim, never the cause.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from accelify.runtime import collective_record
from accelify.runtime.collective_record import IN_COLLECTIVE, LEAVING, Record
from accelify.runtime.failure_record import (
    PEER_GONE,
    WORKER_TRACEBACK,
    Failure,
    exit_call,
    exit_handler_errors,
    exit_place,
    is_peer_gone,
    recorded_failures,
)
from accelify.runtime.launch.shapes import other_shapes, shapes_words
from accelify.runtime.launch.watch import (
    AGREED_BREAK,
    Frames,
    Moment,
    Verdict,
    crash_stack,
    doing_words,
    guarded_call,
    guarded_words,
    handler_error_words,
    passes_words,
    place,
    read_all,
    source_place,
)

PREFIX = "accelify launch:"
#: How torch's agent stops the ranks left once one has failed. It sends SIGKILL only to a rank
#: that outlived SIGTERM's grace, so a rank killed by SIGKILL among ranks ended by SIGTERM was
#: killed from outside (most often the kernel's out-of-memory killer): it is the cause.
AGENT_STOPS = (-signal.SIGTERM,)


def describe_exit(exitcode: int) -> str:
    if exitcode == -signal.SIGKILL:
        return "was killed by SIGKILL (the out-of-memory killer sends it: check the memory)"
    if exitcode < 0:
        return f"was killed by {_signal_name(-exitcode)}"
    return f"failed with exit code {exitcode}"


def failed_run(
    failures: dict[int, Any], records: Path, attempt: int, verdict: Verdict | None = None
) -> tuple[str, int]:
    """The report and exit code for torch's `ChildFailedError.failures` (rank -> ProcessFailure)
    of restart `attempt` (the last: the agent gives up once the restarts are spent)."""
    raised = recorded_failures(records, attempt, set(failures))
    states = _states(records, attempt)
    victims = {rank: f for rank, f in raised.items() if is_peer_gone(f.summary)}
    if verdict is not None:
        text, code = _after_verdict(verdict, failures, victims, states)
        return _with_exit_handler_errors(records, attempt, verdict, text), code
    causes = {rank: f for rank, f in raised.items() if rank not in victims}
    if causes:
        first = min(causes.values(), key=lambda failure: failure.time_ns)
        return _raised(first, failures, raised, states)
    exited = {
        rank: failure
        for rank, failure in failures.items()
        if rank not in raised and failure.exitcode not in AGENT_STOPS
    }
    exited_with = {rank: failure.exitcode for rank, failure in exited.items()}
    # A rank that called sys.exit(3) and was still tearing down when the agent stopped it (its
    # peer had crashed of its leaving first, and the agent saw that crash first)
    for rank, state in states.items():
        by_agent = rank in failures and failures[rank].exitcode in AGENT_STOPS
        if state.state == LEAVING and state.exit_code and by_agent and rank not in raised:
            exited[rank], exited_with[rank] = failures[rank], state.exit_code
    if exited:
        rank = min(exited, key=lambda r: (_left_at(states.get(r), exited[r].timestamp), r))
        if len(exited) > 1 and not any(state.sequence for state in states.values()):
            parsed = _all_left_parsing_arguments(exited_with, states, records, attempt)
            if parsed is not None:
                return parsed
            return _all_exited(exited_with, first=rank, states=states)
        frames = _crash_frames(records, attempt, rank, exited_with[rank])
        crash = _crash_place(frames) or _exit_call(records, attempt, rank)
        return _exited(
            rank, exited_with[rank], states.get(rank), failures, victims, crash, states, frames
        )
    left = [
        rank for rank, state in states.items() if state.state == LEAVING and rank not in failures
    ]
    if victims and left:
        return _exited(min(left), 0, states[min(left)], failures, victims)
    return _unexplained(failures, raised)


def finished(records: Path, attempt: int, verdict: Verdict | None) -> tuple[str, int] | None:
    """The report when every rank exited 0 (None: nothing to say). An exception in an atexit
    handler does not change a rank's exit code, in Python or here, but what it lost is said,
    its traceback once; a run the watcher found stuck (a peer waiting at exit for a rank whose
    handler raised) was stopped, and fails."""
    if verdict is not None:
        text, _ = _after_verdict(verdict, {}, {})
        return _with_exit_handler_errors(records, attempt, verdict, text), 1
    errors = exit_handler_errors(collective_record.attempt_directory(records, attempt))
    if not errors:
        return None
    lines = _exit_handler_lines(errors)
    lines.append(
        f"{PREFIX} Python ignores an exception in an atexit handler: every rank exited with "
        "code 0, and so does the run"
    )
    return "\n".join(lines), 0


def _with_exit_handler_errors(records: Path, attempt: int, verdict: Verdict, text: str) -> str:
    """The report after a verdict, led by what the ranks' atexit handlers raised (the first
    one's traceback). Whether the run ends with every rank exiting 0 (`finished`) or with the
    agent's failure (`failed_run`) depends on timing alone: the peer the watcher stops after
    the leaver has gone may or may not have ended by itself first. The report is the same."""
    errors = exit_handler_errors(collective_record.attempt_directory(records, attempt))
    return "\n".join([*_exit_handler_lines(errors, said=verdict.culprit), text])


def _exit_handler_lines(errors: dict[int, Failure], said: int | None = None) -> list[str]:
    """The first handler's traceback that is not a peer's leaving, once, and a line a rank
    (but rank ``said``, whose error the watcher's report named)."""
    if not errors:
        return []
    causes = [f for f in errors.values() if not is_peer_gone(f.summary)] or list(errors.values())
    first = min(causes, key=lambda failure: failure.time_ns)
    lines = [
        f"{PREFIX} rank {first.rank}'s atexit handler {first.handler} raised; its traceback:",
        first.traceback.rstrip(),
    ]
    for rank, error in sorted(errors.items()):
        if is_peer_gone(error.summary) and error is not first:
            lines.append(
                f"{PREFIX} rank {rank}'s atexit handler {error.handler} failed because its peer "
                f"had gone ({_peer_gone(error)})"
            )
        elif rank != said:
            words = handler_error_words(error).removeprefix("its ")
            lines.append(f"{PREFIX} rank {rank}'s {words}")
    return lines


def _after_verdict(
    verdict: Verdict,
    failures: dict[int, Any],
    victims: dict[int, Failure],
    states: dict[int, Record] | None = None,
) -> tuple[str, int]:
    """The watcher has printed what it found; the final block says what came of it. The
    culprit's exit code is the run's: the one it left with (``sys.exit(3)``), also when the
    agent stopped it with SIGTERM while it was still tearing down. Once the watcher releases a
    leaving rank, it closes its connections and its waiting peer fails at once: which of the
    two processes ends first, and so which one the agent sees fail and which one it stops, is
    up to the scheduler. The culprit's record keeps the code it was leaving with."""
    lines = []
    code = 1
    if verdict.culprit is not None:
        failure = failures.get(verdict.culprit)
        state = (states or {}).get(verdict.culprit)
        exitcode = failure.exitcode if failure is not None else 0
        if exitcode in AGENT_STOPS and state is not None and state.state == LEAVING:
            exitcode = state.exit_code
        if exitcode > 0:
            code = exitcode
            lines.append(f"{PREFIX} rank {verdict.culprit} {describe_exit(code)}")
    lines += _victim_lines(victims, exclude=verdict.culprit)
    cause = {
        "mismatch": "mismatched collectives",
        "shapes": "tensors of different shapes in one collective",
        "left": f"rank {verdict.culprit} left while its peers waited",
        "hang": "a hang",
    }[verdict.kind]
    lines.append(f"{PREFIX} the run was stopped: {cause} (above)")
    return "\n".join(lines), code


def _raised(
    first: Failure,
    failures: dict[int, Any],
    raised: dict[int, Failure],
    states: dict[int, Record] | None = None,
) -> tuple[str, int]:
    lines = [
        f"{PREFIX} rank {first.rank} failed first; its traceback:",
        first.traceback.rstrip(),
        f"{PREFIX} rank {first.rank} failed first{_at(first)}: {_one_line(first)}",
        *_accelify_fix(first),
    ]
    state = (states or {}).get(first.rank)
    if state is not None and state.sequence and (met := _met_elsewhere(states or {}, state)):
        # a check of the collective raised (``gather``'s structure exchange met a peer's
        # ``gather_object``): what it says of the data is a symptom; the records say why
        lines += _mismatch_words(first.rank, state, met, "the collective raises", own_guard=True)
    others = [
        f"rank {rank} {describe_exit(failure.exitcode)}"
        for rank, failure in sorted(failures.items())
        if rank != first.rank and failure.exitcode not in AGENT_STOPS and rank not in raised
    ]
    if others:
        lines.append(f"{PREFIX} after it, {', '.join(others)}")
    for rank, failure in sorted(raised.items()):
        if rank == first.rank or is_peer_gone(failure.summary):
            continue
        if (failure.summary, failure.where) == (first.summary, first.where):
            lines.append(f"{PREFIX} rank {rank} failed the same way, on its own")
        else:
            lines.append(f"{PREFIX} rank {rank} also failed{_at(failure)}: {_one_line(failure)}")
    lines += _victim_lines(
        {rank: f for rank, f in raised.items() if is_peer_gone(f.summary)}, exclude=first.rank
    )
    lines.append(f"{PREFIX} the other ranks were stopped")
    return "\n".join(lines), _raised_exit_code(failures[first.rank].exitcode)


def _raised_exit_code(exitcode: int) -> int:
    """A rank that raised exits 1, as Python does; the agent may have stopped it with SIGTERM
    while it was still leaving (its peer failed the same way a moment sooner and exited first),
    and the run's exit code is still the exception's, not the agent's signal."""
    return 1 if exitcode in AGENT_STOPS else _exit_code(exitcode)


def _exited(
    rank: int,
    exitcode: int,
    state: Record | None,
    failures: dict[int, Any],
    victims: dict[int, Failure],
    crash: str = "",
    states: dict[int, Record] | None = None,
    frames: Frames | None = None,
) -> tuple[str, int]:
    """A rank that left without an exception (``sys.exit``, the end of its script, a signal)
    while its peers still needed it; ``crash``: where a fatal signal killed it, ``frames``: the
    user's frames it died in; ``states``: every rank's record (a rank that aborted inside a
    collective its peers passed other shapes is told so; one that aborted in a collective it
    reached under a rank test, which its peers skipped into another, is told that)."""
    how = describe_exit(exitcode) if exitcode != 0 else "exited with code 0"
    how += crash
    where = ""
    if state is not None:
        # a script that calls torch.distributed itself counts no backward pass: none is said
        passes = f" {passes_words(state)}" if state.passes else ""
        last = (
            f"; its last collective: {state.operation} at {place(state)}" if state.sequence else ""
        )
        where = f"{passes}{last}"
    lines = [f"{PREFIX} rank {rank} {how}{where}, while its peers were still running"]
    aborted = exitcode == -signal.SIGABRT and state is not None and state.state == IN_COLLECTIVE
    if aborted and state is not None and other_shapes(states or {}, state):
        # gloo's "Received data size doesn't match expected size": the records say which
        lines += shapes_words(states or {}, state, place)
    elif aborted and state is not None and (guarded := guarded_call(state, frames or [])):
        # gloo matched this rank's collective with another one its peers went on to
        peers = sorted(r for r in (states or {}) if r != rank)
        lines.append(guarded_words(rank, guarded, peers, "went on to other collectives"))
    elif aborted and state is not None and (met := _met_elsewhere(states or {}, state)):
        # gloo matched this rank's collective with another one a peer made at the same count
        lines += _mismatch_words(rank, state, met)
    elif aborted and state is not None:
        # NCCL's own checks, or shapes the records did not keep (a peer went on past them)
        lines.append(
            f"{PREFIX} rank {rank} aborted inside {state.operation}: the communication library "
            "aborts a rank when the ranks pass it tensors of different sizes or dtypes, or when "
            "one rank's collective meets another collective of its peers; the ranks' records "
            "do not say which: compare what each rank passes to the collective at "
            f"{place(state)}, and look for a collective before it that runs under a condition "
            "that differs between ranks (is_main_process, a rank's own metric)"
        )
    lines += _victim_lines(victims, exclude=rank)
    if exitcode == 0:
        lines.append(
            f"{PREFIX} rank {rank} left the loop the others were still in: every rank must run "
            f"as many steps ({AGREED_BREAK})"
        )
    lines.append(f"{PREFIX} the other ranks were stopped")
    return "\n".join(lines), _exit_code(exitcode)


def _met_elsewhere(states: dict[int, Record], state: Record) -> dict[int, Record]:
    """The peers whose collective of the same count as ``state``'s is another call (an
    operation, or a guarded call site): ``accelerator.gather`` under ``if is_main_process:``
    on rank 0 met by rank 1's ``gather_object`` a line later. Each rank counts the collectives it
    enters, so the same count on two ranks is the one collective the backend paired."""
    return {
        rank: peer
        for rank, peer in sorted(states.items())
        if rank != state.rank
        and peer.sequence == state.sequence
        and peer.where
        and _another_call(state, peer)
    }


def _another_call(one: Record, other: Record) -> bool:
    """Another operation; or the same one from another line where either line runs under a
    rank test (``if is_main: out = gather(a) else: out = gather(b)`` is one collective)."""
    if one.operation != other.operation:
        return True
    return one.where != other.where and (
        guarded_call(one, []) is not None or guarded_call(other, []) is not None
    )


def _mismatch_words(
    rank: int,
    state: Record,
    met: dict[int, Record],
    then: str = "the communication library aborts",
    own_guard: bool = False,
) -> list[str]:
    """Each rank's collective and line, ``rank``'s first, and the guard of the call under one:
    ``rank``'s own with ``own_guard`` (an aborted rank's own is said before this), else a
    peer's."""
    each = [f"rank {rank} in {state.operation} at {place(state)}"] + [
        f"rank {peer} in {record.operation} at {place(record)}" for peer, record in met.items()
    ]
    lines = [
        f"{PREFIX} mismatched collectives (#{state.sequence} of each rank): "
        + "; ".join(each)
        + f": a collective one rank makes alone meets another one of its peers, and {then}"
    ]
    own = guarded_call(state, []) if own_guard else None
    if own is not None:
        lines.append(guarded_words(rank, own, sorted(met), "went on to another collective"))
        return lines
    for peer, record in met.items():
        guarded = guarded_call(record, [])
        if guarded is not None:
            lines.append(guarded_words(peer, guarded, [rank], "went on to another collective"))
            return lines
    return lines


#: Signals on which the rank's faulthandler dumps its stack (`collective_record.install`).
FATAL_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)


def _crash_frames(records: Path, attempt: int, rank: int, exitcode: int) -> Frames:
    """The user's frames a rank was in when a fatal signal killed it (a segfault in an
    extension, an abort in a C++ library), oldest first; none for any other end."""
    if -exitcode not in FATAL_SIGNALS:
        return []
    return crash_stack(collective_record.attempt_directory(records, attempt), rank)


def _crash_place(frames: Frames) -> str:
    """`` at train.py:10 (`lib.run(x)`)``: the innermost of them."""
    return f" at {source_place(frames[-1][0], frames[-1][1])}" if frames else ""


def _exit_call(records: Path, attempt: int, rank: int) -> str:
    """`` (sys.exit at train.py:40 (`sys.exit(3)`))``: the user's line a rank left from."""
    directory = collective_record.attempt_directory(records, attempt)
    at = exit_place(directory, rank)
    if at is None:
        return ""
    return f" ({exit_call(directory, rank)} at {source_place(*at)})"


_BEFORE_ANY_COLLECTIVE = "on their own before any collective call"


def _all_left_parsing_arguments(
    exited: dict[int, int], states: dict[int, Record], records: Path, attempt: int
) -> tuple[str, int] | None:
    """Every rank left through ``SystemExit(2)`` raised outside the script's own code, before
    any collective: argparse's (or click's) usage error, which printed the usage on each rank
    and no traceback (`failure_record.record_exit` records a ``sys.exit`` of the script's own,
    not a library's). "Each failed with exit code 2 (their tracebacks are above)" sent the user
    looking for tracebacks there were none of."""
    directory = collective_record.attempt_directory(records, attempt)
    if set(exited.values()) != {2} or not _all_left(exited, states):
        return None
    if any(exit_place(directory, rank) is not None for rank in exited):
        return None  # the script's own sys.exit(2): the report names its line
    return f"{PREFIX} every rank exited 2 (the script's argument parsing: usage above)", 2


def _all_left(exited: dict[int, int], states: dict[int, Record]) -> bool:
    """Every rank of ``exited`` recorded that it was leaving through ``SystemExit`` (no
    exception of its own, so no traceback printed)."""
    return all(
        (state := states.get(rank)) is not None and state.state == LEAVING for rank in exited
    )


def _all_exited(exited: dict[int, int], first: int, states: dict[int, Record]) -> tuple[str, int]:
    """Several ranks ended on their own (``exited``: rank -> the code each left with) before
    any collective call (an exception at the top of the script, or after ``Accelerator()`` but
    before its first collective, or a ``sys.exit`` there): each printed its traceback, none is
    the others' victim, and which came first (``first``) is known only as well as the records
    say. "Rank 0 failed, while its peers were still running" said the peers were fine. The
    words say only what the records show: no rank had made a collective call. ("Before
    accelify's runtime started" was said too, false as soon as the ranks' records began, which
    is with the script.) A rank the agent stopped while it was still leaving with its own code
    is said with that code, not the agent's SIGTERM."""
    codes = set(exited.values())
    *most, last = sorted(exited)
    ranks = f"{', '.join(map(str, most))} and {last}"
    if len(codes) == 1:
        how = describe_exit(next(iter(codes)))
        lines = [f"{PREFIX} ranks {ranks} each {how}, {_BEFORE_ANY_COLLECTIVE}"]
    else:
        each = ", ".join(f"rank {r} {describe_exit(code)}" for r, code in sorted(exited.items()))
        lines = [f"{PREFIX} {each}, {_BEFORE_ANY_COLLECTIVE}"]
    if any(code > 0 for code in exited.values()) and not _all_left(exited, states):
        lines[0] += " (their tracebacks are above)"
    return "\n".join(lines), _exit_code(exited[first])


def _unexplained(failures: dict[int, Any], raised: dict[int, Failure]) -> tuple[str, int]:
    """No record says more: the agent's first failure that it did not cause itself. A rank
    that recorded its exception left its traceback to this report (every recorded one says a
    peer had gone, the cause being on another machine): it is printed here, not said to be
    above."""
    rank = min(
        failures,
        key=lambda r: (failures[r].exitcode in AGENT_STOPS, failures[r].timestamp, r),
    )
    code = _exit_code(failures[rank].exitcode)
    how = describe_exit(failures[rank].exitcode)
    recorded = raised.get(rank)
    if recorded is not None:
        return "\n".join([
            f"{PREFIX} rank {rank} {how}; its traceback:",
            recorded.traceback.rstrip(),
            f"{PREFIX} rank {rank} {how}{_at(recorded)}: {_one_line(recorded)}; the other ranks "
            "were stopped",
        ]), code  # fmt: skip
    if failures[rank].exitcode > 0:
        how += " (its traceback is above)"
    return f"{PREFIX} rank {rank} {how}; the other ranks were stopped", code


def _victim_lines(victims: dict[int, Failure], exclude: int | None) -> list[str]:
    return [
        f"{PREFIX} rank {rank} failed because its peer had gone ({_peer_gone(failure)})"
        for rank, failure in sorted(victims.items())
        if rank != exclude
    ]


def _peer_gone(failure: Failure) -> str:
    """``RuntimeError: Connection closed by peer``: the words that make it a victim, not gloo's
    whole message with its source path and ports."""
    kind = failure.summary.split(":", 1)[0]
    words = next((words for words in PEER_GONE if words in failure.summary), "")
    return f"{kind}: {words}" if words and " " not in kind else _one_line(failure)


def _states(records: Path, attempt: int) -> dict[int, Record]:
    return read_all(collective_record.attempt_directory(records, attempt))


def _left_at(state: Record | None, fallback: float) -> float:
    return state.since if state is not None and state.state == LEAVING else fallback


def stopped(signum: int, moment: Moment | None = None) -> tuple[str, int]:
    """Ctrl-C or SIGTERM of the launcher: the agent has stopped every rank; exit as a shell
    does for a process ended by that signal (130 for SIGINT, 143 for SIGTERM). ``moment``: the
    ranks' records as the signal came (`Watcher.halt`), before any rank was told: a line for
    each says what it was doing (a Ctrl-C is often how a run that seems stuck is ended)."""
    lines = [f"{PREFIX} stopped by {_signal_name(signum)}; every rank was stopped"]
    if moment is not None:
        lines += [
            f"  rank {rank} was {doing_words(record, moment)}"
            for rank, record in sorted(moment.ranks.items())
        ]
    return "\n".join(lines), 128 + signum


def stopped_before_any_rank(signum: int) -> tuple[str, int]:
    """Ctrl-C or SIGTERM of the launcher before it started any rank."""
    return f"{PREFIX} stopped by {_signal_name(signum)} before any rank started", 128 + signum


def _at(failure: Failure) -> str:
    """`` at train.py:8 (`print(model(x))`)``: where in the user's code the rank raised."""
    file, _, line = failure.where.rpartition(":")
    return f" at {source_place(file, int(line))}" if file and line.isdigit() else ""


def _one_line(failure: Failure) -> str:
    """The exception's first line; a line torch wrapped mid-sentence (it ends in a space, no
    full stop: DDP's unused-parameter error broke after "..., and by ") goes on with the
    next, a few at most, until its sentence ends."""
    lines = [line for line in failure.summary.splitlines() if line.strip()]
    if not lines:
        return "an exception"
    if WORKER_TRACEBACK in failure.summary:
        return f"{lines[-1]} (in a DataLoader worker)"
    joined, last = lines[0].strip(), lines[0]
    for line in lines[1:_WRAPPED_LINES]:
        if not last[-1:].isspace() or joined.endswith(_SENTENCE_ENDS):
            break
        joined, last = f"{joined} {line.strip()}", line
    return joined


#: how many lines of a wrapped sentence the one-line summary takes
_WRAPPED_LINES = 4
_SENTENCE_ENDS = (".", "!", "?", ":", ")", "]", "'", '"', "`")

#: what DDP's own advice means in accelify terms, for errors whose text names a DDP argument
#: the script never passes (the Accelerator builds the DDP wrapper)
_ACCELIFY_FIXES = (
    (
        "Expected to have finished reduction in the prior iteration",
        "some parameters of the prepared model got no gradient in a step (a branch the forward "
        "did not take, a head the loss does not use, or a model inside another that another "
        "optimizer trains): create the Accelerator with "
        "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters="
        "True)])` (`from accelify import DistributedDataParallelKwargs`), or make every "
        "parameter take part in the loss",
    ),
)


def _accelify_fix(failure: Failure) -> list[str]:
    """A line with accelify's fix for an error whose own advice is DDP's constructor."""
    return [f"{PREFIX} {fix}" for marker, fix in _ACCELIFY_FIXES if marker in failure.summary][:1]


def _exit_code(exitcode: int) -> int:
    """A rank's exit code, or 128 + N for a rank killed by signal N, as a shell reports it."""
    return exitcode if exitcode > 0 else 128 - exitcode if exitcode < 0 else 1


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
