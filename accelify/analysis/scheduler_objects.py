"""A learning-rate scheduler known by how it is made and used, not by the name of what made it:
``warm = make_lr(optimizer, args.max_iters)`` with ``make_lr`` imported from the project's own
``utils.py`` (lint reads one file at a time, so it cannot look inside), then ``warm.step()``.
The names of library schedulers and of the usual factories (``get_scheduler``,
``build_scheduler``) are the collector's; this adds the objects built from the file's optimizer
and stepped with no argument, which is what a scheduler is to the loop that steps it.

Only where one of the file's optimizers is itself stepped (``optimizer.step()``, or handed to a
``step``: ``scaler.step(optimizer)``): where none is, the object stepped in its place is the
optimizer's wrapper (``fast = Lookahead(base)``, ``fast.step()``), whose grads may well be zeroed
through the model (``model.zero_grad()``) or the parameters, never through it. Not a scheduler
either: anything also zeroed (``.zero_grad()``: an optimizer wrapper such as
``Lookahead(optimizer)``), anything named as an optimizer, or handed something to step
(``scaler.step(optimizer)``, ``ema.step(model)``)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.objects import bind, bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted


def add_schedulers_by_use(model: ScriptModel) -> None:
    """Bind as schedulers the names made by a call handed one of the file's optimizers and
    stepped with no argument (see the module docstring)."""
    optimizers = model.names_of(Kind.OPTIMIZER)
    if not optimizers:
        return
    stepped, zeroed = _stepped_and_zeroed(model)
    if not _an_optimizer_stepped(model, optimizers):
        return  # what is stepped in the optimizers' place wraps them (see the module docstring)
    candidates = stepped - zeroed
    if not candidates:
        return
    known = {(b.name, id(b.scope)) for b in model.bindings}
    for assign in model.assignments:
        if not isinstance(assign.value, cst.Call) or len(assigned_targets(assign)) != 1:
            continue
        name = dotted(assigned_targets(assign)[0])
        if name is None or name not in candidates or "optim" in name.lower():
            continue
        scope = model.scope_of(assign)
        if (name, id(scope)) in known or not _handed_an_optimizer(assign.value, optimizers):
            continue
        bind(model, name, Kind.SCHEDULER, scope, assign, known)


def _stepped_and_zeroed(model: ScriptModel) -> tuple[set[str], set[str]]:
    """The receivers of ``x.step()`` with no argument, and of ``x.zero_grad(...)``."""
    stepped: set[str] = set()
    zeroed: set[str] = set()
    for call in model.calls:
        func = call.func
        if not isinstance(func, cst.Attribute):
            continue
        if func.attr.value == "step" and not call.args:
            receiver = dotted(func.value)
            if receiver is not None:
                stepped.add(receiver)
        elif func.attr.value == "zero_grad":
            receiver = dotted(func.value)
            if receiver is not None:
                zeroed.add(receiver)
    return stepped, zeroed


def _handed_an_optimizer(call: cst.Call, optimizers: set[str]) -> bool:
    """An argument of ``call`` is one of the file's optimizers itself (not a setting read from
    it: ``optimizer.param_groups``)."""
    return any(dotted(argument.value) in optimizers for argument in call.args)


def _an_optimizer_stepped(model: ScriptModel, optimizers: set[str]) -> bool:
    """One of ``optimizers`` is stepped itself: ``optimizer.step(...)``, or handed to a
    ``step`` (``scaler.step(optimizer)``), here or in a helper of the file through the
    parameter its callers fill with one (``def update(opt): opt.step()``)."""
    for call in model.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "step":
            continue
        stepped = [func.value] + [argument.value for argument in call.args]
        for value in stepped:
            name = dotted(value)
            if name in optimizers or _filled_with_optimizer(model, name, call, optimizers):
                return True
    return False


def _filled_with_optimizer(
    model: ScriptModel, name: str | None, at: cst.CSTNode, optimizers: set[str]
) -> bool:
    """``name`` is a parameter of the function around ``at`` that one of its calls in the file
    (``update(optimizer)``, ``self.update(opt=optimizer)``) fills with an optimizer."""
    function = model.index.enclosing_function(at)
    if function is None or name is None:
        return False
    params = [p.name.value for p in function.params.params]
    if name not in params + [p.name.value for p in function.params.kwonly_params]:
        return False
    implicit = 1 if params and params[0] in ("self", "cls") else 0
    for call in model.calls:
        func = call.func
        called = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
        if called != function.name.value:
            continue
        for parameter, argument in bound_arguments(function, call, implicit):
            if parameter == name and dotted(argument.value) in optimizers:
                return True
    return False
