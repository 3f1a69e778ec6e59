"""A name handed on before ``prepare`` rebinds it: ``evaluator = Evaluator(val_loader)`` above
``model, val_loader = accelerator.prepare(model, val_loader)``. ``prepare`` returns a new
object and rebinds the name; what the callee kept is the original (an evaluator's
``self.loader`` reads the whole set on every rank, not a shard). Asked by the object model
(whose received attributes come from which caller's names) and by the data flow (whether a
parameter is handed a prepared object)."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.script_model import ScriptModel


def handed_before_prepare(
    model: ScriptModel,
    call: cst.Call,
    name: str,
    unprepared: Callable[[cst.BaseExpression], bool],
) -> bool:
    """``call`` hands ``name`` on above every prepare call of its function (or of the module)
    that returns ``name``, no loop of that scope runs both (the next pass would hand on what
    this one prepared), and each binding of ``name`` above the call is ``unprepared`` (a
    ``DataLoader(...)``)."""
    scope = model.index.enclosing_function(call)
    prepares = [
        p.call
        for p in model.prepare_calls
        if name in p.outputs and model.index.enclosing_function(p.call) is scope
    ]
    if not prepares or any(model.order(p) < model.order(call) for p in prepares):
        return False
    for ancestor in model.ancestors(call):
        if ancestor is scope:
            break
        if isinstance(ancestor, (cst.For, cst.While)) and any(
            model.inside(p, ancestor) for p in prepares
        ):
            return False
    earlier = [
        a.value
        for a in model.index.assignments_to(name)
        if a.value is not None
        and model.index.enclosing_function(a) is scope
        and model.order(a) < model.order(call)
    ]
    return bool(earlier) and all(unprepared(value) for value in earlier)
