"""The project's own modules: which file an import of a script names, for the conversion
(training that runs in a sibling module) and the linter (facts one module's calls carry into
another's functions). One resolution, read from the file system; nothing is imported or run.

``import engine`` and ``from engine import train`` name ``engine.py`` (or ``engine/__init__.py``)
beside the script; ``from .engine import train`` the same, ``from ..utils import x`` one folder
up; ``from project.utils import x`` (or ``import project.utils``) names ``utils.py`` of the folder
``project`` that holds the script, or of the script's package root (the folder above its last
folder with an ``__init__.py``). A library's module is none of them: it is not a file there.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

#: ``from engine import ...``, ``from .engine import ...``, ``import engine``, ``import a.b``
IMPORTED = re.compile(rb"^\s*(?:from\s+(\.*[\w.]*)\s+import|import\s+([\w.]+))", re.MULTILINE)


@functools.lru_cache(maxsize=4096)
def module_file(script: Path, name: str) -> Path | None:
    """The file of module ``name`` as ``script`` imports it (see the module docstring); never
    ``script`` itself. Kept per process: a tree's files ask the same of each of their calls'
    modules (``torch.nn``: no file of the project, looked up on disk once)."""
    for candidate in _candidates(script.parent, name):
        if resolved(candidate) != resolved(script):
            return candidate
    return None


@functools.lru_cache(maxsize=4096)
def resolved(path: Path) -> Path:
    """``path.resolve()``, kept per process: each linted file and each module it imports is
    resolved for every question about it (a ``realpath``: an ``lstat`` per folder on the way)."""
    return path.resolve()


@functools.lru_cache(maxsize=4096)
def _candidates(folder: Path, name: str) -> tuple[Path, ...]:
    """The files that module ``name`` may be for a script in ``folder``, in the order they
    are looked up, the first two found (the first may be the script itself): the same for
    every file of a folder, so a whole tree's ``import torch`` of each file of a folder is
    looked up on disk once, not once per file (`importers_of` asks it of every linted file)."""
    dots = len(name) - len(name.lstrip("."))
    relative = name[dots:]
    if dots:
        for _ in range(dots - 1):
            folder = folder.parent
        roots: Iterable[Path] = [folder] if relative else []
    elif relative:
        roots = _roots(folder, relative.split(".", 1)[0])
    else:
        roots = []
    found: list[Path] = []
    parts = relative.split(".")
    for root in roots:
        if not _may_hold(root, parts):
            continue  # ``import torch``: no ``torch`` there, without a stat per candidate
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                found.append(candidate)
                if len(found) == 2:
                    return tuple(found)
    return tuple(found)


def _may_hold(root: Path, parts: list[str]) -> bool:
    """``root`` holds what module ``a.b`` (``parts``) starts with: a folder ``a``, or ``a.py``
    for ``a``; read from one listing of the folder (True where it cannot be listed: the files
    are looked up). Most imports name a library: nothing of the project holds them."""
    entries = _entries(root)
    if entries is None:
        return True
    first = parts[0]
    return first in entries or (len(parts) == 1 and f"{first}.py" in entries)


@functools.lru_cache(maxsize=1024)
def _entries(folder: Path) -> frozenset[str] | None:
    """The names in ``folder``, listed once per process (as `_candidates` keeps its answers)."""
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return None


def _roots(folder: Path, first: str) -> Iterator[Path]:
    """Where an absolute import of the project is looked up from a script in ``folder``,
    nearest first: the script's folder; the folder above the one named like the import's first
    part, on the script's path (``project`` of ``from project import util``); the package
    root; the nearest folder above the script's (two at most) that holds the import's first
    part as a package folder (``src/`` beside ``scripts/``)."""
    yield folder
    ancestors, package_root = _around(folder)
    for ancestor in ancestors:
        if ancestor.name == first:
            yield ancestor.parent
            break
    if package_root is not None:
        yield package_root
    for ancestor in ancestors[1:_PROJECT_DEPTH]:
        if (ancestor / first).is_dir():
            # ``from src.train_eval import train`` in ``scripts/train.py``, with ``src/`` a
            # package beside ``scripts/``: run as ``python -m scripts.train`` from the project
            # root, or with that root put on sys.path (``sys.path.insert(0, "..")``,
            # PYTHONPATH), which a script outside any package must do to import it at all
            yield ancestor
            break


#: How many folders above a script's own a package it imports by name is looked for
_PROJECT_DEPTH = 3


def package_root(folder: Path) -> Path | None:
    """The folder above ``folder``'s outermost package folder, where a script imports its
    modules by their dotted name (``from src.engine import Engine``); None: not in a package."""
    return _around(folder)[1]


@functools.lru_cache(maxsize=1024)
def _around(folder: Path) -> tuple[tuple[Path, ...], Path | None]:
    """``folder`` (absolute) and the folders above it (`_ancestors`), and its package root (the
    folder above its last folder with an ``__init__.py``; None: not in a package): the same for
    every import of every file of the folder."""
    folder = folder.absolute()
    root = folder
    while (root / "__init__.py").is_file() and root.parent != root:
        root = root.parent
    return tuple(_ancestors(folder)), root if root != folder else None


def _ancestors(folder: Path) -> Iterator[Path]:
    """``folder`` and the folders above it (eight at most: a project, not the file system)."""
    yield folder
    for count, parent in enumerate(folder.parents):
        if count == 8:
            return
        yield parent


def imported_files(script: Path, data: bytes) -> dict[str, Path]:
    """The project modules ``data`` (the text of ``script``) imports, by the module name its
    imports spell: a test of the text, no parse (``from . import util`` names ``util`` too);
    also, for ``from pkg import Trainer`` where ``pkg/__init__.py`` only re-exports it, the
    module that defines it (`defining_module`), by ``pkg.Trainer``."""
    return dict(_imported_files(script, data))


@functools.lru_cache(maxsize=4096)
def _imported_files(script: Path, data: bytes) -> dict[str, Path]:
    """`imported_files`, kept per file and text (a copy is handed out): lint asks it of every
    file for its order, again for its cache key and its project view, so it keeps a whole
    tree's (holding their texts: a 1,300-file tree's are 5 MB). The answer is already the
    process's: `module_file` and `defining_module` keep theirs."""
    found: dict[str, Path] = {}
    data = b"\n" + data  # `_IMPORTED_AFTER_NEWLINE` finds the first line's import too
    for match in _IMPORTED_AFTER_NEWLINE.finditer(data):
        name = (match.group(1) or match.group(2)).decode()
        from_import = match.group(1) is not None
        names = [name]
        words = None  # what a ``from`` import lists, read where it matters (most name a library)
        if from_import and name.strip(".") == "":
            # ``from . import a, b``: each name a module of the folder
            words = _listed(data, match.end())
            names = [name + word for word in words if word.isidentifier()]
        for each in names:
            if each in found:
                continue
            file = module_file(script, each)
            if file is None:
                continue
            found[each] = file
            if not from_import or each != name:
                continue
            for word in words if words is not None else _listed(data, match.end()):
                source = defining_module(file, word)[0] if word.isidentifier() else file
                if source != file:
                    found.setdefault(f"{each}.{word}", source)
    return found


def _listed(data: bytes, start: int) -> list[str]:
    """The names a ``from ... import`` lists from ``start`` on (``a``, ``b as c``: ``b``)."""
    end = data.find(b"\n", start)
    if _OPEN_PARENTHESIS.match(data, start):
        end = data.find(b")", start)  # ``from pkg import (\n    A,\n    B,\n)``
    imported = data[start : end if end >= 0 else len(data)]
    return [
        part.split(" as ")[0].strip()
        for part in imported.decode(errors="replace").strip(" ()\\\n").split(",")
    ]


#: `IMPORTED` found from the newline before its line: a search for a newline skips ahead in C,
#: where ``^`` under MULTILINE is tried at every character (half the time over a whole tree)
_IMPORTED_AFTER_NEWLINE = re.compile(b"\n" + IMPORTED.pattern.removeprefix(b"^"))
#: ``(`` after spaces: the names of ``from pkg import (`` go on to the closing parenthesis
_OPEN_PARENTHESIS = re.compile(rb"[ \t]*\(")


def split_member(qualified: str, script: Path) -> tuple[Path, str] | None:
    """``utils.validate`` (as a script's imports resolve a call's name) -> ``utils.py`` of the
    project and ``validate``: the module is the longest prefix that is a project file; where
    that module only imports the member (a package's ``__init__.py`` re-exporting ``from
    .trainer import Trainer``), the module that defines it (`defining_module`)."""
    module_name, _, member = qualified.rpartition(".")
    if not module_name or not member:
        return None
    if module_name.strip(".") == "":  # ``from . import util``: ``.util`` is the module
        return None
    file = module_file(script, module_name)
    return defining_module(file, member) if file is not None else None


#: ``from .trainer import Trainer``, ``from pkg.a import (f, g as h)``, ``from .x import *``
_FROM_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE
)
#: How many re-exports deep a member is followed (``pkg/__init__`` -> ``pkg/core/__init__``)
_REEXPORT_DEPTH = 3


@functools.lru_cache(maxsize=4096)
def defining_module(file: Path, member: str) -> tuple[Path, str]:
    """The project module that defines ``member`` of ``file``, and its name there: ``file``
    itself where it defines it (or nothing says otherwise), else the module it imports it from
    (``from .trainer import Trainer as EpochTrainer`` in ``pkg/__init__.py``: ``trainer.py``
    and ``Trainer``; a star import whose module defines it), followed a few re-exports deep.
    Read as text, like the rest of the project's reading: nothing is imported."""
    for _ in range(_REEXPORT_DEPTH):
        text = read(file)
        if member in top_level_names(text):
            break
        found = _imported_from(file, text, member)
        if found is None:
            break
        file, member = found
    return file, member


def _imported_from(file: Path, text: bytes, member: str) -> tuple[Path, str] | None:
    """Where ``file``'s text imports the name it binds as ``member`` from a project module."""
    for match in _FROM_IMPORT.finditer(text):
        module = match.group(1).decode()
        if module.strip(".") == "":
            continue  # ``from . import trainer``: a module, not a member of one
        listed = match.group(2).decode(errors="replace").strip().strip("()\\")
        for part in listed.replace("\n", " ").split(","):
            words = part.split()
            if not words:
                continue
            original, bound = words[0], words[-1]  # ``Trainer as EpochTrainer``
            if original == "*" or bound == member:
                source = module_file(file, module)
                if source is None:
                    continue
                if original != "*":
                    return source, original
                if member in top_level_names(read(source)):
                    return source, member
    return None


def read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError:
        return b""


def project_files(path: Path, data: bytes, linted: Iterable[Path]) -> list[Path]:
    """The project modules whose text the findings of ``path`` may depend on: those it
    imports, and the linted files that import it (`importers_of`)."""
    found = list(imported_files(path, data).values())
    return found + [p for p in linted if p not in found]


def importers_of(files: list[Path], texts: Callable[[Path], bytes]) -> dict[Path, list[Path]]:
    """For each of ``files``, the others of them that import it (by resolved path)."""
    by_resolved = {resolved(file): file for file in files}
    found: dict[Path, list[Path]] = {}
    for file in files:
        for module in imported_files(file, texts(file)).values():
            target = by_resolved.get(resolved(module))
            if target is not None and target != file and file not in found.get(target, []):
                found.setdefault(target, []).append(file)
    return found


#: ``def name(`` at the top level of a module
_TOP_LEVEL_DEF = re.compile(rb"^def\s+(\w+)\s*\(", re.MULTILINE)
#: ``def name(``, ``async def name(`` or ``class Name`` at the top level of a module
_TOP_LEVEL_NAME = re.compile(rb"^(?:(?:async\s+)?def|class)\s+(\w+)", re.MULTILINE)
#: ``x = name(`` or ``x = module.name(``: a call whose result is kept
_KEPT_CALL = re.compile(rb"=\s*(?:[\w.]+\.)?(\w+)\s*\(")


def top_level_functions(data: bytes) -> set[bytes]:
    """The names ``def`` binds at the top level of a module's text (no parse)."""
    return set(_TOP_LEVEL_DEF.findall(data))


def top_level_names(data: bytes) -> set[str]:
    """The functions and classes a module's text defines at its top level (no parse): a name
    it only imports (a package's ``__init__`` re-exporting ``utils.other.f``) is not there."""
    return set(_top_level_names(data))


@functools.lru_cache(maxsize=256)
def _top_level_names(data: bytes) -> frozenset[str]:
    """`top_level_names`, kept per text: `defining_module` asks it of the same module once per
    member a file imports from it (a test helper module imported by every test of a tree: its
    text scanned 47 times over a 46-file tree, most of `lint_order`'s CPU)."""
    return frozenset(name.decode() for name in _TOP_LEVEL_NAME.findall(data))


def kept_calls(data: bytes) -> set[bytes]:
    """The names of calls whose result a script's text assigns (``acc = build(args)``)."""
    return set(_KEPT_CALL.findall(data))


def calls_any(data: bytes, names: set[str]) -> bool:
    """``data`` (a module's text) calls one of ``names``: ``name(`` or ``x.name(``, as text."""
    if not names:
        return False
    pattern = rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(names)) + rb")\s*\("
    return re.search(pattern, data) is not None
