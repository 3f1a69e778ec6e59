"""What torch's elastic agent starts for each rank when the launcher forks the ranks from a
template (`accelify.runtime.launch.rank_template`):
``python -I -S rank_client.py SOCKET RANK_ARGS``.

The agent keeps seeing one process per rank, this one: its pid, its exit code (the rank's; a rank
killed by signal N kills this process with N), the signals it sends (SIGTERM, SIGINT, ... are
passed on to the rank's process group, as the agent's ``killpg`` reaches a fresh rank's), its
environment, working directory and standard streams (handed to the rank as they are: the
agent's per-rank log files, ``--tee``). If this process dies (SIGKILL), the template kills the
rank; it dies with the launcher, even one killed by SIGKILL (`_die_with_the_launcher`). If the
template refuses the rank (its environment differs from the template's in a variable
read as torch starts) or cannot be reached, this process becomes the rank itself by executing
``python -u -m accelify.runtime.rank_entry RANK_ARGS``: today's fresh start, the command torchrun
runs with ``--module``.

A signal that comes before the rank is forked (Ctrl-C in the first seconds of a launch, while
the template still imports torch) ends this process at once, as it would have ended a rank that
had not yet set a handler of its own: no KeyboardInterrupt traceback from here, and no rank
forked for a client that is gone (the template drops its request: `rank_template`).

Standard library only, started without ``site``: it costs a few milliseconds, not torch's import.
"""

from __future__ import annotations

import signal

#: The signals passed on to the rank: those the agent and a user send to stop a run, and the
#: ones a script may handle itself.
RELAYED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: The signals that came while this module was imported, before `main` can act on them
_EARLY: list[int] = []
for _signum in RELAYED:  # first thing: Python's own SIGINT handler would raise in an import
    signal.signal(_signum, lambda signum, _frame: _EARLY.append(signum))

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

#: The module a fresh rank starts with (`accelify.runtime.rank_entry`; kept here as text: this
#: file imports nothing of accelify).
RANK_ENTRY = "accelify.runtime.rank_entry"
#: The connection on which the template forked the rank, once it has: signals go there
_FORKED: list[socket.socket] = []
#: The signal that stopped this process before the rank was forked
_STOPPED: list[int] = []
#: The launcher's pid, in the environment it starts this process with, and prctl's option
#: (`accelify.runtime.launch.lifeline`, kept here: this file imports nothing of accelify)
LAUNCHER = "ACCELIFY_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1


class _Stopped(BaseException):
    """A relayed signal came before the rank was forked."""


def _on_signal(signum: int, _frame: object) -> None:
    """Pass the signal on to the rank, once forked; before, stop (once: a second signal while
    this process ends is let go)."""
    if _FORKED:
        with contextlib.suppress(OSError):  # the template is gone: `_line` sees it
            _FORKED[0].sendall(f"signal {signum}\n".encode())
    elif not _STOPPED:
        _STOPPED.append(signum)
        raise _Stopped


def main(arguments: list[str]) -> None:
    path, rank_arguments = arguments[0], arguments[1:]
    try:
        for signum in RELAYED:
            signal.signal(signum, _on_signal)
        _die_with_the_launcher()
        if _EARLY:
            _on_signal(_EARLY[0], None)
        connection = _ask(path, rank_arguments)
        if connection is None:
            _fresh(rank_arguments)  # its handlers are Python's own from its start
    except _Stopped:
        # the connection closes as this process ends: the template drops the request, or
        # kills the rank it forked just as the signal came (a client gone takes its rank)
        _exit_as(-_STOPPED[0])
    _exit_as(_relay(connection))


def _die_with_the_launcher() -> None:
    """Killed (SIGKILL) when the launcher that started this process dies, however it dies: the
    template then kills the rank (a client gone takes its rank), and a client that became a
    fresh rank (`_fresh`) keeps the request across ``exec``. A launcher gone already: now."""
    value = os.environ.get(LAUNCHER, "")
    if not value.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(value):
        os.kill(os.getpid(), signal.SIGKILL)


def _ask(path: str, rank_arguments: list[str]) -> socket.socket | None:
    """The connection on which the template forked the rank; None: start fresh."""
    request = {
        "argv": rank_arguments,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    message = json.dumps(request).encode() + b"\n"
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        sent = socket.send_fds(connection, [message], [0, 1, 2])
        connection.sendall(message[sent:])
        answer = _line(connection)
    except OSError:
        answer = ""
    if not answer.startswith("started "):
        connection.close()  # refused (or the template is gone): the rank was never forked
        return None
    _FORKED.append(connection)
    return connection


def _line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        more = connection.recv(1)  # a line at a time: what follows is read by `_relay`
        if not more:
            return ""
        data += more
    return data.decode().strip()


def _fresh(rank_arguments: list[str]) -> None:
    """Become the rank, started as torchrun starts one with ``--module``."""
    python = sys.executable
    os.execv(python, [python, "-u", "-m", RANK_ENTRY, *rank_arguments])


def _relay(connection: socket.socket) -> int:
    """Wait, passing signals on (`_on_signal`), until the template says the rank ended; its
    code as `subprocess.Popen.returncode`. The template ending first (killed) ends the rank as
    SIGKILL."""
    while True:
        try:
            answer = _line(connection)
        except InterruptedError:
            continue
        except OSError:  # the template was killed (ECONNRESET): as its end, below
            answer = ""
        if not answer:
            return -signal.SIGKILL
        word, _, value = answer.partition(" ")
        if word == "ended":
            return int(value)


def _exit_as(code: int) -> None:
    """Exit as the rank did: with its code, or killed by its signal."""
    if code >= 0:
        os._exit(code)
    signum = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor needs to be
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default is not to end the process


if __name__ == "__main__":
    main(sys.argv[1:])
