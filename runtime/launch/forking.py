"""What the three places that fork runs from a process that imported torch once share: the
ranks of `accelify launch` (`rank_template`), `accelify verify`'s runs (`accelify.verify.forks`)
and the tests' launchers and scripts (tests/fork_server.py).

Standard library only at import: torch is imported by `share_what_every_run_loads`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import random
import socket
import sys
import threading
from pathlib import Path


def share_what_every_run_loads() -> None:
    """torch, and torch._dynamo too (every run imports it at its first optimizer: torch wraps
    the optimizer's constructor in ``torch._disable_dynamo``, 1.25 CPU-seconds, as much as
    torch), and what is loaded by then frozen (`gc.freeze`): no run's collections, nor its last
    one at exit, walk those objects, so no run copies their pages (a run of a script that
    builds an optimizer: 2.5 -> 0.3 CPU-seconds of its exit, measured). A torch without dynamo
    just skips it. Neither import draws from torch's or Python's random generators, nor starts
    a Python thread; torch._dynamo sets ``TORCHINDUCTOR_CACHE_DIR`` when it is not set (a run
    that imports it later would too)."""
    import gc

    import torch

    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401
    gc.collect()
    gc.freeze()


def seed_again() -> None:
    """Seed again, from the system's entropy, each random generator a fresh process seeds that
    way as it starts or imports: a fork would otherwise draw what its template and every other
    fork draw (two ranks with the same dropout masks, the same shuffles). torch's default CPU
    generator (seeded by ``getNonDeterministicRandom`` as torch starts; CUDA's are seeded with a
    fixed value when CUDA starts, and are left as they are), numpy's global state
    (``seed(None)``, as its import) and each ``random.Random`` a module holds (sympy's, which
    torch._dynamo imports). Python seeds `random`'s own at every fork."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if type(value) is random.Random:
                value.seed()


def multiprocessing_as_started_here() -> None:
    """What `multiprocessing` takes from the process as it is imported: the folder a spawned
    child starts in (``ORIGINAL_DIR``, the working directory then) and the main process's
    authentication key (random). A fork has its own, as a fresh process importing it would."""
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        process.ORIGINAL_DIR = os.path.abspath(os.getcwd())
        process.current_process().authkey = os.urandom(32)


def receive(connection: socket.socket, max_fds: int) -> tuple[dict | None, list[int]]:
    """One JSON line and the fds sent with it (SCM_RIGHTS); None: the peer left first."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, max_fds)
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 16)
        if not more:
            close_all(fds)
            return None, []
        data += more
    return json.loads(data), list(fds)


def send(connection: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):  # the peer stopped waiting (it failed, or was killed)
        connection.sendall(line.encode())


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def reap(running: dict[int, object]) -> list[tuple[int, int]]:
    """The runs of ``running`` that have ended, with their codes as
    `subprocess.Popen.returncode` (-N: signal N)."""
    ended = []
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in running:
            ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def take_streams(fds: list[int]) -> None:
    """The streams sent become this process's 0, 1, 2. Python's ``sys.std*`` write through to
    whatever those fds are (the runs start with ``-u``, or with the same kind of streams)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)


_PARSE_LOCK = threading.Lock()


def imports_torch_first(script: Path) -> bool:
    """Whether the script imports torch before any statement of its own (its docstring and
    imports of the standard library may come first): its run, forked from a process that
    imported torch with the same environment, is then what a fresh start gives it. A script
    that runs anything first may set a variable that torch reads as it is imported."""
    try:
        # one parse at a time: CPython 3.11's AST validator keeps its recursion depth in
        # interpreter-wide state, and two threads parsing at once fail with "SystemError: AST
        # constructor recursion depth mismatch" (the tests start runs from several threads)
        with _PARSE_LOCK:
            tree = ast.parse(script.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for index, statement in enumerate(tree.body):
        if index == 0 and isinstance(statement, ast.Expr):
            continue
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and not statement.level:
            names = [statement.module or ""]
        else:
            return False
        tops = [name.partition(".")[0] for name in names]
        if "torch" in tops:
            return True
        if not all(top in sys.stdlib_module_names or top == "__future__" for top in tops):
            return False
    return False
