"""Which source files ``python -m NAME`` runs before the module's own code, found as the import
system finds them but without importing anything: each package's ``__init__.py`` on the way
(``accelify.verify`` for ``accelify.verify.probe``), then the module's file (a package's
``__main__.py``). `accelify launch` forks a ``-m`` rank from its template only when these files,
in that order, import torch before any statement of their own, as it forks a script's
(`rank_start`, `rank_template`).

The import system is asked its finders (`sys.meta_path`), each given the folders to search: the
run's path for the first name, the package's locations for the next. Finding a spec runs no
module's code; importing the parent packages (`importlib.util.find_spec` of a dotted name) would
run the user's ``__init__.py`` in the launcher. A package whose ``__init__.py`` names ``__path__``
may move where its submodules are found as it runs: not followed, the rank starts fresh; so
does a namespace package inside another (the import system looks its folders up through its
parent's module, imported).

Standard library only.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from accelify.runtime.launch import forking


def chain(name: str, path: Sequence[str]) -> list[tuple[str, Path | None]] | None:
    """The modules ``python -m NAME`` imports and runs, with their source files in the order they
    run (None for a namespace package, which has none): each parent package, then the module
    (``NAME.__main__`` for a package). None where one is not a source file this can read (an
    extension, bytecode only, a zip), is not found, or cannot be run: `python -m` then fails,
    or runs what a fresh start should run."""
    if not name or name.startswith(".") or any(not part for part in name.split(".")):
        return None
    found: list[tuple[str, Path | None]] = []
    search: list[str] = list(path)
    names = name.split(".")
    wanted = [".".join(names[: index + 1]) for index in range(len(names))]
    while wanted:
        fullname = wanted.pop(0)
        spec = _find(fullname, search)
        if spec is None:
            return None
        package = spec.submodule_search_locations is not None
        if package and not wanted:
            if fullname.endswith(".__main__"):
                return None  # `python -m`: a package's __main__ cannot be a package
            wanted.append(f"{fullname}.__main__")
        elif not package and wanted:
            return None  # `a.b` where `a` is a module
        if package and spec.origin is None:  # a namespace package: no file of its own
            found.append((fullname, None))
        elif isinstance(spec.loader, importlib.machinery.SourceFileLoader) and spec.origin:
            found.append((fullname, Path(spec.origin)))
        else:
            return None
        search = _locations(spec)
    return found


def _locations(spec: importlib.machinery.ModuleSpec) -> list[str]:
    """Where a package's submodules are found. A namespace package's are the folders found for
    it on the path it was looked up on (``_NamespacePath._path``: iterating it looks them up
    again on ``sys.path``, this process's, not the rank's)."""
    locations = spec.submodule_search_locations
    if locations is None:
        return []
    found = getattr(locations, "_path", None) if spec.origin is None else None
    return list(found if isinstance(found, list) else locations)


def _find(fullname: str, search: list[str]) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system would find, from the finders alone (no module imported)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(fullname, search, None)
        except Exception:  # a finder that cannot answer without importing: start fresh
            return None
        if spec is not None:
            return spec
    return None


def fresh_reason(
    name: str,
    path: Sequence[str],
    imported: Collection[str],
    first: str | None,
    loaded: Collection[str] = (),
) -> str | None:
    """Why a rank running ``-m NAME`` must start fresh (None: it may be forked from a template
    that imported torch and torch._dynamo). ``path``: the rank's ``sys.path`` as it starts;
    ``imported``: the packages a fresh rank has imported before it looks NAME up (those of the
    rank's entry, `rank_template.RANK_ENTRY`), whose files do not run again; ``first``, ``loaded``:
    as `files_reason`."""
    files = chain(name, path)
    if files is None:
        return f"-m {name}: no module's source file found for it without importing it"
    return files_reason(f"-m {name}", files, first, imported, loaded)


def files_reason(
    shown: str,
    files: Sequence[tuple[str, Path | None]],
    first: str | None,
    imported: Collection[str] = (),
    loaded: Collection[str] = (),
) -> str | None:
    """Why a rank that runs ``files`` (module name, source file) in that order as it starts must
    start fresh (None: it may be forked from a template that imported torch and torch._dynamo):
    the chain of a ``-m`` module (`chain`), or a script alone (`rank_start.fresh_reason`).
    ``shown``: how the run is named (``-m NAME``, the script); ``first``: the folder first on
    the rank's path (the script's folder or the working directory; None under
    ``PYTHONSAFEPATH``), where a module named as one of the standard library's would be
    imported in its place; ``imported``: modules the rank has imported before, whose files do
    not run again; ``loaded``: what the process that forks has imported (a package of the chain
    there would not run its ``__init__.py`` again in the fork, nor would the module be new to
    ``sys.modules``).

    The files run in order; each may hold only its docstring and imports of the standard library
    until one imports torch: then the rest runs after torch, forked or fresh. A package's
    ``__init__.py`` that holds only those (or nothing) passes on to the next file. No file may
    name a variable torch._dynamo reads as it is imported (`forking.READ_AT_DYNAMO_IMPORT`)."""
    torch_imported = False
    for fullname, file in files:
        if fullname in imported:
            continue
        if fullname in loaded:
            return f"{fullname} is imported already where the rank would be forked"
        if file is None:
            continue
        try:
            source = file.read_bytes()
        except OSError:
            return f"cannot read {file}"
        named = forking.dynamo_variable_named(source)
        if named is not None:
            return f"{file} names {named}*, read as torch._dynamo is imported"
        if file.name == "__init__.py" and b"__path__" in source:
            return f"{file} names __path__: where its submodules are found may change"
        if torch_imported:
            continue
        opening = forking.opening(source, first)
        if opening == forking.OWN_FIRST:
            return f"{file} runs a statement of its own before torch is imported"
        torch_imported = opening == forking.TORCH_FIRST
    if not torch_imported:
        return f"{shown} does not import torch before any statement of its own"
    return None


def rank_path(start_path: Sequence[str], cwd: str, safe_path: bool) -> tuple[list[str], str | None]:
    """The path a ``python -m`` rank started in ``cwd`` looks modules up in, and the folder first
    on it, from ``start_path``, the path of a process started the same way with the same
    environment: the working directory first (not under ``PYTHONSAFEPATH``), then the rest."""
    if safe_path:
        return list(start_path), None
    return [cwd, *start_path[1:]], cwd


def entry_packages(entry: str) -> frozenset[str]:
    """The packages a fresh rank imports with its entry module (``accelify``,
    ``accelify.runtime`` for ``accelify.runtime.rank_entry``), before it looks the module up."""
    parts = entry.split(".")[:-1]
    return frozenset(".".join(parts[: index + 1]) for index in range(len(parts)))


def launcher_path(environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    """`rank_path` as the launcher can tell it before any rank starts: its own path after the
    entry its start put first (the console script's folder, or its working directory), under
    the ranks' ``PYTHONSAFEPATH``. Only to decide whether to start a template: the template
    decides each rank with its own path (`rank_template.refusal`)."""
    own = sys.path if sys.flags.safe_path else sys.path[1:]
    if environ.get("PYTHONSAFEPATH"):
        return list(own), None
    return [os.getcwd(), *own], os.getcwd()
