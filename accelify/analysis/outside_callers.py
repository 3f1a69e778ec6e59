"""What the project's other modules tell about this one: the objects their calls hand this
module's functions and classes, and the Accelerators their factories return.

``train.py`` prepares ``model, loader`` and calls ``Trainer(accelerator, model, loader)`` of
``trainer.py``, and ``validate(accelerator, model, loader)`` of ``utils.py``: read alone, those
modules do not know that ``self.model`` is the wrapper (its ``state_dict()`` is the wrapper's) or
that ``loader`` is each rank's shard (a metric summed over it is one rank's). `ProjectView`
carries those facts into the callee's analysis (`ScriptModel.given_parameters`), each with the
caller's file and line, so the analysis sees the parameter as it sees one a call of its own
file fills. A fact is carried only when every call site agrees: every call the importing
modules make of the function hands the same kind of object to the parameter, the prepared one,
no call is under a rank test (what a guarded caller hands runs on one rank, which the callee's
own analysis cannot see), and the file itself never calls the function by name (its own call sites
speak for it).

The facts travel as plain data (`HandedCall`): the linter analyses each importing module once,
for its own findings, and keeps what its calls hand (`handed_calls`); the modules it imports are
linted after it, with those facts (and a chain ``train.py -> trainer.py -> utils.py`` carries
them on: what ``train.py`` hands ``Trainer`` makes ``self.model`` the wrapper, which
``trainer.py`` hands ``utils.validate``). A method counts as the class's own when the caller
made the instance itself (``trainer = Trainer(...)``, then ``trainer.fit(loader)``).

The other direction needs no caller: ``accelerator = build_accelerator(args)`` of a module that
returns ``Accelerator(...)`` makes ``accelerator`` one (`accelerator_factories`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.project_modules import (
    calls_any,
    imported_files,
    kept_calls,
    read,
    split_member,
    top_level_names,
)
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    has_parameter,
    rebound_targets,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.imported_returns import Returned
    from accelify.analysis.script_model import Kind, ScriptModel

#: How a module is analysed (the engine's parse and `analyze`): None when it does not parse.
Load = Callable[[Path], "ScriptModel | None"]
#: ``def name``, ``async def name`` or ``class Name`` where a line starts
_TOP_LEVEL_NAME = re.compile(rb"(?:async\s+)?(def|class)\s+(\w+)")
#: What a module's text must name before it is analysed for an Accelerator factory.
_ACCELERATOR_CLASS = b"Accelerator"


@dataclass(frozen=True)
class Given:
    """What every call site of the project hands one parameter."""

    #: None: a prepared object whose kind the caller cannot name (``train_loader, val_loader =
    #: get_loaders()`` of a third module, then prepared): prepared all the same
    kind: Kind | None
    prepared: bool  # the object a prepare call returned (the accelerator: False)
    where: str  # the first call site, ``train.py:12``

    def says(self, parameter: str) -> str:
        """``model`` a prepared model, ``acc`` the accelerator: for a message."""
        what = self.kind.value if self.kind is not None else "object"
        if self.prepared:
            return f"{parameter} a prepared {what}"
        return f"{parameter} the {what}"


@dataclass(frozen=True)
class HandedCall:
    """One call a module makes of a function, class or method of another module of the project,
    as plain data (it is cached beside the caller's findings and crosses `--jobs` processes):
    what each argument hands, read from the caller's own analysis (`handed_calls`)."""

    module: str  # the called module's resolved path
    member: str  # ``validate``; ``Trainer`` (its constructor); ``Trainer.fit`` (a method)
    caller: str  # the calling file, as it was linted
    line: int
    guarded: bool  # runs on some ranks only (`_guarded`)
    #: the arguments that hand something: (position among the call's arguments, keyword or
    #: "", the `Kind`'s value ("" for a prepared object of no known kind), whether prepared);
    #: an argument handing nothing is left out
    arguments: tuple[tuple[int, str, str, bool], ...] = ()
    #: a call of an Accelerator factory whose ``gradient_accumulation_steps`` is not 1, and the
    #: caller trains with what it returns without accumulating (`accumulation_unhandled`,
    #: answered from the analysis the caller was linted with: ACC304 of the factory's module
    #: reads it here instead of analysing the caller again)
    unaccumulated: bool = False
    #: the Accelerators the accelerator this call hands is made by, as the caller knows them
    #: (`handed_accelerators.made_for`, also two modules away): each one's ``mixed_precision``
    #: and place, relative to the caller's folder
    accelerators: tuple[tuple[str, str], ...] = ()

    def where(self, to: Path) -> str:
        """``train.py:12``, relative to the called module's folder."""
        return f"{_relative(Path(self.caller), to)}:{self.line}"

    def as_list(self) -> list:
        return [
            self.module,
            self.member,
            self.caller,
            self.line,
            self.guarded,
            self.arguments,
            self.unaccumulated,
            self.accelerators,
        ]

    @classmethod
    def from_list(cls, item: list) -> HandedCall:
        module, member, caller, line, guarded, arguments, unaccumulated, accelerators = item
        return cls(
            str(module),
            str(member),
            str(caller),
            int(line),
            bool(guarded),
            tuple((int(a), str(b), str(c), bool(d)) for a, b, c, d in arguments),
            bool(unaccumulated),
            tuple((str(precision), str(where)) for precision, where in accelerators),
        )


@dataclass
class ProjectView:
    """One module of a project as the rest of the project sees it. ``handed``: what the calls
    of the linted files that import it hand (`handed_calls` of their analyses); ``importers``:
    importing files whose analyses are not at hand (an import cycle: each waits for the other),
    analysed by ``load`` and read the same way; ``handing``: the files ``handed`` came from."""

    path: Path
    importers: tuple[Path, ...] = ()
    load: Load | None = None
    #: how a factory's module is analysed (alone: no module's facts go further than one step)
    load_alone: Load | None = None
    #: whether a module's text may hold a factory of accelerators for these kept calls' names
    #: (a test of the text before an analysis: most imported modules construct none)
    constructs_for: Callable[[bytes, set[bytes]], bool] | None = None
    handed: tuple[HandedCall, ...] = ()
    handing: tuple[Path, ...] = ()
    #: every linted file that imports the module, also one that names no accelerator (it
    #: hands nothing, but may run a trainer's hook: `callers_of`), and how such a file is
    #: analysed (whatever it names)
    callers: tuple[Path, ...] = ()
    load_any: Load | None = None
    #: the project modules read for the facts (an importer analysed here and the modules it
    #: imports, a factory's module): a change in one of them may change the findings, so the
    #: lint cache keys its entry on their digests (`FileResult.read_modules`)
    read: set[Path] = field(default_factory=set)
    #: the module's functions and methods that every rank runs: each call of the importing
    #: modules is outside any rank test, and the file itself calls them nowhere (with the
    #: first call site); set by `given`
    run_by_every_rank: dict[cst.FunctionDef, str] = field(default_factory=dict)
    #: the module's functions and methods that some importing module calls on some ranks only
    #: (under a rank test): what they hand on runs on those ranks (`_guarded`)
    called_on_some_ranks: set[cst.FunctionDef] = field(default_factory=set)
    #: the factories `accelerator_factories` found that set ``gradient_accumulation_steps``
    #: (not 1), by the factory module's resolved path and the function's name, with that
    #: argument: what a caller's `handed_calls` answers ACC304's question with
    factory_steps: dict[tuple[str, str], cst.BaseExpression] = field(default_factory=dict)
    _module: cst.Module | None = field(default=None, repr=False)
    #: `imported_returns` by the call asked about
    _returns: dict[cst.Call, Returned] = field(default_factory=dict, repr=False)
    #: `_may_make_loaders`: the top-level names of each module read that makes DataLoaders
    _loader_modules: dict[Path, dict[str, bool]] = field(default_factory=dict, repr=False)

    def given(self, module: cst.Module) -> dict[cst.FunctionDef, dict[str, Given]]:
        """For each top-level function, class constructor and method of ``module``, what every
        call of the importing modules hands its parameters (see the module docstring)."""
        self._module = module
        self.called_on_some_ranks = set()
        targets = _targets(module)
        calls = self._incoming(targets)
        if not calls:
            return {}
        answers: dict[cst.FunctionDef, dict[str, list[Given | None]]] = {}
        # a function (or class, or method) the module calls itself: its own call sites speak
        excluded = _called_in(module, targets)
        sites: dict[cst.FunctionDef, str] = {}
        for call in calls:
            target = targets.get(call.member)
            if target is None:
                continue
            function, implicit = target
            if call.guarded:
                excluded.add(function)
                self.called_on_some_ranks.add(function)
                continue
            where = call.where(self.path)
            sites.setdefault(function, where)
            handed = _bound(function, implicit, call, where)
            slots = answers.setdefault(function, {})
            for parameter in _parameters(function, implicit):
                slots.setdefault(parameter, []).append(handed.get(parameter))
        self.run_by_every_rank = {
            function: where for function, where in sites.items() if function not in excluded
        }
        found: dict[cst.FunctionDef, dict[str, Given]] = {}
        for function, slots in answers.items():
            if function in excluded:
                continue
            for parameter, givens in slots.items():
                first = givens[0]
                if first is not None and all(
                    g is not None and (g.kind, g.prepared) == (first.kind, first.prepared)
                    for g in givens
                ):
                    found.setdefault(function, {})[parameter] = first
        return found

    def _incoming(self, targets: dict[str, tuple[cst.FunctionDef, int]]) -> list[HandedCall]:
        """The calls into this module: those handed as data, then those of the importers
        analysed here (an import cycle), each only when its text calls one of ``targets``
        (most of a package's cyclic imports call nothing: ``__init__`` re-exports)."""
        this = str(self.path.resolve())
        calls = [call for call in self.handed if call.module == this]
        if self.load is None or not self.importers:
            return calls
        named = {name.rpartition(".")[2] for name in targets}
        for importer in self.importers:
            if not calls_any(read(importer), named):
                continue
            self.read.add(importer)
            self.read.update(imported_files(importer, read(importer)).values())
            caller = self.load(importer)
            if caller is not None:
                calls += [c for c in handed_calls(caller, importer) if c.module == this]
        return calls

    def callers_of(
        self,
        function: cst.FunctionDef,
        owner: str | None = None,
        skip: frozenset[Path] = frozenset(),
    ) -> list[tuple[ScriptModel, cst.Call, str]]:
        """The calls of the importing modules that run ``function`` (a top-level function of
        the module `given` read, or a method of its class ``owner``: ``trainer.legacy_update()``
        on a ``Trainer(...)`` it made), each with its module's analysis and its place
        (``train.py:12``). A rule that asks reads whole analyses of the importers (loaded
        here, once per process: `ProjectView.load`)."""
        if self.load is None or self._module is None:
            return []
        this = self.path.resolve()
        wanted = f"{owner}.{function.name.value}" if owner else function.name.value
        # a class's ``__init__`` runs where the class is built (``Trainer(accelerator, ...)``)
        built = owner if owner and function.name.value == "__init__" else None
        spelled = {function.name.value} | ({built} if built else set())
        found = []
        known = (*self.handing, *self.importers)
        for importer in dict.fromkeys((*known, *self.callers)):
            if importer.resolve() in skip:
                continue  # answered from what it handed (`HandedCall`): not analysed again
            self.read.add(importer)  # a later edit that calls the name changes the answer
            if importer not in known and not calls_any(read(importer), spelled):
                continue  # its text never calls the name: read no further
            self.read.update(imported_files(importer, read(importer)).values())
            caller = self.load(importer)
            if caller is None and importer not in known and self.load_any is not None:
                caller = self.load_any(importer)  # names no accelerator, may run the hook
            if caller is None:
                continue
            for call, module, member in _project_calls(caller, importer):
                if module.resolve() == this and member in (wanted, built):
                    found.append(
                        (caller, call, f"{_relative(importer, self.path)}:{caller.line(call)}")
                    )
        return found

    def accelerator_factories(self, model: ScriptModel) -> set[str]:
        """The names this file calls (``build_accelerator``, ``train_util.make_accelerator``)
        that are functions of a project module returning an ``Accelerator(...)``."""
        if self.load is None:
            return set()
        from accelify.analysis.accelerator_objects import local_factories
        from accelify.analysis.accumulation import factory_accumulation_steps

        found: set[str] = set()
        kept: set[bytes] | None = None
        for call in model.calls:
            name = dotted(call.func)
            if name is None or not isinstance(model.parent(call), (cst.Assign, cst.AnnAssign)):
                continue
            qualified = model.imports.resolve(name)
            split = split_member(qualified, self.path) if qualified else None
            if split is None:
                continue
            if kept is None:
                kept = kept_calls(model.source.encode())
            text = read(split[0])
            if not (self.constructs_for or _names_a_class)(text, kept):
                continue
            other = (self.load_alone or self.load)(split[0])
            if other is None:
                continue
            self.read.add(split[0])
            if split[1] in local_factories(other):
                found.add(name)
                steps = factory_accumulation_steps(other).get(split[1])
                if steps is not None:
                    self.factory_steps[(str(split[0].resolve()), split[1])] = steps
        return found

    def factory_construction(
        self, model: ScriptModel, call: cst.Call
    ) -> tuple[cst.Call, ScriptModel, Path] | None:
        """The ``Accelerator(...)`` that a factory of another project module, run by ``call``
        of this file (``accelerator = make_accelerator(args)``), returns, with that module's
        analysis (alone) and file; None for any other call."""
        from accelify.analysis.accelerator_objects import factory_constructions

        name = dotted(call.func)
        load = self.load_alone or self.load
        qualified = model.imports.resolve(name) if name and load is not None else None
        split = split_member(qualified, self.path) if qualified else None
        if split is None or load is None or _ACCELERATOR_CLASS not in read(split[0]):
            return None
        other = load(split[0])
        if other is None:
            return None
        self.read.add(split[0])  # a later edit of the factory changes the answer
        made = factory_constructions(other).get(split[1])
        return (made, other, split[0]) if made is not None else None

    def imported_returns(self, model: ScriptModel, call: cst.Call) -> Returned:
        """What ``call`` of the module returns where it runs a factory of another module of
        the project that makes DataLoaders (`imported_returns.returned_by_project`, the
        conversion's answer too), analysed alone; empty for any other call. A module whose
        text makes no DataLoader is not analysed for it."""
        kept = self._returns.get(call)
        if kept is not None:
            return kept
        from accelify.analysis.imported_returns import Returned, returned_by_project

        load = self.load_alone or self.load
        found = Returned()
        if load is not None:
            found, file = returned_by_project(self.path, model, call, load, self._may_make_loaders)
            if file is not None:
                self.read.add(file)  # a later edit of the factory changes the answer
        self._returns[call] = found
        return found

    def function_called(
        self, model: ScriptModel, call: cst.Call
    ) -> tuple[cst.FunctionDef, ScriptModel, Path] | None:
        """The function of another module of the project that ``call`` (of ``model``, this
        module's analysis) runs: a top-level function imported from it, or a method of a class
        imported from it (`imported_returns.defined_beside`), with that module's analysis
        (alone) and file; None for any other call."""
        load = self.load_alone or self.load
        if load is None:
            return None
        from accelify.analysis.imported_returns import defined_beside

        found = defined_beside(self.path, model, call, load)
        if found is not None:
            self.read.add(found[2])  # a later edit of the helper changes the answer
        return found

    def _may_make_loaders(self, file: Path, name: str, method: bool) -> bool:
        """``file``'s text defines ``name`` at its top level (a package's ``__init__`` that
        re-exports it does not: not analysed for it, as the conversion does not), and its
        definition names a DataLoader: a factory that only hands on another's call (``return
        build(cfg)``) is not followed here; ``method``: ``name`` is to be a class (a method of
        it is called), else a function. Each file's text is read once."""
        names = self._loader_modules.get(file)
        if names is None:
            names = _defining_loaders(read(file))
            self._loader_modules[file] = names
        return names.get(name) is method

    def imported_class(
        self, model: ScriptModel, name: str
    ) -> tuple[ScriptModel, cst.ClassDef] | None:
        """The class a name this file imports from a project module stands for (a base class:
        ``from .base_trainer import BaseAcceleratedTrainer``), with that module's analysis;
        None for a name of no project module."""
        found = self.class_imported_by(model, name, self.path)
        return found[:2] if found is not None else None

    def class_imported_by(
        self, model: ScriptModel, name: str, file: Path
    ) -> tuple[ScriptModel, cst.ClassDef, Path] | None:
        """`imported_class` of ``model``, the analysis of the project module ``file`` (this
        file, or one a class of it was read from: a reward model's backbone imported by the
        module that defines the reward model), with the defining module's file, so that what
        that class imports in turn is looked up from its own module. A dotted name reads
        through an imported module (``from models import net``, then ``net.Net``)."""
        if self.load is None:
            return None
        qualified = model.imports.resolve(name)
        split = split_member(qualified, file) if qualified else None
        if split is None or b"class " + split[1].encode() not in read(split[0]):
            return None
        other = (self.load_alone or self.load)(split[0])
        if other is None:
            return None
        self.read.add(split[0])
        found = next(
            (
                c
                for c in other.module.body
                if isinstance(c, cst.ClassDef) and c.name.value == split[1]
            ),
            None,
        )
        return (other, found, split[0]) if found is not None else None


#: A line of a module's text at its top level: code at column 0 (not a comment, nor the
#: closing parenthesis of a signature split over lines)
_TOP_LEVEL_LINE = re.compile(rb"^[^\s#)\]}]", re.MULTILINE)


def _defining_loaders(text: bytes) -> dict[str, bool]:
    """The functions and classes (True) a module's text defines at its top level whose text
    names a DataLoader (no parse: what is worth analysing the module for)."""
    if b"DataLoader" not in text:
        return {}
    starts = [m.start() for m in _TOP_LEVEL_LINE.finditer(text)] + [len(text)]
    found = {}
    for start, end in itertools.pairwise(starts):
        defined = _TOP_LEVEL_NAME.match(text, start)
        if defined is not None and b"DataLoader" in text[start:end]:
            found[defined.group(2).decode()] = defined.group(1) == b"class"
    return found


def _names_a_class(text: bytes, kept: set[bytes]) -> bool:
    return _ACCELERATOR_CLASS in text


def _called_in(module: cst.Module, targets: dict[str, tuple[cst.FunctionDef, int]]) -> set:
    """The targets the module calls itself: a function or class by its plain name
    (``evaluate(...)``, ``Trainer(...)``), a method by its name on any object (``x.fit()``,
    ``self.fit()``), anywhere in it."""
    plain: set[str] = set()
    members: set[str] = set()
    for node in walk(module):
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name):
                plain.add(node.func.value)
            elif isinstance(node.func, cst.Attribute):
                members.add(node.func.attr.value)
    found = set()
    for name, (function, _) in targets.items():
        owner, _, method = name.rpartition(".")
        if (method in members) if owner else (name in plain):
            found.add(function)
    return found


def _targets(module: cst.Module) -> dict[str, tuple[cst.FunctionDef, int]]:
    """The module's top-level functions by name, each top-level class's ``__init__`` under the
    class's name and its other methods as ``Class.method``, with the parameters the call binds
    itself (``self``: one; a static method none)."""
    found: dict[str, tuple[cst.FunctionDef, int]] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            found[statement.name.value] = (statement, 0)
        elif isinstance(statement, cst.ClassDef):
            for inner in statement.body.body:
                if not isinstance(inner, cst.FunctionDef):
                    continue
                decorators = {_decorator(d.decorator) for d in inner.decorators}
                if decorators - {"staticmethod", *_GRADIENT_MODES}:
                    continue  # a property, a class method, a wrapped method: not plainly called
                implicit = 0 if "staticmethod" in decorators else 1
                name = inner.name.value
                key = (
                    statement.name.value if name == "__init__" else f"{statement.name.value}.{name}"
                )
                found[key] = (inner, implicit)
    return found


#: Decorators that run the method as it is, gradients off or on: its call binds as written.
_GRADIENT_MODES = frozenset(
    f"{prefix}{mode}"
    for prefix in ("", "torch.")
    for mode in ("no_grad", "inference_mode", "enable_grad")
)


def _decorator(decorator: cst.BaseExpression) -> str | None:
    """``staticmethod``; ``torch.no_grad`` for ``@torch.no_grad()`` (called with nothing)."""
    if isinstance(decorator, cst.Call) and not decorator.args:
        decorator = decorator.func
    return dotted(decorator)


def _parameters(function: cst.FunctionDef, implicit: int) -> list[str]:
    params = function.params
    return [p.name.value for p in (*params.params[implicit:], *params.kwonly_params)]


def _bound(
    function: cst.FunctionDef, implicit: int, call: HandedCall, where: str
) -> dict[str, Given]:
    """What ``call`` hands each parameter of ``function``, bound as Python binds it (as
    `objects.bound_arguments` binds a call of the file)."""
    from accelify.analysis.script_model import Kind

    positional = [p.name.value for p in function.params.params][implicit:]
    found: dict[str, Given] = {}
    for index, keyword, kind, prepared in call.arguments:
        parameter = keyword or (positional[index] if index < len(positional) else None)
        if parameter is not None:
            found[parameter] = Given(Kind(kind) if kind else None, prepared, where)
    return found


def handed_calls(
    caller: ScriptModel, path: Path, modules: set[str] | None = None
) -> tuple[HandedCall, ...]:
    """What ``caller`` (the analysis of ``path``) hands the functions, classes and methods of
    the project's other modules (of ``modules`` only, by resolved path, when given), call by
    call: the accelerator, or a model, optimizer or loader a prepare call returned (the
    caller's own analysis answers), and whether the call runs on some ranks only. A file that
    uses no accelerator hands nothing worth carrying (none)."""
    if not caller.uses_accelerator:
        return ()
    from accelify.analysis.accumulation import accumulation_unhandled

    factories = caller.project.factory_steps if caller.project is not None else {}
    defined: dict[Path, set[str]] = {}
    found = []
    for call, module, member in _project_calls(caller, path):
        if modules is not None and str(module.resolve()) not in modules:
            continue
        if module not in defined:
            defined[module] = top_level_names(read(module))
        if member.partition(".")[0] not in defined[module]:
            continue  # a name the module imports (a package re-exporting): not its own
        guarded = _guarded(caller, call)
        arguments = () if guarded else _handed(caller, call)
        steps = factories.get((str(module.resolve()), member))
        accelerators = _accelerators_handed(caller, call, arguments)
        found.append(
            HandedCall(
                str(module.resolve()),
                member,
                str(path),
                caller.line(call),
                guarded,
                arguments,
                steps is not None and accumulation_unhandled(caller, steps),
                accelerators,
            )
        )
    return tuple(found)


def _accelerators_handed(
    caller: ScriptModel, call: cst.Call, arguments: tuple[tuple[int, str, str, bool], ...]
) -> tuple[tuple[str, str], ...]:
    """Where the accelerator ``call`` hands is made, as ``caller``'s analysis (with its own
    callers) knows it: what the called module reads when its callers' analyses, loaded without
    theirs, cannot tell (an accelerator handed on two modules away)."""
    from accelify.analysis.handed_accelerators import made_for
    from accelify.analysis.script_model import Kind

    found: list[tuple[str, str]] = []
    for index, _, kind, _ in arguments:
        if kind == Kind.ACCELERATOR.value:
            found += [
                (m.precision, m.where) for m in made_for(caller, call, call.args[index].value)
            ]
    return tuple(dict.fromkeys(found))


def project_calls(caller: ScriptModel, path: Path) -> Iterable[tuple[cst.Call, Path, str]]:
    """`_project_calls`, for the conversion: what a driver that uses no accelerator hands a
    class of the module it trains through (`convert.handed_loaders`)."""
    return _project_calls(caller, path)


def _project_calls(caller: ScriptModel, path: Path) -> Iterable[tuple[cst.Call, Path, str]]:
    """The calls of ``caller`` that run a function, class or method of another project module,
    with that module's file and the member's name (``Trainer.fit``): a name the imports resolve
    (``validate``, ``utils.validate``), or a method of an instance the file made of an imported
    class (``trainer = Trainer(...)`` then ``trainer.fit()``; ``Trainer(...).fit()``; the
    instance called, ``evaluator(model)``: ``Evaluator.__call__``)."""
    for call in caller.calls:
        name = dotted(call.func)
        qualified = caller.imports.resolve(name) if name else None
        split = split_member(qualified, path) if qualified else None
        if split is None and isinstance(call.func, cst.Name):
            split = _defaulted_class(caller, call, path)
        if split is not None:
            yield call, split[0], split[1]
            continue
        if not isinstance(call.func, cst.Attribute):
            # an instance called (``evaluator(model)``): its class's ``__call__``
            made = _instance_of(caller, call.func, path) if name is not None else None
            if made is not None:
                yield call, made[0], f"{made[1]}.__call__"
            continue
        made = _instance_of(caller, call.func.value, path)
        if made is not None:
            yield call, made[0], f"{made[1]}.{call.func.attr.value}"


def _defaulted_class(caller: ScriptModel, call: cst.Call, path: Path) -> tuple[Path, str] | None:
    """The project class a call of a parameter builds where the parameter defaults to it and
    nothing in the file hands it another (``checkpoint_manager(accelerator=accelerator)`` in
    ``def __init__(self, ..., checkpoint_manager=CheckPointManager)``): the class its callers
    leave in place, as `_project_calls` reads a call of the class by its name."""
    function = caller.index.enclosing_function(call)
    name = dotted(call.func)
    if function is None or name is None:
        return None
    param = next((p for p in all_params(function.params) if p.name.value == name), None)
    default = dotted(param.default) if param is not None and param.default is not None else None
    qualified = caller.imports.resolve(default) if default else None
    split = split_member(qualified, path) if qualified else None
    if split is None or not split[1][:1].isupper():
        return None  # a function's result, or no module of the project
    if any(
        dotted(target) == name
        for assignment in caller.index.own_assignments(function)
        for target in assigned_targets(assignment)
    ):
        return None  # bound again before the call, maybe
    handed = caller.call_graph.calls_of(function)
    if any(
        p == name for site, implicit in handed for p, _ in bound_arguments(function, site, implicit)
    ):
        return None  # a caller of the file hands another class
    return split


def _instance_of(
    caller: ScriptModel, value: cst.BaseExpression, path: Path
) -> tuple[Path, str] | None:
    """The project module and class ``value`` is an instance of: a construction
    (``Trainer(...)``) of a class the imports resolve to another module, or a name (``trainer``,
    ``self.trainer``) every assignment of the file binds to such a construction of one class."""
    if isinstance(value, cst.Call):
        name = dotted(value.func)
        qualified = caller.imports.resolve(name) if name else None
        split = split_member(qualified, path) if qualified else None
        if split is None or not split[1][:1].isupper():
            return None  # a function's result: what it returns is not known here
        return split
    name = dotted(value)
    if name is None or name.count(".") > 1 or (name.count(".") and not name.startswith("self.")):
        return None
    index = caller.index
    if name.startswith("self."):
        assignments = index.assignments_in_class(name, value)
    else:
        function = index.enclosing_function(value)
        if function is not None and has_parameter(function, name):
            return None
        assignments = [
            a for a in index.assignments_to(name) if index.enclosing_function(a) is function
        ]
    made = set()
    for assignment in assignments:
        if not isinstance(assignment, cst.Assign) or len(assignment.targets) != 1:
            return None
        if dotted(assignment.targets[0].target) != name or not isinstance(
            assignment.value, cst.Call
        ):
            return None
        split = _instance_of(caller, assignment.value, path)
        if split is None:
            return None
        made.add((split[0].resolve(), split[1]))
    if len(made) != 1:
        return None
    return next(iter(made))


def _handed(caller: ScriptModel, call: cst.Call) -> tuple[tuple[int, str, str, bool], ...]:
    """What ``call`` (in ``caller``) hands by each argument: the accelerator, or a prepared
    model, optimizer or loader (the caller's own analysis answers). A prepare call's result
    whose kind the caller cannot name (its input came from another module's function) is
    handed as prepared all the same (kind ``""``), as the callee's own call sites would tell
    (`Flow.parameter_prepared` needs no kind)."""
    from accelify.analysis.facts import facts_of
    from accelify.analysis.script_model import Kind

    facts = facts_of(caller)
    accelerators = caller.names_of(Kind.ACCELERATOR)
    found = []
    for index, argument in enumerate(call.args):
        if argument.star:
            continue
        keyword = argument.keyword.value if argument.keyword is not None else ""
        held = _prepared_holding(caller, call, argument.value)
        if held is not None:  # ``engine.evaluate(loaders["val"])`` after prepare stored it
            kind = _constructed_kind(caller, held)
            found.append((index, keyword, kind.value if kind is not None else "", True))
            continue
        name = dotted(argument.value)
        if name is None:
            continue
        if name in accelerators:
            found.append((index, keyword, Kind.ACCELERATOR.value, False))
            continue
        kind = facts.flow.kind_of(name, call)
        if kind is Kind.SCHEDULER and not facts.flow.prepared_argument(call, argument.value):
            # a scheduler the callee prepares (``Trainer(accelerator, ..., scheduler)``): how
            # its prepare makes it step is the callee's business (ACC408)
            found.append((index, keyword, Kind.SCHEDULER.value, False))
            continue
        if kind not in (Kind.MODEL, Kind.DATALOADER, Kind.OPTIMIZER, None):
            continue
        # a prepared local (or parameter), or an attribute the class was handed prepared
        # (``self.model``: a constructor's parameter every caller hands prepared)
        if facts.flow.prepared_argument(call, argument.value) or (
            name.startswith("self.") and name in caller.prepared_names
        ):
            kind = kind or _constructed_kind(caller, name)
            found.append((index, keyword, kind.value if kind is not None else "", True))
    return tuple(found)


def _prepared_holding(caller: ScriptModel, call: cst.Call, value: cst.BaseExpression) -> str | None:
    """``loaders["val"]`` (a dict's entry) or ``state.val_loader`` (an attribute of an object
    other than ``self``) that a prepare call of the function around ``call`` stored before it
    (``model, loaders["val"] = accelerator.prepare(model, loaders["val"])``): the entry as the
    prepare call's outputs spell it; None for anything else, and where anything else in that
    function may change what the entry holds (another store into it, a later rebinding of the
    container, a mutating method of it: ``loaders.update(...)``)."""
    from accelify.analysis.flow import string_key_of
    from accelify.analysis.keyed_dicts import mutated_keys
    from accelify.analysis.script_model import output_name

    if isinstance(value, cst.Subscript):
        entry = string_key_of(value)
        if entry is None:
            return None
        container = entry[0]
    else:
        name = dotted(value)
        if name is None or name.count(".") != 1 or name.startswith("self."):
            return None  # a plain name or ``self.x``: the caller's own analysis answers
        container = name.partition(".")[0]
    spelled = output_name(caller, value)
    function = caller.index.enclosing_function(call)
    scope: cst.CSTNode = function if function is not None else caller.module
    stores = [
        p
        for p in caller.prepare_calls
        if spelled in p.outputs and caller.index.enclosing_function(p.call) is function
    ]
    if not stores or any(caller.order(p.call) > caller.order(call) for p in stores):
        return None
    first = min(caller.order(p.call) for p in stores)
    preparing = {id(p.call) for p in stores}
    for node in walk(scope):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del, cst.For)):
            for target in rebound_targets(node):
                if output_name(caller, target) == spelled and not (
                    isinstance(node, cst.Assign) and id(node.value) in preparing
                ):
                    return None  # stored by something else than the prepare call
                if dotted(target) == container and caller.order(node) > first:
                    return None  # the container bound again after the prepare call
    if isinstance(value, cst.Subscript) and mutated_keys(container, scope) is None:
        return None  # ``loaders[split] = ...``, ``loaders.update(...)``: any key may change
    return spelled


def _constructed_kind(caller: ScriptModel, name: str) -> Kind | None:
    """The kind of what ``prepare`` returned into ``name`` from a construction written in its
    call (``model, loader = prepare(torch.nn.Linear(2, 2), DataLoader(...))``): the
    constructor's, as the file itself reads it; None when the prepare calls binding ``name``
    disagree or one is not such a construction."""
    from accelify.analysis.script_model import value_classifier

    classify = value_classifier(caller)
    kinds = set()
    for prepare in caller.prepare_calls:
        if name not in prepare.outputs:
            continue
        position = prepare.outputs.index(name)
        arguments = [a for a in prepare.call.args if not a.star and a.keyword is None]
        if len(arguments) != len(prepare.outputs):
            return None
        kinds.add(classify(arguments[position].value, name))
    return kinds.pop() if len(kinds) == 1 else None


def _guarded(caller: ScriptModel, call: cst.Call, depth: int = 0) -> bool:
    """``call`` runs on some ranks only: under a rank test, or in a function of ``caller``
    that some call of that file runs under one (three calls up at most; a function handed on
    as a value is taken as guarded: who runs it is unknown), or that a module importing
    ``caller`` calls under one (`ProjectView.called_on_some_ranks`)."""
    if caller.under_rank_guard(call):
        return True
    function = caller.index.enclosing_function(call)
    if function is None or depth >= 3:
        return function is not None
    project = caller.project
    if project is not None and function in project.called_on_some_ranks:
        return True  # its own callers, in another module, run it on some ranks
    graph = caller.call_graph
    if graph.references(function) or graph.uncertain_callers(function):
        return True
    return any(_guarded(caller, site, depth + 1) for site, _ in graph.calls_of(function))


def _relative(file: Path, to: Path) -> str:
    try:
        return str(file.resolve().relative_to(to.resolve().parent))
    except ValueError:
        return str(file)
