"""A converted script's top-level functions and classes that read the global ``accelerator``
the conversion creates under ``if __name__ == "__main__":`` (``def evaluate(model, loader)``
now gathering through ``accelerator.gather_for_metrics``). Run as a script, the global exists
by the time they run. Imported by another module of the project (``from train import
evaluate`` in ``report.py``), it never does: the other module's call raises ``NameError``.
The conversion cannot make the helper right for a caller it does not convert with it, so each
such helper another file of the folder imports gets a review line naming that file."""

from __future__ import annotations

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
    for importer in across.importers_of(path.resolve()):
        names = _names_imported(importer, path.stem)
        for name in readers if "*" in names else names & readers:
            found.setdefault(name, importer.name)
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
    whole = False
    for node in walk(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None:
            if dotted(node.module) == stem and not node.relative:
                if isinstance(node.names, cst.ImportStar):
                    return {"*"}
                found |= {dotted(a.name) or "" for a in node.names}
        elif isinstance(node, cst.Import):
            whole |= any(dotted(a.name) == stem and a.asname is None for a in node.names)
    if whole:
        found |= {
            node.attr.value
            for node in walk(module)
            if isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value == stem
        }
    return found
