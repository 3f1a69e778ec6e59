"""Where the Accelerators a module is handed are made, in the project's other modules.

``train.py`` makes ``Accelerator(mixed_precision="fp16")`` and hands it to ``Trainer(accelerator,
...)`` of ``trainer.py``: read alone, trainer.py knows only that its accelerator is made
elsewhere, so a rule that depends on its settings can say no more than "may". Its callers'
analyses say where and how it is made, and a finding can name that line (``train.py:8``), which
is where the user changes the setting."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, is_accelerator_call


@dataclass(frozen=True)
class MadeAccelerator:
    """One ``Accelerator(...)`` of another module of the project, handed to this one."""

    call: cst.Call
    where: str  # ``train.py:8``, relative to the handed module's folder


def handed_accelerators(script: ScriptModel) -> list[MadeAccelerator]:
    """The ``Accelerator(...)`` constructions that the calls of the project's other modules
    hand this file's functions and methods for their accelerator parameters
    (`ScriptModel.accelerator_params`), one per call and parameter. Empty unless every such
    parameter is handed, at every call, an accelerator its caller makes itself in the calling
    function (not one the caller was handed in turn, nor a factory's), and no call of the file
    itself runs the function (what it hands is this file's business)."""
    project = script.project
    if project is None or not script.accelerator_params:
        return []
    found: list[MadeAccelerator] = []
    for function, parameters in script.accelerator_params.items():
        if script.call_graph.calls_of(function):
            return []
        owner = method_owner(script, function)
        callers = project.callers_of(function, owner=owner)
        if not callers:
            return []
        implicit = 0 if owner is None else 1  # a method's call binds ``self``
        for caller, call, where in callers:
            bound = dict(bound_arguments(function, call, implicit))
            for parameter in parameters:
                handed = bound.get(parameter)
                made = _made_beside(caller, call, handed.value) if handed is not None else None
                if made is None:
                    return []
                file = where.rpartition(":")[0]
                found.append(MadeAccelerator(made, f"{file}:{caller.line(made)}"))
    return found


def method_owner(script: ScriptModel, function: cst.FunctionDef) -> str | None:
    """The name of the class ``function`` is a method of (defined in its body), else None:
    its callers build or call that class (``Trainer(accelerator, ...)``)."""
    owner = script.index.enclosing_class(function)
    if owner is None or not any(s is function for s in owner.body.body):
        return None
    return owner.name.value


def _made_beside(caller: ScriptModel, call: cst.Call, value: cst.BaseExpression) -> cst.Call | None:
    """The ``Accelerator(...)`` that ``value``, handed by ``call``, is: the one binding of that
    name in the function around ``call`` (or at the module's level), an Accelerator made there."""
    name = dotted(value)
    scope = caller.index.enclosing_function(call)
    bindings = [
        binding
        for binding in caller.of_kind(Kind.ACCELERATOR)
        if binding.name == name and caller.index.enclosing_function(binding.assign) is scope
    ]
    if len(bindings) != 1 or bindings[0].received:
        return None
    made = bindings[0].value
    return made if is_accelerator_call(made) else None
