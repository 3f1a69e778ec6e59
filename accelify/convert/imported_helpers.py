"""A converted script's top-level functions and classes that read the global ``accelerator``
the conversion creates under ``if __name__ == "__main__":`` (``def evaluate(model, loader)``
now gathering through ``accelerator.gather_for_metrics``). Run as a script, the global exists
by the time they run. Imported by another module of the project (``from train import
evaluate`` in ``report.py``), it never does: the other module's call raises ``NameError``.
The conversion cannot make the helper right for a caller it does not convert with it, so each
such helper another file of the folder imports gets a review line naming that file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import libcst as cst

from accelify.analysis.project_modules import read
from accelify.analysis.syntax import dotted, is_main_guard, walk
from accelify.convert import across
from accelify.edits.plan import Note


def imported_readers(
    path: Path, original: cst.Module, converted: cst.Module, accelerator: str
) -> list[Note]:
    """A review line per top-level function or class of ``converted`` that reads the global
    ``accelerator`` (bound in the module only under its main guard) and that another file of
    the folder imports from this one, at the line of its ``def``/``class`` in ``original``."""
    if not path.is_file() or _bound_at_top(converted, accelerator):
        return []
    readers = {
        s.name.value
        for s in converted.body
        if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and _reads_global(s, accelerator)
    }
    if not readers:
        return []
    lines = {
        s.name.value: s for s in original.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))
    }
    found: dict[str, str] = {}
    for importer in importers(path.resolve()):
        names = _names_imported(importer, path.stem)
        for name in readers if "*" in names else names & readers:
            found.setdefault(name, importer.relative_to(path.resolve().parent).as_posix())
    if not found:
        return []
    positions = cst.metadata.MetadataWrapper(original, unsafe_skip_copy=True).resolve(
        cst.metadata.PositionProvider
    )
    notes = []
    for name, importer in sorted(found.items()):
        node = lines.get(name)
        if node is None:
            continue
        notes.append(
            Note(
                positions[node].start.line,
                f"{name} reads the global {accelerator}, which this file creates under `if "
                f'__name__ == "__main__":` only; {importer} imports {name} from here, where '
                f"{accelerator} is never defined (NameError when it runs there): hand it the "
                f"accelerator as a parameter, passed at its calls in both files",
            )
        )
    return notes


def _bound_at_top(module: cst.Module, name: str) -> bool:
    """``name = ...`` a statement of the module's own body, outside any main guard."""
    for statement in module.body:
        if is_main_guard(statement) or isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        for node in walk(statement):
            if isinstance(node, cst.AssignTarget) and dotted(node.target) == name:
                return True
    return False


def _reads_global(definition: cst.FunctionDef | cst.ClassDef, name: str) -> bool:
    """``name.x`` read in ``definition`` where no function of it takes or binds ``name``."""
    for node in walk(definition):
        if isinstance(node, cst.Param) and node.name.value == name:
            return False
        if isinstance(node, cst.AssignTarget) and dotted(node.target) == name:
            return False
    return any(
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == name
        for node in walk(definition)
    )


def _names_imported(importer: Path, stem: str) -> set[str]:
    """The names ``importer`` takes from the module ``stem``: ``from stem import a, b``, or
    every ``stem.x`` it reads after ``import stem``."""
    try:
        module = cst.parse_module(read(importer))
    except cst.ParserSyntaxError:
        return set()
    found: set[str] = set()
    aliases: set[str] = set()  # ``import stem`` binds ``stem``; ``import stem as t``, ``t``
    for node in walk(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None:
            if dotted(node.module) == stem and not node.relative:
                if isinstance(node.names, cst.ImportStar):
                    return {"*"}
                found |= {dotted(a.name) or "" for a in node.names}
        elif isinstance(node, cst.Import):
            aliases |= {
                stem if a.asname is None else dotted(a.asname.name) or stem
                for a in node.names
                if dotted(a.name) == stem
            }
    if aliases:
        found |= {
            node.attr.value
            for node in walk(module)
            if isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value in aliases
        }
    return found


#: Folders below the script's that are never the project's own importers.
_SKIPPED = frozenset({".git", ".venv", "venv", "node_modules", "__pycache__", "site-packages"})
#: How many folders deep, and how many files in all, the search for importers below goes.
_DEPTH = 3
_FILES = 500


def importers(path: Path) -> list[Path]:
    """The files that import ``path``'s module: those of its folder (`across.importers_of`),
    and those of the folders below it that import it by its plain name (``from train import
    evaluate`` in ``tools/report.py``, run from the folder or with ``sys.path`` set to it)."""
    found = list(across.importers_of(path))
    stem = path.stem.encode()
    pattern = re.compile(
        rb"^\s*(?:from\s+" + re.escape(stem) + rb"\s+import|import\s+" + re.escape(stem) + rb"\b)",
        re.MULTILINE,
    )
    seen = 0
    for root, folders, files in os.walk(path.parent):
        here = Path(root)
        depth = len(here.relative_to(path.parent).parts)
        folders[:] = sorted(
            f for f in folders if f not in _SKIPPED and not f.startswith(".") and depth < _DEPTH
        )
        if depth == 0 or (here / path.name).exists():
            continue  # the folder's own files (`across.importers_of`), or a namesake's folder
        for name in sorted(f for f in files if f.endswith(".py")):
            seen += 1
            if seen > _FILES:
                return found
            other = here / name
            if other.is_file() and pattern.search(read(other)):
                found.append(other)
    return found
