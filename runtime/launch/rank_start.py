"""How `accelify launch` starts its ranks: forked from a template process that imported torch
once (`rank_template`), or fresh, each importing torch itself (torchrun's ``--module``).

A fresh rank imports torch and torch._dynamo: 2.5 CPU-seconds each, 20 on a node of 8 before the
first step. With the template, the launcher starts one process that imports them once, with the
environment the ranks will get, before the agent starts any rank; the agent then starts, for
each rank, a client of a few milliseconds (`rank_client`) that has the template fork the rank
and stands for it (its exit code, its signals, its streams): restarts, failure records, the
hang watch and every report see one process per rank, as before.

Fresh ranks, as before, whenever a fork could differ from a fresh start:
``ACCELIFY_FRESH_RANKS=1``; not Linux; ``--no-python`` runs; a script that runs a statement of
its own before it imports torch (it may set a variable torch reads as it starts) or that names a
variable torch._dynamo reads as it is imported; a ``-m`` module whose files, as ``python -m``
runs them, do (`main_module`); ``PYTHON_EXEC`` set (torchrun then runs another Python). Each
rank is also started fresh when its environment differs from the template's in a variable the
agent does not set per rank (``CUDA_VISIBLE_DEVICES`` or ``OMP_NUM_THREADS`` per rank), its CPU
affinity differs, its script's folder holds a module named as one torch imports, or its ``-m``
module is found elsewhere on its own path (`rank_template.refusal`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from accelify.runtime.launch import leftovers, main_module

#: Set to 1 to start every rank fresh (no template)
FRESH_RANKS = "ACCELIFY_FRESH_RANKS"
TEMPLATE = "accelify.runtime.launch.rank_template"
#: The module a fresh rank starts with (torchrun's ``--module``)
RANK_ENTRY = "accelify.runtime.rank_entry"
#: The packages a fresh rank has imported with its entry before it looks a ``-m`` module up
ENTRY_PACKAGES = main_module.entry_packages(RANK_ENTRY)
CLIENT = Path(__file__).with_name("rank_client.py")
#: How long the launcher waits for the template to end after the last rank before it kills
#: it. By then every client has ended, and with it its rank (a client that goes takes its rank
#: with it): what is left is the template's own end, a moment, or its import of torch when the
#: run was stopped in its first seconds, which held a Ctrl-C's end back by as long (5-12 s
#: on a loaded machine). Killed, it has nothing left to lose.
CLOSE_WAIT = 1


def fresh_reason(
    script: str, module: bool, no_python: bool, environ: Mapping[str, str]
) -> str | None:
    """Why this launch's ranks start fresh (None: they are forked from a template)."""
    if environ.get(FRESH_RANKS, "") not in ("", "0"):
        return f"{FRESH_RANKS}={environ[FRESH_RANKS]}"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if no_python:
        return "--no-python"
    if environ.get("PYTHON_EXEC"):
        return "PYTHON_EXEC is set"
    if module:
        path, first = main_module.launcher_path(environ)
        return main_module.fresh_reason(script, path, ENTRY_PACKAGES, first)
    # `python SCRIPT` runs the script alone, its folder first on the path
    folder = os.path.dirname(os.path.realpath(script))
    return main_module.files_reason(script, [("__main__", Path(script))], folder)


def rank_environment(environ: Mapping[str, str], processes_per_machine: int) -> dict[str, str]:
    """The environment each rank gets but for the agent's per-rank variables: the launcher's,
    and ``OMP_NUM_THREADS=1`` where torchrun sets it (several ranks, none set). A difference
    left here only makes the ranks start fresh (`rank_template.refusal`)."""
    environment = dict(environ)
    if "OMP_NUM_THREADS" not in environment and processes_per_machine > 1:
        environment["OMP_NUM_THREADS"] = "1"
    return environment


@contextlib.contextmanager
def template(environment: dict[str, str]) -> Iterator[list[str] | None]:
    """Start the template; yields the command each rank's client runs before the rank's own
    arguments (None: the template could not start, the ranks start fresh). The socket is bound
    here, before the template starts: a client that connects while the template still imports
    torch waits in the listen queue. The template ends when its stdin closes, after its ranks."""
    with tempfile.TemporaryDirectory(prefix=leftovers.prefix("ranks")) as folder:
        path = os.path.join(folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(256)
        except OSError:  # a path too long for a Unix socket (a long TMPDIR)
            listener.close()
            yield None
            return
        with _started(listener, path, environment) as client:
            yield client


@contextlib.contextmanager
def _started(
    listener: socket.socket, path: str, environment: dict[str, str]
) -> Iterator[list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", TEMPLATE, str(listener.fileno())],
        stdin=subprocess.PIPE,
        env=environment,
        pass_fds=(listener.fileno(),),
        start_new_session=True,  # the terminal's Ctrl-C is the launcher's to pass on
    )
    listener.close()
    try:
        yield [sys.executable, "-I", "-S", str(CLIENT), path]
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
