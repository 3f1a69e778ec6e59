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

The other direction needs no caller: ``accelerator = build_accelerator(args)`` of a module that
returns ``Accelerator(...)`` makes ``accelerator`` one (`accelerator_factories`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.project_modules import (
    calls_any,
    imported_files,
    kept_calls,
    read,
    split_member,
)
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.script_model import Kind, ScriptModel

#: How a module is analysed (the engine's parse and `analyze`): None when it does not parse.
Load = Callable[[Path], "ScriptModel | None"]
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


@dataclass
class ProjectView:
    """One module of a project as the rest of the project sees it. ``importers``: the files
    being linted that import it (their calls are read); ``load`` analyses a module once."""

    path: Path
    importers: tuple[Path, ...] = ()
    load: Load | None = None
    #: how a factory's module is analysed (alone: no module's facts go further than one step)
    load_alone: Load | None = None
    #: whether a module's text may hold a factory of accelerators for these kept calls' names
    #: (a test of the text before an analysis: most imported modules construct none)
    constructs_for: Callable[[bytes, set[bytes]], bool] | None = None
    #: the project modules read for the facts (the importers and the modules they import, a
    #: factory's module): a change in one of them may change the findings, so the lint cache
    #: keys its entry on their digests (`FileResult.read_modules`)
    read: set[Path] = field(default_factory=set)
    #: the module's top-level functions that every rank runs: each call of the importing
    #: modules is outside any rank test, and the file itself calls them nowhere (with the
    #: first call site); set by `given`
    run_by_every_rank: dict[cst.FunctionDef, str] = field(default_factory=dict)
    _module: cst.Module | None = field(default=None, repr=False)

    def given(self, module: cst.Module) -> dict[cst.FunctionDef, dict[str, Given]]:
        """For each top-level function and class constructor of ``module``, what every call
        of the importing modules hands its parameters (see the module docstring)."""
        self._module = module
        if not self.importers or self.load is None:
            return {}
        targets = _targets(module)
        answers: dict[cst.FunctionDef, dict[str, list[Given | None]]] = {}
        # a function (or class) the module calls itself: its own call sites speak for it
        excluded = {targets[name] for name in _called_by_name(module) if name in targets}
        sites: dict[cst.FunctionDef, str] = {}
        for importer in self.importers:
            named = {
                n for n, f in targets.items() if _parameters(f, int(f.name.value == "__init__"))
            }
            if not calls_any(read(importer), named):
                continue  # calls none of them (a use of its constants, a class's methods)
            # the importer, and the modules it imports: their text tells whether (and how) it
            # gets an Accelerator from a factory (`load_module`), so what its calls hand
            self.read.add(importer)
            self.read.update(imported_files(importer, read(importer)).values())
            caller = self.load(importer)
            if caller is None:
                continue
            for call, function, implicit in self._calls_into(caller, importer, targets):
                if _guarded(caller, call):
                    excluded.add(function)
                    continue
                where = f"{_relative(importer, self.path)}:{caller.line(call)}"
                sites.setdefault(function, where)
                handed = _handed(caller, function, call, implicit, where)
                slots = answers.setdefault(function, {})
                for parameter in _parameters(function, implicit):
                    slots.setdefault(parameter, []).append(handed.get(parameter))
        self.run_by_every_rank = {
            function: where
            for function, where in sites.items()
            if function not in excluded and function.name.value != "__init__"
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

    def callers_of(self, function: cst.FunctionDef) -> list[tuple[ScriptModel, cst.Call, str]]:
        """The calls of the importing modules that run ``function`` (a top-level function of
        the module `given` read), each with its module's analysis and its place
        (``train.py:12``)."""
        if self.load is None or self._module is None:
            return []
        targets = _targets(self._module)
        found = []
        for importer in self.importers:
            caller = self.load(importer)
            if caller is None:
                continue
            for call, target, _ in self._calls_into(caller, importer, targets):
                if target is function:
                    where = f"{_relative(importer, self.path)}:{caller.line(call)}"
                    found.append((caller, call, where))
        return found

    def _calls_into(
        self, caller: ScriptModel, importer: Path, targets: dict[str, cst.FunctionDef]
    ) -> Iterable[tuple[cst.Call, cst.FunctionDef, int]]:
        """The calls of ``caller`` that run a function (or construct a class) of this module,
        with its ``self`` count."""
        this = self.path.resolve()
        for call in caller.calls:
            name = dotted(call.func)
            qualified = caller.imports.resolve(name) if name else None
            split = split_member(qualified, importer) if qualified else None
            if split is None or split[0].resolve() != this:
                continue
            function = targets.get(split[1])
            if function is not None:
                yield call, function, int(function.name.value == "__init__")

    def accelerator_factories(self, model: ScriptModel) -> set[str]:
        """The names this file calls (``build_accelerator``, ``train_util.make_accelerator``)
        that are functions of a project module returning an ``Accelerator(...)``."""
        if self.load is None:
            return set()
        from accelify.analysis.accelerator_objects import local_factories

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
        return found


def _names_a_class(text: bytes, kept: set[bytes]) -> bool:
    return _ACCELERATOR_CLASS in text


def _called_by_name(module: cst.Module) -> set[str]:
    """The plain names the module calls (``evaluate(...)``, ``Trainer(...)``), anywhere in it."""
    return {
        node.func.value
        for node in walk(module)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
    }


def _targets(module: cst.Module) -> dict[str, cst.FunctionDef]:
    """The module's top-level functions by name, and each top-level class's ``__init__``
    under the class's name."""
    found: dict[str, cst.FunctionDef] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            found[statement.name.value] = statement
        elif isinstance(statement, cst.ClassDef):
            for inner in statement.body.body:
                if isinstance(inner, cst.FunctionDef) and inner.name.value == "__init__":
                    found[statement.name.value] = inner
    return found


def _parameters(function: cst.FunctionDef, implicit: int) -> list[str]:
    params = function.params
    return [p.name.value for p in (*params.params[implicit:], *params.kwonly_params)]


def _handed(
    caller: ScriptModel, function: cst.FunctionDef, call: cst.Call, implicit: int, where: str
) -> dict[str, Given]:
    """What ``call`` (in ``caller``) hands each parameter of ``function``: the accelerator, or
    a prepared model, optimizer or loader (the caller's own analysis answers). A prepare call's
    result whose kind the caller cannot name (its input came from another module's function)
    is handed as prepared all the same, as the callee's own call sites would tell
    (`Flow.parameter_prepared` needs no kind)."""
    from accelify.analysis.facts import facts_of
    from accelify.analysis.objects import bound_arguments
    from accelify.analysis.script_model import Kind

    facts = facts_of(caller)
    accelerators = caller.names_of(Kind.ACCELERATOR)
    found: dict[str, Given] = {}
    for parameter, argument in bound_arguments(function, call, implicit):
        name = dotted(argument.value)
        if name is None:
            continue
        if name in accelerators:
            found[parameter] = Given(Kind.ACCELERATOR, False, where)
            continue
        kind = facts.flow.kind_of(name, call)
        if kind not in (Kind.MODEL, Kind.DATALOADER, Kind.OPTIMIZER, None):
            continue
        if facts.flow.prepared_argument(call, argument.value):
            found[parameter] = Given(kind, True, where)
    return found


def _guarded(caller: ScriptModel, call: cst.Call, depth: int = 0) -> bool:
    """``call`` runs on some ranks only: under a rank test, or in a function of ``caller``
    that some call of that file runs under one (three calls up at most; a function handed on
    as a value is taken as guarded: who runs it is unknown)."""
    if caller.under_rank_guard(call):
        return True
    function = caller.index.enclosing_function(call)
    if function is None or depth >= 3:
        return function is not None
    graph = caller.call_graph
    if graph.references(function) or graph.uncertain_callers(function):
        return True
    return any(_guarded(caller, site, depth + 1) for site, _ in graph.calls_of(function))


def _relative(file: Path, to: Path) -> str:
    try:
        return str(file.resolve().relative_to(to.resolve().parent))
    except ValueError:
        return str(file)
