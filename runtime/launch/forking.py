"""What the three places that fork runs from a process that imported torch once share: the
ranks of `accelify launch` (`rank_template`), `accelify verify`'s runs (`accelify.verify.forks`)
and the tests' launchers and scripts (tests/fork_server.py).

Standard library only at import: torch is imported by `share_what_every_run_loads`.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import random
import socket
import sys
import threading
from collections.abc import Callable
from importlib.machinery import EXTENSION_SUFFIXES as _EXTENSION_SUFFIXES
from pathlib import Path

#: The exit handlers the imports of `share_what_every_run_loads` registered (torch's, logging's,
#: multiprocessing's, ...), in their order: (function, args, kwargs)
IMPORTS_EXIT_HANDLERS: list[tuple[Callable[..., object], tuple, dict]] = []
#: Every `random.Random` those imports made, module-level or not (sympy's ``Dummy._prng``)
_IMPORTED_GENERATORS: list[random.Random] = []


def share_what_every_run_loads() -> None:
    """torch, and torch._dynamo too (every run imports it at its first optimizer: torch wraps
    the optimizer's constructor in ``torch._disable_dynamo``, 1.25 CPU-seconds, as much as
    torch), and what is loaded by then frozen (`gc.freeze`): no run's collections, nor its last
    one at exit, walk those objects, so no run copies their pages (a run of a script that
    builds an optimizer: 2.5 -> 0.3 CPU-seconds of its exit, measured). A torch without dynamo
    just skips it. Neither import draws from torch's or Python's random generators, nor starts
    a Python thread; torch._dynamo sets ``TORCHINDUCTOR_CACHE_DIR`` when it is not set (a run
    that imports it later would too). numpy (imported by torch._dynamo) starts OpenBLAS's
    threads, which OpenBLAS stops before any fork (``pthread_atfork``) and starts again at a
    fork's first call that needs them. The exit handlers the imports register are kept
    (`IMPORTS_EXIT_HANDLERS`): a rank's entry registers its own before torch's, as a fresh rank
    does (`accelify.runtime.rank_entry.main`)."""
    import atexit
    import gc

    register = atexit.register

    def recorded(function: Callable[..., object], *args: object, **kwargs: object) -> object:
        IMPORTS_EXIT_HANDLERS.append((function, args, kwargs))
        return register(function, *args, **kwargs)

    atexit.register = recorded
    try:
        import torch

        with contextlib.suppress(ImportError):
            import torch._dynamo  # noqa: F401
    finally:
        atexit.register = register
    gc.collect()
    _IMPORTED_GENERATORS[:] = [value for value in gc.get_objects() if type(value) is random.Random]
    gc.freeze()


def seed_again() -> None:
    """Seed again, from the system's entropy, each random generator a fresh process seeds that
    way as it starts or imports: a fork would otherwise draw what its template and every other
    fork draw (two ranks with the same dropout masks, the same shuffles). torch's default CPU
    generator (seeded by ``getNonDeterministicRandom`` as torch starts; CUDA's are seeded with a
    fixed value when CUDA starts, and are left as they are), numpy's global state
    (``seed(None)``, as its import) and each ``random.Random`` a module holds or the imports
    made (sympy's, which torch._dynamo imports). Python seeds `random`'s own at every fork. A
    value a library drew once as it was imported stays the template's, as Python's string hash
    seed does: sympy's ``Dummy._base_dummy_index`` (drawing it again could give a new Dummy the
    index of one made during the imports)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    generators = {id(value): value for value in _IMPORTED_GENERATORS}
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if type(value) is random.Random:
                generators[id(value)] = value
    for value in generators.values():
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


def streams_as_started() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` (and their ``sys.__std*__``) made again
    over fds 0, 1, 2 the way Python makes them as it starts: a text stream notes whether its
    file can seek, and a tty's line buffering, as it is made, and this process's were made over
    its own streams (pipes), a run's may be files (``--log-dir``) or a terminal. Nothing is
    left in the old ones (they write through, and stdin was never read here); they stay open
    for whatever holds them (a logging handler made by an import writes to the same fd)."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        if not isinstance(old, io.TextIOWrapper):
            continue
        unbuffered = old.write_through  # `-u`: Python makes stdout and stderr unbuffered
        try:
            buffering = 0 if unbuffered and mode == "w" else -1
            buffer = open(fd, f"{mode}b", buffering=buffering, closefd=False)  # noqa: SIM115
        except OSError:  # a closed fd: Python leaves the stream None
            continue
        raw = buffer if isinstance(buffer, io.FileIO) else buffer.raw
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(
            buffer,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)),
            write_through=unbuffered,
        )
        stream.mode = mode
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


_PARSE_LOCK = threading.Lock()

#: What a file runs before torch is imported (`opening`)
TORCH_FIRST = "torch first"
STANDARD_ONLY = "standard library only"
OWN_FIRST = "own statement first"
#: Names of variables torch._dynamo (and torch._inductor's config) read as they are imported:
#: a run that names one may set it after importing torch, before its first optimizer imports
#: torch._dynamo, which its template imported already
READ_AT_DYNAMO_IMPORT = ("TORCHDYNAMO", "TORCHINDUCTOR", "TORCH_COMPILE", "TORCH_LOGS")


def imports_torch_first(script: Path) -> bool:
    """Whether the script imports torch before any statement of its own (its docstring and
    imports of the standard library may come first): its run, forked from a process that
    imported torch with the same environment, is then what a fresh start gives it. A script
    that runs anything first may set a variable that torch reads as it is imported."""
    try:
        source = script.read_bytes()
    except OSError:
        return False
    folder = os.path.dirname(os.path.realpath(script))  # first on `python SCRIPT`'s path
    return opening(source, folder) == TORCH_FIRST


def opening(source: bytes, first: str | None) -> str:
    """What the source runs before torch is imported: TORCH_FIRST (only its docstring and imports
    of the standard library, then an import of torch), STANDARD_ONLY (only those, and no torch:
    a package's ``__init__.py`` that runs nothing of its own) or OWN_FIRST (anything else, a
    third-party import included: it may set a variable torch reads, or load another OpenMP
    first). Names are taken in the order they are imported (``import numpy, torch`` imports
    numpy first). ``first``: the folder first on the run's path, where a file named as a
    standard module (or torch) is imported in its place: a module of the user's, OWN_FIRST."""
    try:
        # one parse at a time: CPython 3.11's AST validator keeps its recursion depth in
        # interpreter-wide state, and two threads parsing at once fail with "SystemError: AST
        # constructor recursion depth mismatch" (the tests start runs from several threads)
        with _PARSE_LOCK:
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return OWN_FIRST
    shadows = module_names_in(first)
    for index, statement in enumerate(tree.body):
        if index == 0 and isinstance(statement, ast.Expr):
            continue
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and not statement.level:
            names = [statement.module or ""]
        else:
            return OWN_FIRST
        for top in (name.partition(".")[0] for name in names):
            if top in shadows:
                return OWN_FIRST
            if top == "torch":
                return TORCH_FIRST
            if top not in sys.stdlib_module_names and top != "__future__":
                return OWN_FIRST
    return STANDARD_ONLY


def module_names_in(folder: str | None) -> frozenset[str]:
    """The top-level modules and packages a folder first on the path would provide."""
    if folder is None:
        return frozenset()
    try:
        entries = os.listdir(folder)
    except OSError:
        return frozenset()
    names = set()
    for entry in entries:
        stem, dot, suffix = entry.partition(".")
        if (dot and suffix in ("py", "pyc")) or entry.endswith(tuple(_EXTENSION_SUFFIXES)):
            names.add(stem)
        elif not dot and os.path.isfile(os.path.join(folder, entry, "__init__.py")):
            names.add(entry)
    return frozenset(names)


def dynamo_variable_named(source: bytes) -> str | None:
    """The prefix of a variable torch._dynamo reads as it is imported that the source names."""
    return next((name for name in READ_AT_DYNAMO_IMPORT if name.encode() in source), None)
