"""The template `accelify launch` forks its ranks from: ``python -u -m
accelify.runtime.launch.rank_template FD``, started by the launcher once per launch on each
machine, before torch's elastic agent starts any rank, with the environment the ranks will get
(`rank_start`). It imports what every rank imports first (torch, torch._dynamo, the rank's entry),
freezes it (`forking.share_what_every_run_loads`), then serves the listening socket FD: each rank
client (`rank_client`) sends its arguments, environment, working directory, CPU affinity and
standard streams, and this process forks the rank, set up as the command torchrun would have run
(``python -u -m accelify.runtime.rank_entry ARGS``) from there on.

A rank is refused (the client then starts it fresh) when its start could differ from a fresh
one's: an environment that differs from this process's start in any variable but the ones the
agent sets per rank and nothing reads as Python or torch start (`PER_RANK`), another CPU
affinity, a Python thread running here, a script whose folder holds a module named as one torch
imported here (the rank would import it with that folder first), or a ``-m`` module whose files,
found on the rank's own path, run a statement before torch (`main_module.fresh_reason`). CUDA
is never initialised here (torch's import does not, nor does torch._dynamo's), so a rank may
start it; were CUDA's driver loaded here all the same, every rank is refused. A fork shares this
process's hash seed (``PYTHONHASHSEED``), as any fixed one; the random generators a fresh process
seeds from the system's entropy are seeded again in each rank (`forking.seed_again`).

The protocol, one connection per rank: the client's JSON line and its fds 0, 1, 2
(SCM_RIGHTS); the answer ``started PID`` or ``refused WHY``; then ``signal N`` lines from the
client, passed on to the rank's process group; ``ended CODE`` (as `subprocess.Popen.returncode`)
when the rank has ended. A client that goes away (killed) takes its rank with it: SIGKILL.
This process ends once its stdin (a pipe from the launcher) has closed and every rank has ended,
and dies with the launcher, and its ranks with it, when the launcher is killed (`lifeline`).
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field

from accelify.runtime.launch import forking, lifeline, main_module, rank_start

#: Variables the elastic agent sets per rank; none is read as Python or torch start
PER_RANK = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_NAME",
        "LOCAL_WORLD_SIZE",
        "WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",  # read as a NCCL process group starts
    }
)
PER_RANK_PREFIX = "TORCHELASTIC_"
#: The command a fresh rank runs (torchrun's ``--module``), what ``sys.orig_argv`` says
RANK_ENTRY = "accelify.runtime.rank_entry"
MAX_FDS = 3


@dataclass
class _Template:
    start_environment: dict[str, str]
    #: what importing torch and torch._dynamo changed in the environment: a fresh rank's import
    #: makes the same changes (torch._inductor's ``TORCHINDUCTOR_CACHE_DIR``)
    imported_changes: dict[str, str | None]
    affinity: list[int]
    running: dict[int, socket.socket] = field(default_factory=dict)
    #: ``sys.path`` as this process started (``python -m``, as a fresh rank starts): a ``-m``
    #: rank's module is looked up on that path, its first folder the rank's own
    start_path: list[str] = field(default_factory=lambda: list(sys.path))
    #: the top-level modules imported here from files (not built in, nor frozen): a fresh
    #: rank may import one with its script's folder first on its path, this process did with
    #: its own (torch's, torch._dynamo's, this module's and the entry's imports)
    imported_tops: frozenset[str] = frozenset()
    #: why a ``-m`` module's rank must start fresh, by module and working directory
    module_reasons: dict[tuple[str, str], str | None] = field(default_factory=dict)


def main() -> None:
    # first: a launcher killed while this process imports torch takes it along
    lifeline.die_with_the_launcher()
    listener = socket.socket(fileno=int(sys.argv[1]))
    start_environment = dict(os.environ)
    affinity = sorted(os.sched_getaffinity(0))
    start_path = list(sys.path)
    import accelify.runtime.rank_entry  # noqa: F401  (and torch, below)

    forking.share_what_every_run_loads()
    imported_tops = frozenset(
        name
        for name, module in list(sys.modules.items())
        if "." not in name and getattr(getattr(module, "__spec__", None), "has_location", False)
    )
    changes = {
        name: os.environ.get(name)
        for name in {*start_environment, *os.environ}
        if os.environ.get(name) != start_environment.get(name)
    }
    template = _Template(
        start_environment,
        changes,
        affinity,
        start_path=start_path,
        imported_tops=imported_tops,
    )
    request = _serve(listener, template)  # returns only in a forked rank
    _become_the_rank(request, template)
    from accelify.runtime import rank_entry

    # torch's exit handlers, registered here as torch was imported, run before the entry's own
    # as in a fresh rank, whose script imports torch after the entry has registered it
    rank_entry.main(request["argv"], forking.IMPORTS_EXIT_HANDLERS)


def refusal(request: dict, template: _Template) -> str | None:
    """Why the rank must start fresh (None: it may be forked)."""
    environment = request["env"]
    differ = sorted(
        name
        for name in {*environment, *template.start_environment}
        if environment.get(name) != template.start_environment.get(name)
        and name not in PER_RANK
        and not name.startswith(PER_RANK_PREFIX)
    )
    if differ:
        return "its environment differs in " + ", ".join(differ)
    if request["affinity"] != template.affinity:
        return "its CPU affinity differs"
    if threading.active_count() != 1:
        return "a thread is running in the template"
    if _cuda_driver_loaded():
        return "CUDA's driver is loaded in the template (a fork could not use it)"
    argv, cwd = request["argv"], request["cwd"]
    if argv[:1] == ["-m"] and len(argv) > 1:
        key = (argv[1], cwd)
        if key not in template.module_reasons:
            path, first = main_module.rank_path(template.start_path, cwd, sys.flags.safe_path)
            template.module_reasons[key] = main_module.fresh_reason(
                argv[1], path, rank_start.ENTRY_PACKAGES, first, loaded=sys.modules
            )
        if template.module_reasons[key] is not None:
            return template.module_reasons[key]
        first = cwd  # `python -m`'s first folder
    elif argv:
        first = os.path.dirname(os.path.join(cwd, argv[0]))  # `python SCRIPT`'s
    else:
        return "no script"
    return None if sys.flags.safe_path else _shadowed(os.path.realpath(first), template)


def _cuda_driver_loaded() -> bool:
    """Whether CUDA's driver library is mapped here: torch's import does not load it (it is
    loaded by CUDA's first call, `torch.cuda.device_count` included), and a process that forks
    after CUDA started leaves its forks a driver they cannot use."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return any(b"/libcuda.so" in line for line in maps)
    except OSError:
        return True  # cannot tell: start the rank fresh


def _shadowed(folder: str, template: _Template) -> str | None:
    """Why a module torch imported here would be another in the rank: the folder first on the
    rank's path (its script's, or its working directory under ``-m``) holds a module of that
    name, and this process imported it with another folder first."""
    if not template.start_path or os.path.realpath(template.start_path[0]) == folder:
        return None
    names = forking.module_names_in(folder) & template.imported_tops
    if names:
        return f"{folder} holds {min(names)}, which torch imports"
    return None


def _serve(listener: socket.socket, template: _Template) -> dict:
    template_pid = os.getpid()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(0, selectors.EVENT_READ, "stdin")
    pids: dict[socket.socket, int] = {}
    accepting = True
    while accepting or template.running:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(0, 4096):  # the launcher ended: no more ranks
                    selector.unregister(0)
                    selector.unregister(listener)
                    listener.close()
                    accepting = False
            elif key.data == "child":
                os.read(wake_read, 4096)
            elif key.data == "accept":
                connection, _ = listener.accept()
                request, fds = forking.receive(connection, MAX_FDS)
                if request is not None and _gone(connection):
                    request = None  # its client was stopped as it waited: no rank to fork
                why = None if request is None else refusal(request, template)
                if request is None or why is not None:
                    forking.send(connection, f"refused {why}\n")
                    forking.close_all(fds)
                    connection.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    # a rank whose template is killed (SIGKILL, the out-of-memory killer, its
                    # launcher's death) is killed too, as one whose client is: an orphaned fork
                    # would go on training unseen (its client reports it dead: SIGKILL)
                    lifeline.die_with(template_pid)
                    selector.close()
                    forking.close_all([wake_read, wake_write])
                    for other in (connection, *template.running.values()):
                        other.close()
                    if accepting:
                        listener.close()
                    request["fds"] = fds
                    return request
                forking.close_all(fds)
                template.running[pid] = connection
                pids[connection] = pid
                selector.register(connection, selectors.EVENT_READ, "client")
                forking.send(connection, f"started {pid}\n")
            else:
                _from_client(key.fileobj, pids, selector)
        for pid, code in forking.reap(template.running):
            connection = template.running.pop(pid)
            if pids.pop(connection, None) is not None and connection.fileno() in selector.get_map():
                selector.unregister(connection)
            forking.send(connection, f"ended {code}\n")
            connection.close()
    os._exit(0)


def _gone(connection: socket.socket) -> bool:
    """Whether the client has closed its end: a client stopped by a signal while this process
    still imported torch leaves its request in the queue, and exits at once."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and not connection.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def _from_client(
    connection: socket.socket, pids: dict[socket.socket, int], selector: selectors.BaseSelector
) -> None:
    """A signal to pass on, or the client gone: its rank goes too."""
    pid = pids[connection]
    try:
        data = connection.recv(4096)
    except OSError:
        data = b""
    if not data:
        selector.unregister(connection)
        _signal(pid, signal.SIGKILL)
        return
    for line in data.decode(errors="replace").splitlines():
        word, _, value = line.partition(" ")
        if word == "signal" and value.isdigit():
            _signal(pid, int(value))


def _signal(pid: int, signum: int) -> None:
    """The rank's process group, as the agent signals a fresh rank's (its own pid only if the
    rank has not made its group yet). The rank is this process's child and not yet reaped: its
    pid is still its own."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _signals_as_a_fresh_rank_gets_them() -> None:
    """torch's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT itself, so a rank it
    executes starts with them at their defaults (SIGINT: KeyboardInterrupt) whatever the
    launcher inherited. The template started before the agent took them and keeps what the
    launcher's shell left: ``accelify launch ... &`` in a script ignores SIGINT and SIGQUIT,
    and a forked rank would ignore the agent's SIGINT (30 s to SIGKILL, no atexit)."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _become_the_rank(request: dict, template: _Template) -> None:
    """What starting ``python -u -m accelify.runtime.rank_entry ARGS`` in the client's place
    would have given the rank (the elastic agent starts each rank in a session of its own)."""
    os.setsid()
    _signals_as_a_fresh_rank_gets_them()
    forking.take_streams(request["fds"])
    forking.streams_as_started()
    os.chdir(request["cwd"])
    environment = dict(request["env"])
    for name, value in template.imported_changes.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    os.environ.clear()
    os.environ.update(environment)
    if not sys.flags.safe_path:  # `python -m` puts its working directory first (not with -P)
        sys.path[0] = os.getcwd()
    sys.argv = [sys.modules[RANK_ENTRY].__file__, *request["argv"]]
    sys.orig_argv = [sys.executable, "-u", "-m", RANK_ENTRY, *request["argv"]]
    forking.seed_again()
    forking.multiprocessing_as_started_here()


if __name__ == "__main__":
    main()
