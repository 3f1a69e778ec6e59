"""Every process of a run dies with the one that started it, even when that one is killed by
SIGKILL and runs no cleanup of its own.

A launcher killed by SIGKILL (the out-of-memory killer, ``kill -9``, a scheduler ending a job)
left its template, its rank clients and every rank running: a script sleeping an hour, or
training on, unseen, holding its GPUs (torchrun has the same weakness). Each process the
launcher starts asks the kernel to kill it when the launcher dies (Linux's
``PR_SET_PDEATHSIG``): the template and the clients, which the launcher (its agent) starts
itself, and a rank started fresh by the agent; a rank forked from the template dies with the
template (`rank_template`). The kernel sends the signal when the *thread* that started the
process exits: the launcher starts every process from its main thread, which lives as long as
the run. The launcher's pid travels in the environment (`LAUNCHER`), which all of them inherit.

A ``--no-python`` rank runs nothing of accelify: the agent starts it through this file,
``python -I -S lifeline.py PROGRAM ARGS`` (`command`), which asks for the signal and then
executes the program in its own place (same pid, same streams and environment; the request
holds across ``exec``). What the program starts in turn is its own to stop, as a Python rank's
subprocesses are.

Standard library only (the rank client keeps its own copy: it imports nothing of accelify).
"""

from __future__ import annotations

import signal

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # first thing: a Ctrl-C before the program runs ends this process as it would end the
    # program (SIGINT was at its default as Python started), without a traceback from here
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import contextlib
import os
import sys

#: The launcher's pid, set in its environment before it starts any process of the run
LAUNCHER = "ACCELIFY_LAUNCHER_PID"
#: prctl's option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1


def die_with(parent: int, signum: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signum`` to this process when ``parent``, the process that
    started it, dies. A parent that died before the request (this process was already handed
    to another) is dead for good: the signal is sent now. Not Linux: nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def die_with_the_launcher(environ: dict[str, str] | None = None) -> None:
    """For a process the launcher starts itself: die with it. A process started by another
    (a rank's own subprocess that inherited the variable) is left as it is, unless the
    launcher is gone already, which leaves this process an orphan of the run."""
    value = (os.environ if environ is None else environ).get(LAUNCHER, "")
    if not value.isdigit():
        return
    launcher = int(value)
    if os.getppid() == launcher:
        die_with(launcher)
    elif not alive(launcher):
        os.kill(os.getpid(), signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: another user's counts as running; a zombie its parent has
    not collected does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    with (
        contextlib.suppress(OSError),
        open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as status,
    ):
        return status.read().rpartition(")")[2].split()[0] != "Z"
    return True


def command() -> list[str]:
    """What the agent runs before a ``--no-python`` rank's program and its arguments, so that
    the program dies with the launcher (`run_tied`); nothing where the kernel has no such
    request (not Linux)."""
    if not sys.platform.startswith("linux"):
        return []
    return [sys.executable, "-I", "-S", os.path.abspath(__file__)]


def run_tied(arguments: list[str]) -> None:
    """Die with the launcher, then become ``PROGRAM ARGS`` as torchrun's agent starts it: found
    on ``PATH``, with the signals Python ignores as it starts (SIGPIPE, SIGXFSZ) back at their
    defaults, as ``subprocess`` leaves them for a child it starts."""
    die_with_the_launcher()
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(arguments[0], arguments)
    except OSError as error:
        sys.stderr.write(f"accelify launch: cannot run {arguments[0]}: {error.strerror}\n")
        os._exit(127)  # as a shell says of a command it cannot run


if __name__ == "__main__":
    run_tied(sys.argv[1:])
