"""``python tests/fork_server.py SOCKET``: import torch once, then start each run a test asks for
(`python -m accelify launch ...`, `python SCRIPT ...`) as a fork of this process, set up as if it
had been started on its own, the way `accelify verify` forks its runs (accelify/verify/forks.py)
and `accelify launch` its ranks (accelify.runtime.launch.rank_template), with the parts they share
(`accelify.runtime.launch.forking`).

Every launch's launcher and every script's run imports torch first (2 CPU-seconds a process, a
third of a 2-rank launch): here it is imported once per test process. The tests' side
(`conftest.start`) sends a run here only where that import is all that is shared: the launcher
imports torch before it reads or sets anything torch reads, a script only when it imports torch
before any statement of its own, and only with the environment this process imported torch with
(variables that torch, Python or their libraries read as they start are the same). The ranks a
launch starts are not forked here: the launch forks them from a template of its own.

Two more things every training run pays for are paid here once. torch._dynamo (with sympy): torch
imports it at the first optimizer a process builds (`torch.optim.Optimizer.__init__` is wrapped by
`torch._disable_dynamo`, which imports it on its first call), 1.25 CPU-seconds, as much as torch
itself; nothing it imports reads a variable that `conftest.PER_TEST_VARIABLES` lets differ (its
configuration's variables are read as it is imported, so a script that sets one after importing
torch and before its first optimizer would see it read here: none of the suite's does). And
Python's teardown of what was imported: the objects this process holds as it starts serving are
frozen (`gc.freeze`), so a run's collections, and its final one, never walk them, and the pages
that hold them stay shared instead of being copied into each run as it exits (a run of a script
that builds an optimizer: 2.5 -> 0.3 CPU-seconds, measured). The objects frozen live as long as
the process anyway; the runtime's own search for what holds a process group unfreezes first, as it
does in a rank (`accelify.runtime.rank_entry` freezes what torch made the same way).

Protocol, one Unix-socket connection per run: the test sends one JSON line (``argv``: what follows
``python``; ``cwd``; ``env``) with its stdin, stdout and stderr attached (SCM_RIGHTS); this process
forks, answers ``PID`` on a line, and ``CODE`` on another when the run has ended (as
`subprocess.Popen.returncode`: -N for signal N). The run is a session of its own
(``start_new_session``), in its folder, with exactly the environment sent, its own ``sys.argv``,
``sys.path[0]``, ``__main__``, random generators seeded again as a fresh process seeds them
(`accelify.runtime.launch.forking.seed_again`) and exit: the interpreter's usual one (``atexit``
handlers, threads joined, its exit code; an uncaught exception goes through ``sys.excepthook``,
exit 1). This process ends when its stdin closes (the test process ended).
"""

from __future__ import annotations

import builtins
import os
import runpy
import selectors
import signal
import socket
import sys
import types

from accelify.runtime.launch import forking

MAX_FDS = 3


def main() -> None:
    # the point: torch once, for every run, and torch._dynamo, which a run's first optimizer
    # imports; then frozen: what the runs share is never walked nor copied
    forking.share_what_every_run_loads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    os.write(1, b"ready\n")
    request = _serve(listener)  # returns only in a forked run
    _run(request)


def _serve(listener: socket.socket) -> dict:
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(0, selectors.EVENT_READ, "stdin")
    running: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(0, 4096):
                    os._exit(0)  # the test process ended
            elif key.data == "child":
                os.read(wake_read, 4096)
                _reap(running)
            else:
                connection, _ = listener.accept()
                request, fds = forking.receive(connection, MAX_FDS)
                if request is None:
                    connection.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for fd in (wake_read, wake_write):
                        os.close(fd)
                    for other in (listener, connection, *running.values()):
                        other.close()
                    request["fds"] = fds
                    return request
                forking.close_all(fds)
                running[pid] = connection
                forking.send(connection, f"{pid}\n")
        _reap(running)  # a SIGCHLD that came between two selects


def _reap(running: dict[int, socket.socket]) -> None:
    for pid, code in forking.reap(running):
        connection = running.pop(pid)
        forking.send(connection, f"{code}\n")
        connection.close()


def _run(request: dict) -> None:
    """What starting ``python ARGV...`` in its own session would have given the run."""
    os.setsid()
    forking.take_streams(request["fds"])
    forking.streams_as_started()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    forking.seed_again()
    forking.multiprocessing_as_started_here()
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file first
        if not sys.flags.safe_path:  # `python -m` puts its working directory first (not -P)
            sys.path[0] = os.getcwd()
        _as_main(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True))
    else:
        script = os.path.abspath(argv[0])  # `python SCRIPT`'s __file__ and tracebacks
        sys.argv = list(argv)
        if not sys.flags.safe_path:  # `python SCRIPT` puts its folder first (not with -P)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec", dont_inherit=True)
        module = types.ModuleType("__main__")
        module.__file__ = script
        module.__builtins__ = builtins
        sys.modules["__main__"] = module  # for the life of the process, as `python SCRIPT`
        _as_main(lambda: exec(code, module.__dict__))


def _as_main(run: types.FunctionType) -> None:
    """An uncaught exception is reported from the script's own frames on (this module's are cut,
    as the interpreter's would be none), then exits 1; SystemExit and KeyboardInterrupt leave
    as they would leave a fresh interpreter."""
    try:
        run()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:
        traceback = error.__traceback__
        while traceback is not None and traceback.tb_frame.f_code.co_filename == __file__:
            traceback = traceback.tb_next
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        sys.exit(1)


if __name__ == "__main__":
    main()
