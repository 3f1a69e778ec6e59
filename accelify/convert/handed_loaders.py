"""DataLoaders that a driver of the folder hands a class of this module when it constructs it:
``main.py`` makes ``dataloader = DataLoader(...)`` and calls ``VAE(args, dataloader=dataloader)``
of ``vae.py``, whose ``train()`` holds the backward. Read alone, ``vae.py`` does not know that
``self.dataloader`` is a DataLoader: its model and optimizer were prepared, its loader was not,
and every rank trained on all of it (a review line said so).

The conversion of the module asks the folder's files that import it what their constructions
hand, and reads a parameter as a DataLoader where every construction hands it one the caller
made (its own analysis names the kind, a factory of another module of the folder included:
``dataloader = get_dataloader(...)`` of ``dataloader.py``), as a construction written in the
file would (`ScriptModel.given_parameters`): the class then prepares it where it keeps it.
Only a driver that neither trains nor uses an accelerator counts: its loaders stay unprepared
(its own conversion prepares nothing), so the class's prepare is the only one. A construction
under a rank test, a class the module constructs itself, or callers that disagree leave the
parameter unknown (the review line stays)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.outside_callers import Given, HandedCall, ProjectView, project_calls
from accelify.analysis.project_modules import read
from accelify.analysis.script_model import Kind, ScriptModel, analyze
from accelify.analysis.syntax import dotted, walk
from accelify.convert.across import importers_of
from accelify.convert.project import imported_returns
from accelify.errors import UserError
from accelify.source import parse


def handed_loaders(path: Path, module: cst.Module) -> dict[cst.FunctionDef, dict[str, Given]]:
    """For each ``__init__`` of ``module`` (the file ``path``), the parameters every
    construction in the folder's importing files hands a DataLoader the caller made; empty
    where any importer trains or uses an accelerator itself (what it hands may be prepared
    there), or none constructs a class of the module."""
    if not path.is_file():
        return {}
    here = path.resolve()
    calls: list[HandedCall] = []
    for importer in importers_of(path):
        try:
            source = parse(read(importer), str(importer))
        except UserError:
            return {}
        caller = analyze(source)
        # a loader the driver gets from a factory of another module of the folder
        # (``dataloader = get_dataloader(...)`` of ``dataloader.py``) is a DataLoader it made
        returns = imported_returns(importer, caller)
        if returns:
            caller = analyze(source, imported_returns=returns)
        if caller.trains or caller.uses_accelerator:
            return {}
        for call, file, member in project_calls(caller, importer):
            if file.resolve() != here:
                continue
            guarded = caller.under_rank_guard(call)
            # made in a loop (a model per fold), each construction would prepare what it is
            # handed: left to the review line, as a call of the file in a loop is
            repeated = _repeated(caller, call)
            arguments = () if guarded or repeated else _loaders(caller, call)
            calls.append(
                HandedCall(str(here), member, str(importer), caller.line(call), guarded, arguments)
            )
    if not calls:
        return {}
    found: dict[cst.FunctionDef, dict[str, Given]] = {}
    classes = {
        id(c.body.body[i]): c
        for c in module.body
        if isinstance(c, cst.ClassDef)
        for i in range(len(c.body.body))
    }
    for function, given in ProjectView(path, handed=tuple(calls)).given(module).items():
        owner = classes.get(id(function))
        if function.name.value != "__init__" or owner is None or not _own_class(owner, module):
            continue
        loaders = {
            name: g
            for name, g in given.items()
            if g.kind is Kind.DATALOADER and not g.prepared and _only_kept(function, name)
        }
        if loaders:
            found[function] = loaders
    return found


def _own_class(owner: cst.ClassDef, module: cst.Module) -> bool:
    """A class whose methods are all in this file: no base class, ``object``, an abstract
    base, or a class the file defines (each of them its own too). A base class of another
    module may read what the constructor keeps (iterate a loader, evaluate it) where this
    file's analysis does not see it: its loaders are left to the review line."""
    defined = {c.name.value: c for c in module.body if isinstance(c, cst.ClassDef)}
    for base in owner.bases:
        name = dotted(base.value)
        if base.keyword is not None or name is None:
            return False
        if name in ("object", "abc.ABC", "ABC"):
            continue
        if name not in defined or defined[name] is owner or not _own_class(defined[name], module):
            return False
    return True


def _only_kept(init: cst.FunctionDef, parameter: str) -> bool:
    """``parameter`` is read in ``init`` only as ``self.<name> = parameter``: what the class
    does with it, its own methods do through the attribute, where the analysis follows it
    (handed to another call, ``super().__init__(loader)``, it is not)."""
    # ``self.<parameter>`` and ``f(<parameter>=...)`` spell the name without reading it
    spelled_only = {
        id(node.attr if isinstance(node, cst.Attribute) else node.keyword)
        for node in walk(init.body)
        if isinstance(node, cst.Attribute) or (isinstance(node, cst.Arg) and node.keyword)
    }
    reads = [
        node
        for node in walk(init.body)
        if isinstance(node, cst.Name) and node.value == parameter and id(node) not in spelled_only
    ]
    kept = [
        statement
        for statement in walk(init.body)
        if isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Attribute)
        and dotted(statement.targets[0].target.value) == "self"
        and isinstance(statement.value, cst.Name)
        and statement.value.value == parameter
    ]
    return len(reads) == 1 and len(kept) == 1 and kept[0].value is reads[0]


def _loaders(caller: ScriptModel, call: cst.Call) -> tuple[tuple[int, str, str, bool], ...]:
    """The arguments of ``call`` that hand a DataLoader by name (its caller's analysis names
    the kind), as `HandedCall.arguments`: none of them is prepared (the caller uses no
    accelerator)."""
    if any(argument.star for argument in call.args):
        return ()  # positions past a ``*args`` are not known
    flow = facts_of(caller).flow
    found = []
    for index, argument in enumerate(call.args):
        name = dotted(argument.value)
        if name is None:
            continue
        if flow.kind_of(name, call) is Kind.DATALOADER:
            keyword = argument.keyword.value if argument.keyword is not None else ""
            found.append((index, keyword, Kind.DATALOADER.value, False))
    return tuple(found)


def _repeated(caller: ScriptModel, call: cst.Call) -> bool:
    """``call`` may run more than once: in a loop, a comprehension or a lambda of its file, or in
    a function of it that is called anywhere but once at its top level."""
    for ancestor in caller.ancestors(call):
        if isinstance(ancestor, _REPEATING):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            sites = caller.call_graph.calls_of(ancestor)
            graph = caller.call_graph
            if len(sites) != 1 or graph.references(ancestor) or graph.uncertain_callers(ancestor):
                return True
            return _repeated(caller, sites[0][0])
    return False


_REPEATING = (
    cst.For,
    cst.While,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)
