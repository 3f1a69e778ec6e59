"""Loaders wrapped in an object of the script's own (the nn tutorial's ``train_dl =
WrappedDataLoader(train_dl, preprocess)``, the Jovian notebooks' ``train_dl =
DeviceDataLoader(train_dl, device)``): ``prepare`` shards DataLoaders only and hands any other
object back as it is, so a loader read through such a wrapper stays whole on every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import assigned_targets, dotted

if TYPE_CHECKING:
    from accelify.analysis.flow import ObjectFlow
    from accelify.analysis.script_model import ScriptModel


def wraps(model: ScriptModel, assign: cst.Assign, name: str) -> bool:
    """``name = Wrapper(name, ...)``, ``Wrapper`` a class of this file that is not a module."""
    value = assign.value
    if not isinstance(value, cst.Call):
        return False
    wrapper = dotted(value.func)
    if wrapper not in model.classes or wrapper in model.module_classes:
        return False
    return any(dotted(argument.value) == name for argument in value.args)


def wrapped_at(model: ScriptModel, name: str | None, at: cst.CSTNode) -> cst.Assign | None:
    """The assignment that last binds ``name`` before ``at``, in ``at``'s scope, when it wraps
    the loader ``name`` held (`wraps`); None otherwise."""
    if name is None:
        return None
    scope = model.scope_of(at)
    before = [
        assign
        for assign in model.assignments
        if model.scope_of(assign) is scope
        and len(assigned_targets(assign)) == 1
        and dotted(assigned_targets(assign)[0]) == name
        and model.order(assign) < model.order(at)
    ]
    if not before:
        return None
    last = max(before, key=model.order)
    return last if wraps(model, last, name) else None  # type: ignore[arg-type]


def handed_wrapped(
    model: ScriptModel, flow: ObjectFlow, function: cst.FunctionDef, parameter: str
) -> cst.Assign | None:
    """The wrapping assignment of a caller of ``function`` that hands ``parameter`` a loader it
    wrapped first (``train_dl = DeviceDataLoader(train_dl, device)``, then ``fit_one_cycle(...,
    train_dl, valid_dl)``), followed back through every helper in between; None when no caller
    does."""
    for origin, call in sorted(
        flow.origin_sites(parameter, function.body), key=lambda site: model.order(site[1])
    ):
        found = wrapped_at(model, origin, call)
        if found is not None:
            return found
    return None
