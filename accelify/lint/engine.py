"""Lint one file: parse, analyse once, run the enabled rules, drop suppressed findings, and
apply the safe fixes (until nothing changes) when asked."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from accelify.analysis import names
from accelify.errors import UserError
from accelify.lint.finding import Finding
from accelify.lint.selection import Selection, suppressed
from accelify.source import check_syntax, parse, room_for_deep_trees

if TYPE_CHECKING:
    import libcst as cst

    from accelify.analysis.outside_callers import HandedCall, ProjectView
    from accelify.analysis.script_model import ScriptModel
    from accelify.lint.rule import Rule

#: A file that may hold an accelerator names it somewhere: an import of accelerate or accelify,
#: an ``Accelerator`` annotation, an ``accelerator`` parameter or ``self.accelerator``, or uses
#: members only an accelerator has (one a factory returned under another name). One that names
#: neither this nor torch is skipped before parsing; one that names no accelerator is only
#: syntax-checked.
ACCELERATOR_WORDS = re.compile(
    rb"accelerat|accelify|\.prepare\(|\.unwrap_model\(|\.gather_for_metrics\(|\.accumulate\(",
    re.IGNORECASE,
)


def _alternatives(words: Iterable[str]) -> bytes:
    return b"|".join(re.escape(word).encode() for word in sorted(words))


#: What the analysis needs to see before it calls a file an Accelerator file
#: (`ScriptModel.uses_accelerator`), as text: an accelerator class's name (it is constructed),
#: a member only an accelerator has, or a name that says it is one (``accelerator``,
#: ``self.trainer_accelerator``) followed by a member it shares with process states. A file
#: without any of them is syntax-checked only, not built into a tree and a model: on a whole
#: tree that is most files, and no rule reports on them. Derived from the tables the analysis
#: reads, so the two cannot drift apart (a test holds every fixture and rule example to it).
MAY_USE_ACCELERATOR = re.compile(
    _alternatives({name.rsplit(".", 1)[-1] for name in names.ACCELERATORS})
    + rb"|\b(?:"
    + _alternatives(names.ACCELERATOR_ONLY_MEMBERS)
    + rb")\b|(?i:accelerator)[\s\\]*\.[\s\\]*(?:"
    + _alternatives(names.ACCELERATOR_SHARED_MEMBERS)
    + rb")\b"
)


#: The last part of each accelerator class's qualified name (``Accelerator``).
_ACCELERATOR_CLASSES = frozenset(name.rsplit(".", 1)[-1] for name in names.ACCELERATORS)


def code_may_use_accelerator(data: bytes, path: str) -> bool:
    """`MAY_USE_ACCELERATOR` read in the code, not in its text: what that test finds in a
    docstring, a comment or a string (Accelerate's own modules name ``Accelerator`` in nearly
    every docstring; ``# prepare the data``) cannot make an Accelerator file. The analysis
    finds an accelerator in two places only, both code: a call whose qualified name is one of
    `names.ACCELERATORS` (`ScriptModel.call_names` resolves a dotted name through the imports,
    so the class's own name is a name, an attribute or an imported name of the file), and
    the member uses `accelerator_objects` proves an accelerator by (an attribute of
    `names.ACCELERATOR_ONLY_MEMBERS`, or one of `names.ACCELERATOR_SHARED_MEMBERS` read from a
    receiver named ``...accelerator``). A file with neither is not built into a tree: Python's
    own parser reads it (also its syntax check). One that Python's parser rejects is left to
    `parse`, which reports the error as before (True)."""
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    only, shared, classes = (
        names.ACCELERATOR_ONLY_MEMBERS,
        names.ACCELERATOR_SHARED_MEMBERS,
        _ACCELERATOR_CLASSES,
    )
    attribute, name, alias = ast.Attribute, ast.Name, ast.alias
    for node in ast.walk(tree):
        kind = type(node)
        if kind is attribute:
            member = node.attr  # type: ignore[attr-defined]
            if member in only or member in classes:
                return True
            if member in shared:
                receiver = node.value  # type: ignore[attr-defined]
                last = (
                    receiver.id
                    if type(receiver) is name
                    else receiver.attr
                    if type(receiver) is attribute
                    else ""
                )
                if last.lower().endswith("accelerator"):
                    return True
        elif kind is name:
            if node.id in classes:  # type: ignore[attr-defined]
                return True
        elif kind is alias and node.name.rsplit(".", 1)[-1] in classes:  # type: ignore[attr-defined]
            return True
    return False


_WORD_CHARACTER = re.compile(rb"\w")


def _plainly_named_in_code(data: bytes, tried: int = 8) -> bool:
    """One of the first ``tried`` matches of `MAY_USE_ACCELERATOR` is a whole word on a line
    whose text before it holds no comment sign, no quote and no doctest prompt, after an even
    number of each triple quote: code, as far as the text tells. A file that creates an
    Accelerator names it so near its top (its import), and Python's parser need not read it
    first (`code_may_use_accelerator`: a second parse of every analysed file, ~a tenth of
    libcst's). A wrong True costs only time: the analysis finds no accelerator where there is
    none; a wrong False asks that test, as every file did before."""
    for count, match in enumerate(MAY_USE_ACCELERATOR.finditer(data)):
        if count == tried:
            return False
        start, end = match.span()
        if (start and _WORD_CHARACTER.match(data, start - 1)) or _WORD_CHARACTER.match(data, end):
            continue  # part of a longer name
        line_start = data.rfind(b"\n", 0, start) + 1
        before = data[line_start:start]
        if b"#" in before or b'"' in before or b"'" in before:
            continue
        if before.lstrip().startswith((b">>>", b"...")):
            continue
        if data.count(b'"""', 0, line_start) % 2 or data.count(b"'''", 0, line_start) % 2:
            continue  # inside a docstring, it seems
        return True
    return False


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    original: bytes = b""
    fixed: bytes | None = None
    fixed_count: int = 0  # findings whose fix was applied to `fixed`
    #: why the file was not checked (accelify's own failure, not a finding about the file)
    error: str | None = None
    #: the file uses no accelerator, so no rule ran on it (its syntax only, ACC000): a plain
    #: PyTorch script, which `accelify convert` makes distributed
    no_accelerator: bool = False
    #: the project's other modules whose text the findings were read from (`ProjectView.read`:
    #: the importers, and the factory modules those importers' own imports read): a cache
    #: entry holds while each is unchanged
    read_modules: tuple[str, ...] = ()
    #: what the file's calls hand the functions, classes and methods of the project's other
    #: modules (`outside_callers.handed_calls`): the facts those modules are linted with
    handed: tuple[HandedCall, ...] = ()


@room_for_deep_trees
def lint_source(
    data: bytes,
    path: str,
    selection: Selection,
    fix: bool = False,
    portable: bool = False,
    importers: tuple[Path, ...] | None = None,
    handed: tuple[HandedCall, ...] = (),
    wanted: tuple[str, ...] = (),
    callers: tuple[Path, ...] = (),
) -> FileResult:
    """``portable``: findings carry their fix as a text edit on ``data`` (plain data), not as a
    plan over this process's tree. ``importers``: the files that import this one whose
    analyses are not at hand (an import cycle), analysed here for what their calls hand this
    module's functions (`project_view`); None: the file alone, without reading the project's
    other modules. ``handed``: what the linted importers' calls hand (their
    `FileResult.handed`, the facts of the analyses they were linted with). A module handed an
    accelerator or a prepared object is analysed whatever its text names (``def
    validate(acc, model, loader)`` names no accelerator). ``wanted``: the linted modules (by
    resolved path) that wait for what this file's calls hand them (`FileResult.handed`).
    ``callers``: every linted file that imports this one, read only where a rule asks who
    runs a method of it (`ProjectView.callers_of`: a module that names no accelerator hands
    nothing, but may call a trainer's hook)."""
    result = FileResult(path, original=data, no_accelerator=True)
    this = str(Path(path).resolve()) if handed else ""
    given = any(call.arguments for call in handed if call.module == this)
    if not given and importers:  # an import cycle: what the importer hands is read below
        given = _called_by(importers, data)
    if not given and ACCELERATOR_WORDS.search(data) is None and b"torch" not in data:
        return result  # cannot match any rule: skipped before parsing
    plainly_named = False
    try:
        if given:
            pass  # handed an accelerator or prepared objects: analysed whatever it names
        elif MAY_USE_ACCELERATOR.search(data) is not None:
            plainly_named = _plainly_named_in_code(data)
            if (
                not plainly_named
                and not code_may_use_accelerator(data, path)
                and (importers is None or not _factory_imported(path, data))
            ):
                return result  # named in docstrings or comments only: Python's parser read it
        elif importers is None or not _factory_imported(path, data):
            check_syntax(data, path)  # no rule reports on it: its syntax only
            return result
        load_analysis()
        module = parse(data, path)
    except UserError as error:
        if plainly_named and not code_may_use_accelerator(data, path):
            return result  # what the test alone answers: libcst's error is not reported
        if selection.enabled("ACC000", path):
            result.findings.append(
                Finding("ACC000", error.message, error.line or 1, error.column or 1, None, path)
            )
        return result
    from accelify.analysis.script_model import analyze

    project = (
        project_view(path, data, importers, handed, callers) if importers is not None else None
    )
    script = analyze(module, data.decode("utf-8", errors="replace"), project=project)
    result.no_accelerator = not script.uses_accelerator
    result.findings = _check(script, data, path, selection)
    _name_callers_of(result.findings, script, data, path, selection, project)
    if fix and any(f.fix for f in result.findings):
        result.fixed, result.fixed_count = _fix(data, path, selection, project)
        if result.fixed != data:
            script = analyze(parse(result.fixed, path), project=project)
            result.findings = _check(script, result.fixed, path, selection)
            # what is left after the fix came from the same callers: named as before
            _name_callers_of(result.findings, script, result.fixed, path, selection, project)
    if importers is not None and wanted:
        from accelify.analysis.outside_callers import handed_calls

        result.handed = handed_calls(script, Path(path), set(wanted))
    if project is not None:
        result.read_modules = tuple(sorted(str(p) for p in project.read))
    if portable:
        result.findings = _portable(result.findings, script)
    return result


#: Set by the command line (`accelify.lint.cli._cycles_collected_once`, which runs the cycle
#: collector itself once after each file): what `load_analysis` imports, libcst's node classes
#: and the analysis (~43k objects, with what the process holds by then), is frozen out of the
#: collector's view (`gc.freeze`), so the pass after the first file does not traverse it (~14
#: of its ~19 ms). Any other process that imports accelify keeps its collector as it is.
freeze_imports = False


@functools.cache
def load_analysis() -> None:
    """libcst and the analysis, imported together before the first file parsed, their
    dataclasses' generated methods run from code kept compiled (`accelify.libcst_import`:
    ~1,000 texts a start otherwise compiles; kept in the user's cache folder). One store for
    the set: lint imports the same set every time."""
    from accelify.libcst_import import kept_compiles, store_named

    with kept_compiles(store_named("lint")):
        import libcst  # noqa: F401

        from accelify.analysis.script_model import analyze  # noqa: F401
    if freeze_imports:  # (before the file is parsed: none of its objects is frozen)
        import gc

        gc.freeze()


@functools.cache
def load_rules() -> tuple[Rule, ...]:
    """Every rule (and the analysis modules only they import), imported when the first file
    with an accelerator is checked, as `load_analysis` imports the analysis: a parsed file
    with none imports no rule."""
    from accelify.libcst_import import kept_compiles, store_named
    from accelify.lint.registry import all_rules

    with kept_compiles(store_named("rules")):
        return all_rules()


def _called_by(importers: tuple[Path, ...], data: bytes) -> bool:
    """An importer analysed with the file (an import cycle: `lint_source`'s ``importers``)
    calls a function or class the file defines, as text: it may hand it an accelerator."""
    from accelify.analysis.project_modules import calls_any, read, top_level_names

    defined = top_level_names(data)
    return any(calls_any(read(importer), defined) for importer in importers)


def _factory_imported(path: str, data: bytes) -> bool:
    """The file names no accelerator, but may get one from a factory of the project: it names
    something like one (``build_accelerator``) and imports a project module that constructs an
    Accelerator (`ProjectView.accelerator_factories` tells which name, once analysed)."""
    if ACCELERATOR_WORDS.search(data) is None:
        return False  # (a plain script: nothing more imported)
    from accelify.analysis.project_modules import imported_files, kept_calls, read

    kept = kept_calls(data)
    return any(
        _constructs_for(read(file), kept) for file in imported_files(Path(path), data).values()
    )


#: ``Accelerator(`` (any accelerator class) constructed in a module's text
_CONSTRUCTION = re.compile(rb"\b(?:" + _alternatives(_ACCELERATOR_CLASSES) + rb")\s*\(")


def _constructs_for(module: bytes, kept: set[bytes]) -> bool:
    """A module's text constructs an accelerator and defines at its top level a function the
    importing file calls and keeps the result of: maybe a factory (its analysis tells)."""
    from accelify.analysis.project_modules import top_level_functions

    if _CONSTRUCTION.search(module) is None:
        return False
    return bool(top_level_functions(module) & kept) and _constructs_in_code(module)


@functools.lru_cache(maxsize=64)
def _constructs_in_code(module: bytes) -> bool:
    """The module's code (not a docstring's example: a library's modules show
    ``accelerator = Accelerator()`` in nearly every one) calls an accelerator class, as
    Python's parser reads it (a tenth of an analysis); a module it cannot parse may be one."""
    try:
        tree = ast.parse(module)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    for node in ast.walk(tree):
        if type(node) is ast.Call:
            func = node.func
            name = func.id if type(func) is ast.Name else getattr(func, "attr", "")
            if name in _ACCELERATOR_CLASSES:
                return True
    return False


def project_view(
    path: str,
    data: bytes,
    importers: tuple[Path, ...],
    handed: tuple[HandedCall, ...] = (),
    callers: tuple[Path, ...] = (),
) -> ProjectView | None:
    """The file as the rest of its project sees it, when there is a rest: it imports a module
    of the project (an Accelerator factory may be there), or importers' calls tell what its
    functions are handed (as data, ``handed``; or read from ``importers``, analysed here). A
    file of neither reads no other module."""
    from accelify.analysis.outside_callers import ProjectView
    from accelify.analysis.project_modules import imported_files

    script = Path(path)
    if not importers and not handed and not callers and not imported_files(script, data):
        return None
    return ProjectView(
        script,
        importers,
        load_caller,
        load_alone=_load_alone,
        constructs_for=_constructs_for,
        handed=handed,
        handing=tuple(dict.fromkeys(Path(call.caller) for call in handed)),
        callers=callers,
        load_any=load_module,
    )


#: Modules analysed for another file's facts, by resolved path and whether they were read with
#: their own imports, with the text they were read with and the text of each module their
#: analysis read (a factory module): a trainer module imported by several scripts is analysed
#: once per process, and again once one of those texts changes.
_LOADED: dict[
    tuple[Path, bool], tuple[bytes, ScriptModel | None, tuple[tuple[Path, bytes], ...]]
] = {}
_LOADED_KEPT = 16


def load_caller(file: Path) -> ScriptModel | None:
    """`load_module` of a file that may hand an accelerator or prepared objects: one that
    names an accelerator in its code (`MAY_USE_ACCELERATOR`, then Python's parser) or gets one
    from a factory of the project; None for any other (its calls hand nothing prepared)."""
    from accelify.analysis.project_modules import read

    data = read(file)
    named = MAY_USE_ACCELERATOR.search(data) is not None and (
        _plainly_named_in_code(data) or code_may_use_accelerator(data, str(file))
    )
    if not named and not _factory_imported(str(file), data):
        return None
    return load_module(file)


def load_module(file: Path) -> ScriptModel | None:
    """``file`` analysed with the Accelerators its own project imports give it (a caller's
    ``accelerator = build_accelerator(args)``), not with its callers' facts; None when it
    cannot be read or parsed. Kept for the next file that asks while its text is the same."""
    return _loaded(file, imports=True)


def _load_alone(file: Path) -> ScriptModel | None:
    """``file`` analysed alone: a factory's module, read for what it constructs."""
    return _loaded(file, imports=False)


def _loaded(file: Path, imports: bool) -> ScriptModel | None:
    load_analysis()
    from accelify.analysis.outside_callers import ProjectView
    from accelify.analysis.project_modules import imported_files, read
    from accelify.analysis.script_model import analyze

    key = (file.resolve(), imports)
    data = read(file)
    kept = _LOADED.get(key)
    if kept is not None and kept[0] == data and all(read(p) == text for p, text in kept[2]):
        return kept[1]
    view = None
    imported = list(imported_files(file, data).values()) if imports else []
    if imported:
        view = ProjectView(file, (), _load_alone, constructs_for=_constructs_for)
    try:
        model: ScriptModel | None = analyze(parse(data, str(file)), project=view)
    except (UserError, RecursionError):
        model = None
    if len(_LOADED) >= _LOADED_KEPT:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = (data, model, tuple((p, read(p)) for p in imported))
    return model


def _name_callers_of(
    findings: list[Finding],
    script: ScriptModel,
    data: bytes,
    path: str,
    selection: Selection,
    project: ProjectView | None,
) -> None:
    """`_name_the_callers`, where the project's other modules handed the file something."""
    if project is not None and findings and (script.given_parameters or project.run_by_every_rank):
        _name_the_callers(findings, script, data, path, selection)


def _name_the_callers(
    findings: list[Finding], script: ScriptModel, data: bytes, path: str, selection: Selection
) -> None:
    """A finding the file alone would not give came from what another module's calls hand a
    function: its message names them (the caller's file and line), where the finding sits in
    that function (or the class whose constructor it is)."""
    from accelify.analysis.script_model import analyze

    alone = {(f.line, f.code) for f in _check(analyze(script.module), data, path, selection)}
    everyone = script.project.run_by_every_rank if script.project is not None else {}
    spans = []
    for function in dict.fromkeys([*script.given_parameters, *everyone]):
        constructor = function.name.value == "__init__"
        cls = script.index.enclosing_class(function)
        owner = cls if constructor else None
        position = script.position(owner or function)
        name = f"{function.name.value}()" if cls is None else cls.name.value
        if cls is not None and not constructor:
            name += f".{function.name.value}()"  # a method of an instance the caller made
        given = script.given_parameters.get(function, {})
        handed = [g.says(parameter) for parameter, g in given.items()]
        where = next(iter(given.values())).where if given else everyone[function]
        said = f"{where} calls {name}"
        if handed:
            said += " with " + ", ".join(handed)
        if function in everyone:
            said += " on every rank"
        spans.append((position.start.line, position.end.line, where, said))
    for finding in findings:
        if (finding.line, finding.code) in alone:
            continue
        said = [
            text
            for first, last, where, text in spans
            if first <= finding.line <= last and where not in finding.message
        ]
        if said:
            finding.message += f" ({'; '.join(said)})"


def _portable(findings: list[Finding], script: ScriptModel) -> list[Finding]:
    """The findings with their fixes as text edits: the file's code is generated once, each
    plan applied to the part of the file it rewrites (`text_edits`)."""
    fixable = [finding for finding in findings if finding.fix is not None]
    if not fixable:
        return findings
    from accelify.edits.text_edit import text_edits

    plans = [f.fix for f in fixable]
    edits = iter(text_edits(script.module, plans, script.parent, script.position))  # type: ignore[arg-type]
    return [finding.portable(next(edits)) if finding.fix else finding for finding in findings]


def _check(script: ScriptModel, data: bytes, path: str, selection: Selection) -> list[Finding]:
    if not script.uses_accelerator:
        return []
    reported = [
        (rule, finding)
        for rule in load_rules()
        if selection.enabled(rule.code, path)
        for finding in rule.check(script)
    ]
    if not reported:
        return []  # the classes below cost a code generation: asked only about a finding
    lines = data.decode("utf-8", errors="replace").splitlines()
    single_device = _single_device_classes(script)
    found: list[Finding] = []
    covered: set[tuple[int, str]] = set()  # whole lines, a rule's `Rule.covers`
    covered_at: set[tuple[int, int, str]] = set()  # places, a finding's `Finding.covers`
    for rule, finding in reported:
        finding.path = path
        if any(first <= finding.line <= last for first, last in single_device):
            continue
        if not suppressed(lines, finding.line, finding.code):
            found.append(finding)
            covered.update((finding.line, code) for code in rule.covers)
            covered_at.update(finding.covers)
    found = [
        f
        for f in found
        if (f.line, f.code) not in covered and (f.line, f.column, f.code) not in covered_at
    ]
    return sorted(found, key=lambda f: (f.line, f.column, f.code))


def _single_device_classes(script: ScriptModel) -> list[tuple[int, int]]:
    """The line ranges of the file's top-level classes that train on one device on their own:
    a ``BasicTrainer`` next to the ``AcceleratedTrainer`` of the same file (a course's two
    versions of one trainer). Such a class never names an accelerator (no word of
    `ACCELERATOR_WORDS` in its code), derives from nothing (no base that could hold one), is
    not registered by a decorator, nothing else in the file names it (no instance is made
    here and handed prepared objects), and it holds no object of a class that has an
    accelerator (`_holding_accelerators`: a runner's ``self.trainer = Trainer(cfg)``, made by
    another module of the project that imports it).
    What its methods do is right for the one device they run on; the accelerator rules'
    advice there would name an accelerator the class does not have."""
    import libcst as cst

    module = script.module
    found: list[cst.ClassDef] = []
    named: dict[str, set[int]] | None = None
    for statement in module.body:
        if not isinstance(statement, cst.ClassDef) or _has_bases(statement):
            continue
        if statement.decorators:
            continue  # registered (``@register_trainer``): made elsewhere, with what it is given
        if named is None:
            named = _statements_naming(module)
        if named.get(statement.name.value, set()) - {id(statement)}:
            continue  # named outside its own body (before its code is generated: that costs)
        if _handed_prepared(script, statement):
            continue  # another module makes it with prepared objects (an evaluator's loader)
        code = module.code_for_node(statement)
        if ACCELERATOR_WORDS.search(code.encode()) is not None:
            continue
        found.append(statement)
    if found:
        holding = _holding_accelerators(script)
        found = [statement for statement in found if statement not in holding]
    ranges = []
    for statement in found:
        position = script.position(statement)
        ranges.append((position.start.line, position.end.line))
    return ranges


def _handed_prepared(script: ScriptModel, cls: cst.ClassDef) -> bool:
    """Every call of the project's other modules hands a method of ``cls`` (its constructor,
    its ``__call__``) a prepared object (`ScriptModel.given_parameters`)."""
    return any(
        given.prepared
        for function, parameters in script.given_parameters.items()
        if script.inside(function, cls)
        for given in parameters.values()
    )


def _holding_accelerators(script: ScriptModel) -> set[cst.ClassDef]:
    """The file's classes whose instances hold an accelerator: one that uses one itself
    (`_using_an_accelerator`), derives from such a class, or makes or receives an instance of
    one: a call that makes it (``self.trainer = Trainer(cfg)``, or a factory of this file that
    returns one: `CallGraph.made_by`), or an annotation that names it (``def __init__(self,
    trainer: Trainer)``). A runner holding ``self.trainer`` reads the trainer's prepared model
    through it (``self.trainer.model``), with the trainer's own accelerator."""
    import libcst as cst

    from accelify.analysis.syntax import walk

    graph = script.call_graph
    classes = list(dict.fromkeys(graph.classes.values()))
    holding = _using_an_accelerator(script)
    uses: dict[cst.ClassDef, set[str]] = {}
    for cls in classes:
        if cls in holding:
            continue
        named: set[str] = set()
        for node in walk(cls):
            if isinstance(node, cst.Call):
                named.add(graph.made_by(node) or "")
            elif isinstance(node, cst.Annotation):  # ``trainer: Trainer``, ``"Trainer | None"``
                for inner in walk(node.annotation):
                    if isinstance(inner, cst.Name):
                        named.add(inner.value)
                    elif isinstance(inner, cst.SimpleString):
                        named |= _names_in_annotation_string(inner)
        uses[cls] = named
    changed = True
    while changed:
        changed = False
        names_held = {cls.name.value for cls in holding}
        for cls, named in uses.items():
            if cls in holding:
                continue
            if named & names_held or any(base in holding for base in graph.bases(cls)):
                holding.add(cls)
                changed = True
    return holding


def _names_in_annotation_string(annotation: cst.SimpleString) -> set[str]:
    """``"Trainer | None"``, ``"Optional[Trainer]"``: the names a quoted annotation reads."""
    import libcst as cst

    from accelify.analysis.syntax import walk

    try:
        parsed = cst.parse_expression(str(annotation.evaluated_value))
    except (cst.ParserSyntaxError, ValueError):
        return set()
    return {node.value for node in walk(parsed) if isinstance(node, cst.Name)}


def _using_an_accelerator(script: ScriptModel) -> set[cst.ClassDef]:
    """The classes the analysis sees using an accelerator: one bound in them (``self.accelerator
    = Accelerator()``, or from a factory), a method receiving one, a ``prepare`` call, or a
    member of an accelerator read there (``self.accelerator.backward`` set by a base class of
    another module)."""
    from accelify.analysis.script_model import Kind
    from accelify.analysis.syntax import dotted

    index = script.index
    nodes: list[cst.CSTNode] = [binding.assign for binding in script.of_kind(Kind.ACCELERATOR)]
    nodes += list(script.accelerator_params)
    nodes += [prepare.call for prepare in script.prepare_calls]
    accelerators = script.names_of(Kind.ACCELERATOR)
    nodes += [use for use in script.member_uses if dotted(use.value) in accelerators]
    return {cls for node in nodes if (cls := index.enclosing_class(node)) is not None}


def _has_bases(statement: cst.ClassDef) -> bool:
    import libcst as cst

    return any(
        not (isinstance(base.value, cst.Name) and base.value.value == "object")
        for base in statement.bases
    )


def _statements_naming(module: cst.Module) -> dict[str, set[int]]:
    """For each name, the top-level statements (by id) that hold it: a class's name held by
    another statement than the class is read outside its own body. One walk of the file."""
    import libcst as cst

    from accelify.analysis.syntax import walk

    found: dict[str, set[int]] = {}
    for statement in module.body:
        for node in walk(statement):
            if type(node) is cst.Name:
                found.setdefault(node.value, set()).add(id(statement))
    return found


def _fix(
    data: bytes,
    path: str,
    selection: Selection,
    project: ProjectView | None = None,
    rounds: int = 5,
) -> tuple[bytes, int]:
    """One fix per node per round; later rounds see the earlier rounds' code. A result that
    Python cannot compile is never returned: the file stays as it was."""
    from accelify.analysis.script_model import analyze
    from accelify.edits.apply import ApplyPlan

    current, applied = data, 0
    for _ in range(rounds):
        module = parse(current, path)
        model = analyze(module, project=project)
        findings = _check(model, current, path, selection)
        plans = [f.fix for f in findings if f.fix is not None]
        if not plans:
            break
        merged = plans[0]
        for plan in plans[1:]:
            merged.merge(plan)
        updated = module.visit(ApplyPlan(merged, model.position)).bytes
        if updated == current:
            break
        current, applied = updated, applied + len(plans)
    if current != data and not _compiles(current, path):
        return data, 0
    return current, applied


def _compiles(data: bytes, path: str) -> bool:
    try:
        compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        import sys

        print(
            f"accelify: warning: {path}: the fixes gave code that does not compile; "
            "left unchanged (please report this)",
            file=sys.stderr,
        )
        return False
    return True
