"""Calls that print through another name: ``trace_func=print`` kept as ``self.trace_func`` (the
early-stopping class copied into countless training scripts), ``log = print``. Such a call
prints on every rank exactly as ``print`` does, so it is converted like one; only where the name
certainly holds ``print``: every caller in the file leaves the default or passes ``print``, and
nothing else is assigned to it. ``log = functools.partial(print, "[train]")`` prints too, with
arguments of its own that ``accelerator.print`` would drop: its calls are told apart
(`print_partial_calls`), to be guarded rather than replaced."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.dataflow import assigns, sees_binding
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import all_params, dotted, target_names, walk

_PRINT = "builtins.print"
_PARTIAL = "functools.partial"


def print_alias_calls(model: ScriptModel) -> set[cst.Call]:
    """Every call in the file whose callee is a name or ``self.`` attribute holding ``print``."""
    found: set[cst.Call] = set()
    for function in model.index.of_type(cst.FunctionDef):
        assert isinstance(function, cst.FunctionDef)
        for name in _print_parameters(model, function):
            found |= _calls_through(model, function, name)
            for attribute, owner in _kept_as_attributes(model, function, name):
                found |= _calls_through(model, owner, attribute)
    return found | _calls_of_names_bound_to(model, _is_print)


def print_partial_calls(model: ScriptModel) -> set[cst.Call]:
    """Calls of a name bound once to ``functools.partial(print, ...)`` (not ``print`` itself
    rebound so, whose calls are prints already)."""
    return _calls_of_names_bound_to(model, _is_print_partial, besides="print")


def _calls_of_names_bound_to(
    model: ScriptModel, holds: Callable[[ScriptModel, cst.CSTNode], bool], besides: str = ""
) -> set[cst.Call]:
    """Calls through a plain name (not ``besides``) assigned once in its scope, to a value
    ``holds`` accepts."""
    found: set[cst.Call] = set()
    for assign in model.index.of_type(cst.Assign):
        assert isinstance(assign, cst.Assign)
        if len(assign.targets) != 1 or not holds(model, assign.value):
            continue
        name = dotted(assign.targets[0].target)
        scope = model.scope_of(assign)
        if name in (None, besides) or "." in name or not _assigned_once(model, scope, name):
            continue
        found |= _calls_through(model, scope, name)
    return found


def _is_print(model: ScriptModel, node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and model.qualified(node) == {_PRINT}


def _is_print_partial(model: ScriptModel, node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and model.call_names(node) == {_PARTIAL}
        and bool(node.args)
        and node.args[0].keyword is None
        and not node.args[0].star
        and _is_print(model, node.args[0].value)
    )


def _print_parameters(model: ScriptModel, function: cst.FunctionDef) -> list[str]:
    """Parameters that default to ``print`` and get nothing else from any call in the file."""
    defaults = [
        p.name.value
        for p in all_params(function.params)
        if p.default is not None and _is_print(model, p.default)
    ]
    if not defaults:
        return []
    calls = model.call_graph.calls_of(function)
    kept = []
    for name in defaults:
        if assigns(function, name):
            continue
        passed = [
            argument
            for call, implicit in calls
            for parameter, argument in bound_arguments(function, call, implicit)
            if parameter == name
        ]
        unknown = any(a.star for call, _ in calls for a in call.args)
        if not unknown and all(_is_print(model, a.value) for a in passed):
            kept.append(name)
    return kept


def _kept_as_attributes(
    model: ScriptModel, function: cst.FunctionDef, name: str
) -> list[tuple[str, cst.ClassDef]]:
    """``self.trace_func = trace_func`` in a method: the attribute holds ``print`` in the whole
    class when that is the class's only assignment to it."""
    owner = model.index.enclosing_class(function)
    if owner is None:
        return []
    kept = []
    for node in walk(function.body):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, cst.Name)
            and node.value.value == name
        ):
            attribute = dotted(node.targets[0].target)
            if (
                attribute is not None
                and attribute.startswith("self.")
                and attribute.count(".") == 1
                and _assigned_once(model, owner, attribute)
            ):
                kept.append((attribute, owner))
    return kept


def _assigned_once(model: ScriptModel, scope: cst.CSTNode, name: str) -> bool:
    """One binding of ``name`` in ``scope`` (a module: outside its functions too)."""
    count = 0
    for node in walk(scope):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            if name in target_names(node.target) or dotted(node.target) == name:
                count += 1
        elif isinstance(node, (cst.For, cst.CompFor)) and name in target_names(node.target):
            count += 1
    return count == 1


def _calls_through(model: ScriptModel, scope: cst.CSTNode, name: str) -> set[cst.Call]:
    """Calls of ``name`` inside ``scope`` that see this binding: for a plain name, those whose
    own scope is ``scope`` (a nested function with its own ``name`` would shadow it)."""
    found = set()
    for node in walk(scope):
        if not isinstance(node, cst.Call) or dotted(node.func) != name:
            continue
        if "." in name or sees_binding(model, node, name, scope):
            found.add(node)
    return found
