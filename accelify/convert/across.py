"""A driver and its engine module converted together: ``main.py`` makes the model, optimizer
and loaders and calls ``train_one_epoch(...)`` and ``evaluate(...)`` of ``engine.py``, where
the ``.backward()`` is (the torchvision-references shape).

When both files are converted in one run and the driver is the one file of the folder that
imports the engine, the two are converted as one script: the engine's functions and classes
(a trainer class the driver hands its model and optimizer: the Accelerator is then created
where the class receives them) are appended
to the driver (the engine's imports take the place of the driver's import of the engine, the
engine's own import lines become ``pass``, so every line keeps its number), that script is
converted by the single-file rules (one Accelerator, one ``prepare``, ``accelerator`` threaded
through the functions it calls, ``accelerator.backward(loss)``, gathered evaluation), and the
result is split back into the two files. Both files' conversions compute the same combined
conversion, so the parameter the engine's functions get is the one every call passes. Any
doubt (another importer of the engine, a name the two files bind differently, an engine with
statements of its own) leaves both as today: review lines, nothing changed."""

from __future__ import annotations

import builtins
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from accelify.analysis.project_modules import IMPORTED, module_file, package_root, read, resolved
from accelify.analysis.syntax import dotted, is_docstring, walk
from accelify.edits.plan import Note
from accelify.errors import UserError
from accelify.source import parse

#: Names every module reads without binding them (``False`` of an added keyword argument)
_BUILTINS = frozenset(dir(builtins))

#: What an engine module defines besides its imports: the driver calls its functions and
#: builds its classes (a trainer class with its methods), all converted with the driver
Definition = cst.FunctionDef | cst.ClassDef
_DEFINITIONS = (cst.FunctionDef, cst.ClassDef)


@dataclass(frozen=True)
class Pair:
    """A driver and the engine module it trains through, as read from disk."""

    driver: Path
    engine: Path
    driver_data: bytes
    engine_data: bytes


@dataclass(frozen=True)
class Split:
    """The combined conversion split back: each file's new source, changes and reviews."""

    driver: tuple[bytes, list[Note], list[Note], list[str]]
    engine: tuple[bytes, list[Note], list[Note]]
    #: the Accelerator is created (and what trains prepared) in the engine: a class of it
    #: receives the model and optimizer the driver builds
    engine_creates: bool = False


#: The single-file conversion (`conversion.convert_source` of the combined script, which
#: returns a `Conversion`; typed loosely here: that module imports this one), given the first
#: line of the engine's part (`Options.foreign_from`)
Convert = Callable[[bytes, Path, int], Any]


def pair_of_driver(path: Path, modules: set[Path]) -> Path | None:
    """The one engine module ``path`` (a file without a backward) trains through, when every
    call it makes into a sibling module's training is of that module's top-level functions."""
    if not modules or len(modules) != 1:
        return None
    (engine,) = modules
    return engine if importers_of(engine) == [path.resolve()] else None


def driver_of_engine(path: Path, module: cst.Module, converted_with: frozenset[str]) -> Path | None:
    """The one file of ``path``'s folder that imports it, when both are converted in this run.
    Only a module of imports, functions and classes is looked for (the folder is read for it)."""
    if not all(
        isinstance(s, _DEFINITIONS) or is_docstring(s) or _is_import(s) for s in module.body
    ):
        return None
    importers = importers_of(path)
    if len(importers) != 1 or str(path.resolve()) not in converted_with:
        return None
    (driver,) = importers
    return driver if str(driver) in converted_with else None


def unpaired_because(
    driver: Path,
    engine: Path,
    module: cst.Module,
    at_top_level: bool,
    converted_with: frozenset[str],
) -> str:
    """Why ``driver`` and its ``engine`` module (parsed: ``module``) are not converted as one
    script: the first of the conditions (`driver_of_engine`, `pair_of_driver`, `_shape`) that
    does not hold, as one clause of a review line. ``at_top_level``: the driver calls into the
    engine from its module's top level."""
    if str(engine.resolve()) not in converted_with:
        return (
            f"{engine.name} is not converted in this run (the two are converted together only "
            "when both are)"
        )
    if str(driver.resolve()) not in converted_with:
        return (
            "this file is not converted in this run (the two are converted together only "
            "when both are)"
        )
    others = [f.name for f in importers_of(engine) if f != driver.resolve()]
    if others:
        return (
            f"{engine.name} is imported by other files of the folder too ({', '.join(others)}), "
            "whose calls an added parameter would break"
        )
    extra = next(
        (
            s
            for s in module.body
            if not (isinstance(s, _DEFINITIONS) or is_docstring(s) or _is_import(s))
        ),
        None,
    )
    if extra is not None:
        return f"{engine.name} holds more than imports, functions and classes (statements)"
    if at_top_level and _combines(driver, engine, module):
        return (
            "this file calls it at its top level, so the accelerator is a global of this file, "
            f"and a function of {engine.name} that needs it cannot take it as a parameter (a "
            "method, a function handed on rather than called, or a call whose target the "
            f"conversion cannot tell): it would read a global {engine.name} does not have"
        )
    return (
        "the two do not combine into one script (an import of the module other than a "
        "one-line import of its functions, or a name the two files bind differently)"
    )


def _combines(driver: Path, engine: Path, module: cst.Module) -> bool:
    """The driver and its engine (parsed: ``module``) have the shape `combine_and_split`
    converts as one script: what fails then is the conversion of that script."""
    try:
        parsed = parse(read(driver), str(driver))
    except UserError:
        return False
    return _shape(parsed, module, _naming(driver, engine)) is not None


def _naming(driver: Path, engine: Path) -> Callable[[str], bool]:
    """Whether a module name the driver imports is the engine's file."""
    file = engine.resolve()
    return lambda name: (found := module_file(driver, name)) is not None and resolved(found) == file


def importers_of(engine: Path) -> list[Path]:
    """The files of the engine's folder (not below it: a module of the folder is imported by
    name from there), and of the folders above it while it is in a package (``train.py``
    beside ``src/``, ``from src.engine import Engine``), whose imports name it; the folders'
    files are few."""
    name = engine.stem.encode()
    found = []
    for other in sorted(p for folder in _folders_importing(engine) for p in folder.glob("*.py")):
        other = other.resolve()
        if other == engine.resolve() or not other.is_file():
            continue
        data = read(other)
        if name not in data:
            continue
        for match in IMPORTED.finditer(data):
            imported = (match.group(1) or match.group(2)).decode()
            if module_file(other, imported) == engine.resolve() or (
                imported.strip(".") == "" and _names_module(data, match, engine.stem)
            ):
                found.append(other)
                break
    return found


def _folders_importing(engine: Path) -> list[Path]:
    """The engine's folder and, in a package, each folder above it up to the package root;
    and the folders beside the engine's package (``scripts/`` beside ``src/``), whose scripts
    import it by its dotted name once the project root is on sys.path (`module_file` says
    which of their imports name it)."""
    folder = engine.parent.absolute()
    root = package_root(folder)
    if root is None:
        return [folder]  # not a package: its folder's parent may be any folder of projects
    parents = list(folder.parents)
    above = [folder, *parents[: parents.index(root) + 1]]
    top = parents[parents.index(root) - 1] if parents.index(root) > 0 else folder
    project = top.parent
    beside = [
        sub
        for sub in sorted(project.iterdir() if project.is_dir() else [])
        if sub.is_dir()
        and sub != top
        and not sub.name.startswith((".", "_"))
        and not (sub / "pyvenv.cfg").exists()
        and sub not in above
    ]
    return [*above, *beside]


def _names_module(data: bytes, match, stem: str) -> bool:  # type: ignore[no-untyped-def]
    """``from . import engine``: the imported names include the module."""
    end = data.find(b"\n", match.end())
    return stem in data[match.end() : end if end >= 0 else len(data)].decode(errors="replace")


@dataclass
class _Shape:
    """How the driver reaches the engine: its import statement (index in the driver's body),
    the module name when it is ``import engine`` (calls ``engine.f(...)``), and the engine's
    top-level function names."""

    index: int
    module_name: str | None
    functions: set[str]


def combine_and_split(pair: Pair, convert: Convert) -> Split | None:
    """The two files converted as one (``convert(data, path, first engine line)``: the
    single-file conversion, returning a `Conversion`), split back; None where the shape is not
    one this handles or the combined script is not converted (both files then stay as
    today)."""
    try:
        driver = parse(pair.driver_data, str(pair.driver))
        engine = parse(pair.engine_data, str(pair.engine))
    except UserError:
        return None
    shape = _shape(driver, engine, _naming(pair.driver, pair.engine))
    if shape is None:
        return None
    flat = _flatten(driver, shape) if shape.module_name else driver
    imports = [s for s in engine.body if _is_import(s)]
    package = _engine_package(driver.body[shape.index])
    joined = "; ".join(
        engine.code_for_node(_rebased(small, package)).strip()
        for s in imports
        for small in s.body  # type: ignore[attr-defined]
    )
    d_body = list(flat.body)
    d_body[shape.index] = cst.parse_statement(joined or "pass").with_changes(
        leading_lines=d_body[shape.index].leading_lines
    )
    driver_text = flat.with_changes(body=d_body).code
    if not driver_text.endswith("\n"):
        driver_text += "\n"
    e_body = [
        cst.parse_statement("pass").with_changes(leading_lines=s.leading_lines)
        if _is_import(s)
        else s
        for s in engine.body
    ]
    engine_text = engine.with_changes(body=e_body).code
    if driver_text.count("\n") != pair.driver_data.count(b"\n") + (
        0 if pair.driver_data.endswith(b"\n") else 1
    ) or engine_text.count("\n") != engine.code.count("\n"):
        return None  # a line moved: the notes' lines would not map back
    offset = driver_text.count("\n")
    combined = (driver_text + engine_text).encode()
    try:
        result = convert(combined, pair.driver, offset + 1)
    except UserError:
        return None
    if result.skipped or not result.changed:
        return None
    try:
        converted = cst.parse_module(result.converted)
    except cst.ParserSyntaxError:
        return None
    body = list(converted.body)
    n_engine = len(engine.body)
    if len(body) < len(driver.body) + n_engine:
        return None
    d_part, e_part = body[: len(body) - n_engine], body[len(body) - n_engine :]
    added = _added_imports(combined, converted)
    new_engine = _engine_back(engine, e_part, converted, added, pair.engine)
    if new_engine is None:
        return None
    new_driver = _driver_back(driver, converted, d_part, added, joined or "pass", shape)
    engine_only = _bound_names(engine) - shape.functions - _bound_names(driver)
    if new_driver is not None and engine_only & (
        _names_in(cst.parse_module(new_driver).body) - _names_in(driver.body)
    ):
        return None  # the converted driver would read a name only the engine's module binds
    if new_driver is None:
        return None
    new_driver = _without_unread_imports(new_driver, added)
    lines = _Lines(offset, pair.driver.name, pair.engine.name)
    d_changes = [lines.driver(n) for n in result.changes if n.line <= offset]
    d_reviews = [lines.driver(n) for n in result.reviews if n.line <= offset]
    e_changes = [lines.engine(n) for n in result.changes if n.line > offset]
    e_reviews = [lines.engine(n) for n in result.reviews if n.line > offset]
    return Split(
        (new_driver.encode(), d_changes, d_reviews, list(result.prepared)),
        (new_engine.encode(), e_changes, e_reviews),
        _creates_accelerator(cst.parse_module(new_engine)),
    )


def _without_unread_imports(code: str, added: list[cst.BaseStatement]) -> str:
    """A file of the pair without the names of the added import lines it never reads: the
    combined script's ``from accelify import Accelerator, PartialState`` serves both parts
    (an engine class creates the Accelerator, the driver prints through PartialState); each
    file keeps the names it reads, not an unused import (ruff's F401 in the converted file)."""
    module = cst.parse_module(code)
    lines = {cst.Module([]).code_for_node(s).strip() for s in added}
    read = {
        n.value
        for s in module.body
        if not _is_import(s)
        for n in walk(s)
        if isinstance(n, cst.Name)
    }
    body: list[cst.BaseStatement] = []
    for statement in module.body:
        small = statement.body[0] if _is_import(statement) else None  # type: ignore[attr-defined]
        if (
            not isinstance(small, cst.ImportFrom)
            or isinstance(small.names, cst.ImportStar)
            or module.code_for_node(statement).strip() not in lines
        ):
            body.append(statement)
            continue
        kept = [a for a in small.names if (dotted(a.asname.name if a.asname else a.name)) in read]
        if len(kept) == len(small.names):
            body.append(statement)
        elif kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            body.append(
                statement.with_changes(body=[small.with_changes(names=kept)])  # type: ignore[call-arg]
            )
    return module.with_changes(body=body).code


def _engine_package(statement: cst.CSTNode) -> list[str] | None:
    """The package of the engine module as the driver's import of it names it (``["src"]`` for
    ``from src.engine import Trainer``, ``[]`` for ``import engine``); None where it is not
    one plain dotted import (`_shape` keeps only those)."""
    for small in getattr(statement, "body", []):
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            return (dotted(small.module) or "").split(".")[:-1]
        if isinstance(small, cst.Import) and len(small.names) == 1:
            return (dotted(small.names[0].name) or "").split(".")[:-1]
    return None


def _rebased(small: cst.BaseSmallStatement, package: list[str] | None) -> cst.BaseSmallStatement:
    """An import of the engine as the driver's folder would write it: the engine's relative
    ``from .utils import save_checkpoint`` (of ``src/engine.py``) becomes ``from src.utils
    import save_checkpoint`` in the combined script, whose imports are resolved from the
    driver's folder: else the analysis would look for ``utils.py`` beside the driver and not
    see the engine's own sibling modules (trial14: a checkpoint helper of ``src/utils.py``
    left writing on every rank). Only the combined script reads it: the split puts each file's
    own import lines back. Left as it is where the dots climb above the driver's import."""
    if not isinstance(small, cst.ImportFrom) or not small.relative or package is None:
        return small
    climb = len(small.relative) - 1
    if climb > len(package):
        return small
    parts = package[: len(package) - climb] + (
        (dotted(small.module) or "").split(".") if small.module is not None else []
    )
    if not parts:
        return small  # ``from . import x`` of a top-level engine: no module to name
    return small.with_changes(
        relative=[],
        module=cst.parse_expression(".".join(parts)),
        whitespace_after_from=cst.SimpleWhitespace(" "),
    )


def _creates_accelerator(module: cst.Module) -> bool:
    return any(
        isinstance(node, cst.Call) and dotted(node.func) == "Accelerator" for node in walk(module)
    )


_LINE = re.compile(r"\bline (\d+)\b")


@dataclass(frozen=True)
class _Lines:
    """The combined script's line numbers, back in each file's: a note's own line, and the
    lines its text names (``(line 47)`` of the engine's loop, from the driver's note)."""

    offset: int
    driver_name: str
    engine_name: str

    def driver(self, note: Note) -> Note:
        text = _LINE.sub(lambda m: self._named(m, self.engine_name), note.text)
        return dataclasses.replace(note, text=text)

    def engine(self, note: Note) -> Note:
        text = _LINE.sub(lambda m: self._named(m, self.driver_name), note.text)
        return dataclasses.replace(note, line=note.line - self.offset, text=text)

    def _named(self, match: re.Match[str], other: str) -> str:
        """``line N`` of this file, or ``other line M`` for a line of the other file."""
        number = int(match.group(1))
        in_engine = number > self.offset
        if other == self.engine_name:  # a driver's note
            return f"{other} line {number - self.offset}" if in_engine else match.group(0)
        return f"line {number - self.offset}" if in_engine else f"{other} line {number}"


def _shape(
    driver: cst.Module, engine: cst.Module, names_engine: Callable[[str], bool]
) -> _Shape | None:
    """The driver imports the engine (the module name ``names_engine`` says is its file) once,
    in a one-line statement of its own body (``from engine import a, b`` of the engine's
    functions, ``from src.engine import Engine``, or ``import engine``), and uses the
    imported names only as the functions of calls (a class: built); the engine holds only a
    docstring, one-line imports (no ``__future__``), functions and classes; no name means two
    things across the two."""
    functions: set[str] = set()
    for s in engine.body:
        if isinstance(s, _DEFINITIONS):
            functions.add(s.name.value)
        elif not (is_docstring(s) or (_is_import(s) and _one_line(engine, s))) or (
            _is_import(s)
            and any(
                isinstance(small, cst.ImportFrom) and dotted(small.module or "") == "__future__"
                for small in s.body  # type: ignore[attr-defined]
            )
        ):
            return None
    index, module_name, imported = None, None, set()
    for i, s in enumerate(driver.body):
        for small in getattr(s, "body", []) if _is_import(s) else []:
            hit = _of_engine(small, names_engine)
            if hit is None:
                continue
            if index is not None or len(s.body) != 1 or not _one_line(driver, s):  # type: ignore[attr-defined]
                return None
            index, (module_name, imported) = i, hit
    if index is None or not (imported <= functions):
        return None
    used = functions if module_name else imported
    own = list(driver.body)
    del own[index]  # the import of the engine binds its functions' names: the same objects
    driver_names = _bound_names(driver.with_changes(body=own))
    engine_names = _bound_names(engine)
    if driver_names & (engine_names | functions) - _same_imports(driver, engine):
        return None
    if not _only_called(driver, driver.body[index], module_name, used, functions):
        return None
    return _Shape(index, module_name, functions)


def _of_engine(
    small: cst.BaseSmallStatement, names_engine: Callable[[str], bool]
) -> tuple[str | None, set[str]] | None:
    """``from engine import a, b`` -> (None, {a, b}); ``import engine`` -> ("engine", set());
    None for other imports. An alias, a star or a dotted ``import src.engine`` is not handled
    (None with a marker set)."""
    if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
        if not names_engine(dotted(small.module) or ""):
            return None
        if isinstance(small.names, cst.ImportStar) or any(a.asname for a in small.names):
            return ("*", {"*"})
        return None, {dotted(a.name) or "" for a in small.names}
    if isinstance(small, cst.Import):
        names = [dotted(a.name) or "" for a in small.names]
        hits = [name for name in names if names_engine(name)]
        if not hits:
            return None
        if len(names) != 1 or small.names[0].asname or "." in hits[0]:
            return ("*", {"*"})
        return hits[0], set()
    return None


def _only_called(
    driver: cst.Module,
    statement: cst.CSTNode,
    module_name: str | None,
    used: set[str],
    functions: set[str],
) -> bool:
    """Every use of the imported names is the function of a call (``f(...)``, or
    ``engine.f(...)`` of a function of the engine), or a base of a class of the driver's own
    body (``class ClassifierTrainer(BaseTrainer)``: in the combined script the same class,
    defined below), or a type annotation (``def log(metrics: TrainingMetrics)``: it only
    reads the name, the same class in the combined script): nothing handed on or rebound."""
    funcs = {id(node.func) for node in walk(driver) if isinstance(node, cst.Call)}
    annotated = {
        id(inner)
        for node in walk(driver)
        if isinstance(node, cst.Annotation)
        for inner in walk(node.annotation)
    }
    funcs |= {  # ``class Mine(BaseTrainer)``, ``class Mine(engine.BaseTrainer)``
        id(base.value)
        for cls in driver.body
        if isinstance(cls, cst.ClassDef)
        for base in cls.bases
        if isinstance(base.value, cst.Attribute if module_name else cst.Name)
        and base.keyword is None
    }
    inner = {id(n) for n in walk(statement)}
    attrs = set()
    for node in walk(driver):
        if (
            module_name
            and isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value == module_name
        ):
            if id(node) not in funcs | annotated or node.attr.value not in functions:
                return False
            attrs |= {id(node.value), id(node.attr)}
    for node in walk(driver):
        if not isinstance(node, cst.Name) or id(node) in inner:
            continue
        if id(node) in attrs:
            continue
        if module_name and node.value == module_name:
            return False
        if not module_name and node.value in used and id(node) not in funcs | annotated:
            return False
        if module_name and node.value in functions:
            return False  # the driver has a name of its own the engine's function would shadow
    return True


def _bound_names(module: cst.Module) -> set[str]:
    """Names bound at the module's top level (imports, functions, classes, assignments)."""
    names: set[str] = set()
    for s in module.body:
        if isinstance(s, (cst.FunctionDef, cst.ClassDef)):
            names.add(s.name.value)
        for node in walk(s) if not isinstance(s, (cst.FunctionDef, cst.ClassDef)) else []:
            if isinstance(node, cst.ImportAlias):
                bound = node.asname.name if node.asname else node.name
                names.add((dotted(bound) or "").split(".")[0])  # type: ignore[arg-type]
            elif isinstance(node, cst.AssignTarget):
                names |= {n.value for n in walk(node) if isinstance(n, cst.Name)}
    return names


def _same_imports(driver: cst.Module, engine: cst.Module) -> set[str]:
    """Names both files bind by the same import (``import torch`` in each)."""

    def imported(module: cst.Module) -> dict[str, str]:
        found = {}
        for s in module.body:
            if not _is_import(s):
                continue
            for small in s.body:  # type: ignore[attr-defined]
                if isinstance(small.names, cst.ImportStar):
                    continue
                base = (
                    dotted(small.module)
                    if isinstance(small, cst.ImportFrom) and small.module
                    else ""
                )
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    key = (dotted(bound) or "").split(".")[0]
                    found[key] = f"{base}:{dotted(alias.name)}:{bool(alias.asname)}"
        return found

    a, b = imported(driver), imported(engine)
    return {name for name in a.keys() & b.keys() if a[name] == b[name]}


def _flatten(driver: cst.Module, shape: _Shape) -> cst.Module:
    """``engine.f(...)`` -> ``f(...)``: the combined script calls the appended functions."""

    class Flatten(cst.CSTTransformer):
        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):  # type: ignore[no-untyped-def]
            if isinstance(updated.value, cst.Name) and updated.value.value == shape.module_name:
                return cst.Name(updated.attr.value)
            return updated

    return driver.visit(Flatten())


def _unflatten(statements: list[cst.BaseStatement], shape: _Shape) -> list[cst.BaseStatement]:
    """``f(...)`` -> ``engine.f(...)`` again, for the engine's functions (and classes: a base
    of the driver's class too)."""

    def engines(node: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(node, cst.Name) and node.value in shape.functions:
            return cst.Attribute(cst.Name(shape.module_name or ""), node)
        return node

    class Unflatten(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            return updated.with_changes(func=engines(updated.func))

        def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
            bases = [b.with_changes(value=engines(b.value)) for b in updated.bases]
            return updated.with_changes(bases=bases)

    return [s.visit(Unflatten()) for s in statements]  # type: ignore[misc]


def _added_imports(combined: bytes, converted: cst.Module) -> list[cst.BaseStatement]:
    """The import lines the conversion added (``from accelify import Accelerator``)."""
    before = {
        cst.Module([]).code_for_node(s).strip()
        for s in cst.parse_module(combined).body
        if _is_import(s)
    }
    return [
        s
        for s in converted.body
        if _is_import(s) and cst.Module([]).code_for_node(s).strip() not in before
    ]


def _engine_back(
    engine: cst.Module,
    part: list[cst.BaseStatement],
    converted: cst.Module,
    added: list[cst.BaseStatement],
    path: Path,
) -> str | None:
    """The engine with its functions as converted (each keeping its own blank lines and
    comments above it), and the added imports its functions use; None where the part is not
    the engine's statements in order."""
    body = []
    for original, new in zip(engine.body, part, strict=True):
        if isinstance(original, _DEFINITIONS):
            if type(new) is not type(original) or new.name.value != original.name.value:
                return None
            if _reads_new_globals(original, new, added):
                return None
            body.append(new.with_changes(leading_lines=original.leading_lines))
        else:
            body.append(original)
    module = engine.with_changes(body=body)
    used = {n.value for s in part for n in walk(s) if isinstance(n, cst.Name)}
    from accelify.convert.conversion import _add_import  # the one import placement

    for line in added:
        names = {
            (dotted(a.asname.name if a.asname else a.name) or "").split(".")[0]  # type: ignore[arg-type]
            for small in line.body  # type: ignore[attr-defined]
            if not isinstance(small.names, cst.ImportStar)
            for a in small.names
        }
        if names & used:
            module = _add_import(module, converted.code_for_node(line).strip(), path)
    return _without_unread_imports(module.code, added)


def _names_in(statements: Sequence[cst.BaseStatement]) -> set[str]:
    return {n.value for s in statements for n in walk(s) if isinstance(n, cst.Name)}


def _reads_new_globals(
    original: Definition, new: Definition, added: list[cst.BaseStatement]
) -> bool:
    """The converted function reads a name the original does not and that it neither takes
    as a parameter, binds, nor gets from an added import: a global of the combined script
    (``accelerator`` of a driver that trains at its top level, which the functions read as a
    global there), which the engine's module would not have."""
    known = _read_names(original) | _bound_in(new)
    imported = {
        (dotted(a.asname.name if a.asname else a.name) or "").split(".")[0]  # type: ignore[arg-type]
        for line in added
        for small in line.body  # type: ignore[attr-defined]
        if not isinstance(small.names, cst.ImportStar)
        for a in small.names
    }
    return bool(_read_names(new) - known - imported - _BUILTINS)


def _read_names(function: Definition) -> set[str]:
    """The names a function's code reads or writes, not counting attribute names and keyword
    names of calls (``x.to(device=d)``: ``x`` and ``d``)."""
    skip = set()
    for node in walk(function):
        if isinstance(node, cst.Attribute):
            skip.add(id(node.attr))
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            skip.add(id(node.keyword))
        elif isinstance(node, cst.Param):
            skip.add(id(node.name))
    return {n.value for n in walk(function.body) if isinstance(n, cst.Name) and id(n) not in skip}


def _bound_in(function: Definition) -> set[str]:
    """The names a function takes as parameters or assigns in its body (a class: its methods'
    parameters and what its body assigns)."""
    names = {p.name.value for p in walk(function) if isinstance(p, cst.Param)}
    for node in walk(function.body):
        targets: list[cst.CSTNode] = []
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]
        for target in targets:
            names |= {n.value for n in walk(target) if isinstance(n, cst.Name)}
    return names


def _driver_back(
    driver: cst.Module,
    converted: cst.Module,
    part: list[cst.BaseStatement],
    added: list[cst.BaseStatement],
    joined: str,
    shape: _Shape,
) -> str | None:
    """The driver as converted, with its own import of the engine in place of the engine's
    imports, and ``engine.f(...)`` where it called so. The import is found as the same
    occurrence of that line among the statements the conversion did not add (it also adds
    statements of the module's body: ``accelerator = Accelerator()`` of a script that trains
    at the top level)."""

    def code(node: cst.CSTNode) -> str:
        bare = node.with_changes(leading_lines=[])  # type: ignore[attr-defined]
        return converted.code_for_node(bare).strip()

    before = [code(s) for s in driver.body[: shape.index]].count(joined)
    new = {id(s) for s in added}
    same = [i for i, s in enumerate(part) if id(s) not in new and code(s) == joined]
    if len(same) <= before:
        return None
    at = same[before]
    body = list(part)
    body[at] = driver.body[shape.index].with_changes(leading_lines=body[at].leading_lines)
    if shape.module_name:
        body = _unflatten(body, shape)
    return driver.with_changes(body=body).code


def _is_import(line: cst.CSTNode) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in line.body
    )


def _one_line(module: cst.Module, statement: cst.CSTNode) -> bool:
    bare = statement.with_changes(leading_lines=[])  # type: ignore[attr-defined]
    return "\n" not in module.code_for_node(bare).strip("\n")
