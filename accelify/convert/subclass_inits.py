"""Subclasses in the project's other modules of a class whose conversion creates
``self.accelerator`` in its ``__init__`` (``class Small(base.Model)`` of ``small.py``): one whose
own ``__init__`` does not run the base's makes instances without it, and what they inherit (the
``train()`` that now prepares and steps through it) fails with AttributeError at the first step.
The file in the same module is seen by the conversion itself (`steps.accelerator`); these are
found here, in the files that import the converted one (and those that import them, following
the subclass down, a few modules deep)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from accelify.analysis.base_inits import base_init_run, own_init
from accelify.analysis.project_modules import read
from accelify.analysis.syntax import dotted, walk
from accelify.convert.imported_helpers import importers
from accelify.convert.project import accelerator_attribute
from accelify.convert.steps.accelerator import skipped_init_review
from accelify.edits.plan import Note

#: How many modules down a chain of subclasses is followed.
_DEPTH = 3


def skipped_in_other_modules(
    path: Path, original: cst.Module, converted: cst.Module, lines: dict[str, int]
) -> Note | None:
    """A review line, at the ``__init__`` of the class of ``original`` (its line in
    ``lines``, by class name) whose converted constructor creates the accelerator, for the
    first subclass of it in another module of the folder whose ``__init__`` does not run it."""
    for cls in converted.body:
        if not isinstance(cls, cst.ClassDef) or cls.name.value not in lines:
            continue
        init = own_init(cls)
        attribute = accelerator_attribute(init) if init is not None else None
        if attribute is None:
            continue
        found = _skipping_subclass(path.resolve(), cls.name.value)
        if found is not None:
            file, subclass, line = found
            where = f" ({file.relative_to(path.resolve().parent).as_posix()}, line {line})"
            return Note(
                lines[cls.name.value],
                skipped_init_review(subclass, cls.name.value, f"self.{attribute}", where),
            )
    return None


def _skipping_subclass(path: Path, owner: str) -> tuple[Path, str, int] | None:
    """The file, name and ``__init__`` line of a subclass of ``owner`` (a class of ``path``)
    in a module that imports it, whose ``__init__`` runs no base's; a subclass without one of
    its own (or one that runs its base's) is followed into the modules importing it."""
    todo = [(path, owner, 0)]
    seen: set[tuple[Path, str]] = set()
    while todo:
        file, name, depth = todo.pop()
        if (file, name) in seen or depth >= _DEPTH:
            continue
        seen.add((file, name))
        for importer in importers(file):
            try:
                module = cst.parse_module(read(importer))
            except cst.ParserSyntaxError:
                continue
            spelled = _names_for(module, file.stem, name)
            if not spelled:
                continue
            subclasses = _subclasses(module, spelled)
            leading = spelled | {c.name.value for c in subclasses}  # the way down to ``owner``
            for cls in subclasses:
                init = own_init(cls)
                if init is not None and base_init_run(init, cls) not in leading:
                    return importer.resolve(), cls.name.value, _line(module, init)
                todo.append((importer.resolve(), cls.name.value, depth + 1))
    return None


def _names_for(module: cst.Module, stem: str, name: str) -> set[str]:
    """How ``module`` spells ``name`` of the module ``stem``: ``Model`` (or its ``as`` name)
    after ``from stem import Model``, ``stem.Model`` after ``import stem``."""
    found: set[str] = set()
    for node in walk(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None:
            if dotted(node.module) != stem or isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                if dotted(alias.name) == name:
                    found.add(dotted(alias.asname.name) if alias.asname else name)  # type: ignore[arg-type]
        elif isinstance(node, cst.Import):
            for alias in node.names:
                if dotted(alias.name) == stem:
                    local = dotted(alias.asname.name) if alias.asname else stem  # type: ignore[union-attr]
                    found.add(f"{local}.{name}")
    return found - {None}  # type: ignore[arg-type]


def _subclasses(module: cst.Module, spelled: set[str]) -> list[cst.ClassDef]:
    """The top-level classes of ``module`` deriving from a class spelled one of ``spelled``,
    or from one of those (``class Mid(Model)`` then ``class Small(Mid)`` in one file)."""
    classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
    names = set(spelled)
    found: list[cst.ClassDef] = []
    grown = True
    while grown:
        grown = False
        for cls in classes:
            if cls in found:
                continue
            if any(dotted(base.value) in names for base in cls.bases):
                found.append(cls)
                names.add(cls.name.value)
                grown = True
    return found


def _line(module: cst.Module, node: cst.CSTNode) -> int:
    positions = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True).resolve(
        cst.metadata.PositionProvider
    )
    return positions[node].start.line
