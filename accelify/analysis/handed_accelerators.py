"""Where the Accelerators a module is handed are made, in the project's other modules.

``train.py`` makes ``Accelerator(mixed_precision="fp16")`` and hands it to ``Trainer(accelerator,
...)`` of ``trainer.py``: read alone, trainer.py knows only that its accelerator is made
elsewhere, so a rule that depends on its settings can say no more than "may". Its callers'
analyses say where and how it is made, and a finding can name that line (``train.py:8``), which
is where the user changes the setting."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import argument_value, dotted, is_accelerator_call

if TYPE_CHECKING:
    from accelify.analysis.outside_callers import ProjectView

#: a ``mixed_precision`` the file computes (``args.mixed_precision``, ``**kwargs``)
COMPUTED_PRECISION = "computed"


@dataclass(frozen=True)
class MadeAccelerator:
    """One ``Accelerator(...)`` of another module of the project, handed to this one (or returned
    by its factory), as plain data: a caller hands it on to the modules it calls
    (`HandedCall.accelerators`)."""

    precision: str  # `construction_precision` of the construction
    where: str  # ``train.py:8``, relative to the handed module's folder


def handed_accelerators(script: ScriptModel) -> list[MadeAccelerator]:
    """The ``Accelerator(...)`` constructions that the calls of the project's other modules
    hand this file's functions and methods for their accelerator parameters
    (`ScriptModel.accelerator_params`), one per call and parameter. Empty unless every such
    parameter is handed, at every call, an accelerator whose making its caller knows (`made_for`:
    made there, by a factory, or handed to the caller in turn), and no call of the file itself
    runs the function (what it hands is this file's business)."""
    project = script.project
    if project is None or not script.accelerator_params:
        return []
    kept = script.__dict__.get("_handed_accelerators")
    if kept is not None and script.complete:
        return kept  # asked by each rule and each call handing it on: the callers read once
    found: list[MadeAccelerator] = []
    for function, parameters in script.accelerator_params.items():
        made = [] if script.call_graph.calls_of(function) else None
        made = _made_by_callers(script, project, function, parameters) if made is None else made
        if not made:
            found = []
            break
        found += made
    if script.complete:
        script.__dict__["_handed_accelerators"] = found
    return found


def _made_by_callers(
    script: ScriptModel, project: ProjectView, function: cst.FunctionDef, parameters: set[str]
) -> list[MadeAccelerator]:
    """What every call of the project's other modules hands ``function``'s ``parameters``, read
    from the callers' analyses; empty unless each is known."""
    owner = method_owner(script, function)
    callers = project.callers_of(function, owner=owner)
    if not callers:
        return _carried(project, function, owner)
    implicit = 0 if owner is None else 1  # a method's call binds ``self``
    found: list[MadeAccelerator] = []
    for caller, call, where in callers:
        bound = dict(bound_arguments(function, call, implicit))
        folder = where.rpartition(":")[0].rpartition("/")[0]
        for parameter in parameters:
            handed = bound.get(parameter)
            made = made_for(caller, call, handed.value) if handed is not None else []
            if not made:
                return []
            found += [_seen_from(m, folder) for m in made]
    return found


def _carried(
    project: ProjectView, function: cst.FunctionDef, owner: str | None
) -> list[MadeAccelerator]:
    """What the linted modules' calls of ``function`` (a method of ``owner``) said, as data,
    about the accelerator they hand (`HandedCall.accelerators`), where their analyses are not
    loaded here (a trainer module that only hands on ``self.accelerator``: it names no
    Accelerator); empty unless every such call said."""
    name = function.name.value
    member = owner if owner and name == "__init__" else f"{owner}.{name}" if owner else name
    this = str(project.path.resolve())
    calls = [h for h in project.handed if h.module == this and h.member == member]
    if not calls or not all(h.accelerators for h in calls):
        return []
    return [
        _seen_from(MadeAccelerator(precision, where), h.where(project.path).rpartition("/")[0])
        for h in calls
        for precision, where in h.accelerators
    ]


def made_for(
    caller: ScriptModel, call: cst.Call, value: cst.BaseExpression
) -> list[MadeAccelerator]:
    """The Accelerators that ``value``, handed by ``call`` of ``caller``, may be, each with its
    place relative to ``caller``'s folder: the one binding of that name in the function around
    ``call`` (or at the module's level), an ``Accelerator(...)`` made there or returned by a
    factory of the project (`ProjectView.factory_construction`); or, for an accelerator handed to
    ``caller`` in turn (a parameter, ``self.accelerator`` kept from one), those its own callers
    hand it (`handed_accelerators` of ``caller``, two modules away). Empty where it is not
    known."""
    name = dotted(value)
    if name is None:
        return []
    scope = caller.index.enclosing_function(call)
    bindings = [
        binding
        for binding in caller.of_kind(Kind.ACCELERATOR)
        if binding.name == name
        and (name.startswith("self.") or caller.index.enclosing_function(binding.assign) is scope)
    ]
    if len(bindings) != 1 or bindings[0].received:
        received = name in caller.accelerator_params.get(scope, set()) if scope else False
        if received or (all(b.received for b in bindings) and bindings):
            return handed_accelerators(caller)
        return []
    made = constructed_by(caller, bindings[0].value)
    return [made] if made is not None else []


def constructed_by(script: ScriptModel, value: cst.BaseExpression) -> MadeAccelerator | None:
    """The Accelerator ``value`` (an accelerator's binding in ``script``) makes: an
    ``Accelerator(...)`` call, or a call of a factory of the file or of another module of the
    project that returns one; None for anything else."""
    if not isinstance(value, cst.Call):
        return None
    from accelify.analysis.accelerator_objects import factory_constructions

    if is_accelerator_call(value) or script.call_names(value) & names.ACCELERATORS:
        return MadeAccelerator(construction_precision(value), _here(script, value))
    local = factory_constructions(script).get(dotted(value.func) or "")
    if local is not None:
        return MadeAccelerator(construction_precision(local), _here(script, local))
    project = script.project
    found = project.factory_construction(script, value) if project is not None else None
    if found is None:
        return None
    made, factory, file = found
    where = f"{os.path.relpath(file.resolve(), project.path.resolve().parent)}:{factory.line(made)}"
    return MadeAccelerator(construction_precision(made), where)


def construction_precision(construction: cst.Call) -> str:
    """The literal ``mixed_precision`` of an Accelerator's construction (``"fp16"``), ``"no"``
    where the argument is left out (the launch config decides, and it is "no" unless asked: a
    script that carries its own GradScaler or autocast is not launched with another precision
    on top), `COMPUTED_PRECISION` where the file computes it or may hand it in ``**kwargs``."""
    if any(argument.star for argument in construction.args):
        return COMPUTED_PRECISION
    value = argument_value(construction, "mixed_precision", position=None)
    if value is None:
        return "no"
    if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
        return value.evaluated_value
    return COMPUTED_PRECISION


def _here(script: ScriptModel, node: cst.CSTNode) -> str:
    """``train.py:8``: ``node``'s place, relative to the folder of its own file."""
    name = script.project.path.name if script.project is not None else "line"
    return f"{name}:{script.line(node)}"


def _seen_from(made: MadeAccelerator, folder: str) -> MadeAccelerator:
    """``made`` with its place relative to the folder its caller's place is named from."""
    if not folder:
        return made
    return MadeAccelerator(made.precision, os.path.normpath(f"{folder}/{made.where}"))


def method_owner(script: ScriptModel, function: cst.FunctionDef) -> str | None:
    """The name of the class ``function`` is a method of (defined in its body), else None:
    its callers build or call that class (``Trainer(accelerator, ...)``)."""
    owner = script.index.enclosing_class(function)
    if owner is None or not any(s is function for s in owner.body.body):
        return None
    return owner.name.value
