"""How `accelify launch` starts each rank: ``python -m accelify.runtime.rank_entry SCRIPT ARGS``
(or ``-m MODULE ARGS``), which installs the rank's failure record and then runs the script as
``python SCRIPT ARGS`` would.

The runtime installs the records when the script's `Accelerator` starts the process group. A
script that uses ``torch.distributed`` directly (``init_process_group``, DDP, ``all_reduce``) never
does, and the launcher could only report its ranks' exit codes: not which rank raised first, nor
its line, nor a hang. Starting every rank here, the way ``torchrun -m`` runs a module, gives every
script the same report. The script sees what ``python SCRIPT`` gives it: ``sys.argv``, a fresh
``__main__`` module that stays for the life of the process, ``__file__``, ``sys.path[0]`` (its own
folder, unless ``PYTHONSAFEPATH`` is set), its exit code, its signals (the launcher asks for a
stack on a real-time signal that no script or scheduler uses: `collective_record.STACK_SIGNAL`)
and its streams as Python made them: under ``PYTHONUNBUFFERED=1`` ``print`` writes what it prints
in one write, so that lines the ranks print at once do not run together, and nothing is held
back (`accelify.runtime.rank_output`). The collective record starts
here too, before the script's first line, and follows the DDP models the script builds itself
(`accelify.runtime.ddp_collectives`). Tracebacks start at the script's first line: the frames of
this module are cut before they are recorded or printed (`failure_record.install`). torch is not
imported here: a script may set variables before it imports torch.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Any, NoReturn

from accelify.runtime import collective_record, failure_record, rank_output


def main(arguments: Sequence[str], imports_exit_handlers: Sequence[tuple] = ()) -> None:
    """``SCRIPT ARGS...`` or ``-m MODULE ARGS...``, as torchrun passes them.
    ``imports_exit_handlers``: ``(function, args, kwargs)`` of the exit handlers registered as
    torch was imported before this rank started (a rank forked from the launcher's template,
    `accelify.runtime.launch.rank_template`)."""
    rank = int(os.environ.get("RANK", "0"))
    rank_output.write_whole_lines()  # lines the ranks print at once do not run together
    failure_record.install(rank, on_exception=collective_record.crashed, entry=_run.__code__)
    # From the start, not from the process group's: a rank that loops or sleeps before it
    # starts its group keeps its peers waiting in the rendezvous, and its place is asked of it.
    collective_record.install(rank)
    _record_os_exit(rank)
    # registered before the script's own handlers, so run after them all
    atexit.register(_after_the_scripts_exit_handlers)
    _registered_again(imports_exit_handlers)
    _record_collectives_once_the_group_exists(rank)
    _after_import("torch", _freeze_what_torch_made)
    if rank != 0:
        _after_import("argparse", _quiet_argument_parsers)
    if arguments[:1] == ["-m"]:
        module, code = _main_module_of_module(arguments[1])
        sys.argv = [module.__file__ or arguments[1], *arguments[2:]]
    else:
        module, code = _main_module_of_script(arguments[0])
        sys.argv = list(arguments)
        _put_the_scripts_folder_first(arguments[0])
    _run(code, module)


def _after_the_scripts_exit_handlers() -> None:
    """The last atexit handler. A script that runs its process group itself (no exit guard)
    can make no collective call after it. A rank whose run has failed skips Python's final
    collections of its heap: with torch imported they walk every object several times (4 s
    of a rank's exit on a loaded machine, 0.8 s without them), and the launcher's report, or
    the restart, waits for every rank to have exited. Only objects in reference cycles are
    left uncollected (their memory goes with the process); the streams are flushed and every
    object freed by its last reference is freed as before. Python does not promise to run
    ``__del__`` at exit: a healthy rank keeps the collections all the same."""
    collective_record.collectives_over()
    if collective_record.failing():
        gc.freeze()


def _quiet_argument_parsers(argparse: ModuleType) -> None:
    """Every rank parses the same command line, so a bad flag made each rank print the same
    usage and error, N times (trial24: twice on ``-n 2``); rank 0 alone prints what argparse
    writes (usage, errors, ``--help``), and every rank still exits as argparse decides. A
    parser whose outcome differs between ranks (a default read from the rank's environment)
    speaks on rank 0 only, as ``accelerator.print`` does."""
    parser = getattr(argparse, "ArgumentParser", None)
    if parser is not None and hasattr(parser, "_print_message"):
        parser._print_message = _print_nothing


def _print_nothing(self: Any, message: str, file: Any = None) -> None:
    """``ArgumentParser._print_message`` of a rank other than 0."""


def _registered_again(handlers: Sequence[tuple]) -> None:
    """A fresh rank registers torch's exit handlers as its script imports torch, after the
    entry's own, so they run before it; a forked rank had them before: registered again here,
    in their order, after the entry's."""
    for function, _, _ in handlers:
        atexit.unregister(function)
    for function, args, kwargs in handlers:
        atexit.register(function, *args, **kwargs)


def _freeze_what_torch_made(torch: ModuleType) -> None:
    """Once torch has been imported, its objects (and the standard library's, and those of any
    package imported before it) are moved out of the cyclic garbage collector's generations
    (`gc.freeze`): about 170 000 objects that live as long as the process, which every full
    collection walked again, during the run and three times more as the interpreter exits. A
    healthy 2-rank run's rank spent 0.91 CPU-seconds in the interpreter's exit, 0.42 with them
    frozen, and 4.8 CPU-seconds in its whole run, 3.4 frozen (bench/rank_exit.py, the run
    docs/benchmarks.md quotes). The script's own objects, made after torch's
    import, are collected as before, at exit too: what their finalizers write is still written.
    Frozen objects are still freed when their last reference goes; only those in reference
    cycles stay (53 such objects were garbage when torch's import ended: a few kilobytes).
    `gc.get_referrers` does not see frozen objects: the exit guard's search for references to
    the process groups unfreezes them first (`backends.base.let_go_of_groups`)."""
    gc.freeze()


def _put_the_scripts_folder_first(script: str) -> None:
    """``python SCRIPT`` puts the script's folder first on ``sys.path`` where ``python -m`` put
    the working directory; with ``PYTHONSAFEPATH=1`` (``python -P``) it puts neither, and the
    path's first entry is the standard library's: it stays, and the script's folder is not
    added (its sibling modules are then not importable, as under torchrun)."""
    if sys.flags.safe_path:
        return
    sys.path[0] = os.path.dirname(os.path.realpath(script))


def _run(code: CodeType, module: ModuleType) -> None:
    """Run the script's code in its ``__main__``; a rank past the end of its script (or in
    ``sys.exit``) is leaving, as the launcher's watcher must know."""
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    except SystemExit as leaving:
        # where it left first: the watcher may report the leaving as soon as it is recorded
        failure_record.record_exit(int(os.environ.get("RANK", "0")), leaving)
        collective_record.leaving(_exit_status(leaving.code))
        raise
    collective_record.leaving()


def _record_os_exit(rank: int) -> None:
    """``os._exit(5)`` leaves at once: no exception the entry sees, no atexit handler, so the
    launcher knew only the rank's exit code and its last collective. The call is recorded as a
    ``sys.exit`` is: where (the user's line) and that the rank is leaving, with its code, so a
    peer left waiting is told at once which line made the rank go. Only in the rank's own
    process: a child it forks (a DataLoader worker, multiprocessing's ``Process``) ends with
    ``os._exit`` every time."""
    real = os._exit
    rank_pid = os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == rank_pid:
            with contextlib.suppress(Exception):  # the exit itself must happen
                failure_record.record_exit_call(rank, sys._getframe(1), "os._exit")
                collective_record.leaving(_exit_status(status))
        real(status)

    _exit.__wrapped__ = real  # type: ignore[attr-defined]
    os._exit = _exit


def _exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` ends the process with: None is 0, a number itself, anything
    else (a message) 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _main_module_of_script(script: str) -> tuple[ModuleType, CodeType]:
    """``__main__`` as ``python SCRIPT`` makes it: an absolute ``__file__`` (not normalised),
    no spec, a source loader."""
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    module = _fresh_main()
    module.__dict__.update(
        __file__=path,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    return module, code


def _main_module_of_module(name: str) -> tuple[ModuleType, CodeType]:
    """``__main__`` as ``python -m MODULE`` makes it (a package runs its ``__main__``)."""
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        name = f"{name}.__main__"
        spec = importlib.util.find_spec(name)
    loader = spec.loader if spec is not None else None
    code = loader.get_code(name) if isinstance(loader, importlib.abc.InspectLoader) else None
    if spec is None or code is None:
        print(f"{sys.executable}: No module named {name}", file=sys.stderr)
        raise SystemExit(1)
    module = _fresh_main()
    module.__dict__.update(
        __file__=spec.origin,
        __cached__=spec.cached,
        __loader__=loader,
        __package__=spec.parent,
        __spec__=spec,
    )
    return module, code


def _fresh_main() -> ModuleType:
    module = ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __cached__=None, __package__=None)
    return module


def _record_collectives_once_the_group_exists(rank: int) -> None:
    """Start the rank's collective record when the script starts the process group itself.
    ``init_process_group`` and the collectives are wrapped as soon as torch imports
    ``torch.distributed``, before the script can take its own reference to them (``from
    torch.distributed import all_reduce``)."""
    _after_import("torch.distributed", lambda dist: _wrap(dist, rank))


def _after_import(name: str, then: Any) -> None:
    """``then(module)`` once the module has been imported: now, when it is already (a rank
    forked from the launcher's template, `accelify.runtime.launch.rank_template`, has torch
    before its script starts), else as its import ends."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _wrap(dist: Any, rank: int) -> None:
    collective_record.record_torch_collectives()
    start = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        with collective_record.starting_the_group():
            result = start(*args, **kwargs)
        collective_record.install(dist.get_rank() if dist.is_initialized() else rank)
        if collective_record.recording():
            from accelify.runtime import ddp_collectives

            ddp_collectives.record_the_scripts_models()
        return result

    init_process_group.__wrapped__ = start  # type: ignore[attr-defined]
    init_process_group.__doc__ = start.__doc__
    dist.init_process_group = init_process_group


class _AfterImport(importlib.abc.MetaPathFinder):
    """Call ``then(module)`` once the module ``name`` has been imported (and only then)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        then = self.then

        def exec_module(module: ModuleType) -> None:
            execute(module)
            then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if __name__ == "__main__":
    # a rank the launcher's agent started fresh dies with the launcher, even one killed by
    # SIGKILL (a forked rank dies with its template, which dies with the launcher)
    from accelify.runtime.launch import lifeline

    lifeline.die_with_the_launcher()
    sys.modules.setdefault("accelify.runtime.rank_entry", sys.modules["__main__"])
    main(sys.argv[1:])
