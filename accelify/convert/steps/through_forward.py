"""A training step that calls a method of a prepared model (``loss = model.training_step(batch)``,
a Lightning-style module driven by a hand-written loop) whose body runs the model's forward
(``self(x)``): the DDP wrapper has no such method (AttributeError on 2 ranks), and through
``unwrap_model`` the forward bypasses the wrapper, so no gradient is averaged and the ranks drift
apart. The method runs as the wrapper's forward instead (`rewrites.THROUGH_FORWARD`, added once
to the file), which is where DDP reduces gradients; on one process it is called as before.

Other ways of running a model's layers outside its forward (``model.decoder(z)``, a helper
handed the model) keep the review line of `unwrap.forwards_outside_the_wrapper`."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.idle_members import member_values
from accelify.analysis.objects import methods_of
from accelify.analysis.outside_forward import OutsideForward, layers_outside_forward
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.kinds import InsertAfter, InsertBefore

HELPER = "call_through_forward"


def outside_the_wrapper(ctx: Context) -> list[OutsideForward]:
    """The training step's runs of a prepared model's layers outside its forward
    (`layers_outside_forward`), models prepare left unwrapped (frozen) not asked about: what
    this step routes through the wrapper and `unwrap.forwards_outside_the_wrapper` reviews."""
    return layers_outside_forward(
        ctx.model,
        ctx.facts.placement,
        ctx.facts.flow,
        unprepared=ctx.frozen,
        imported=ctx.imported_layer_members,
    )


def routed_calls(ctx: Context) -> list[cst.Call]:
    """The training-step calls ``model.method(...)`` of a prepared model whose ``method`` is a
    method of a module class of this file (not a layer ``__init__`` sets): each runs as the
    wrapper's forward. Asked once prepare has chosen what it wraps (a frozen model is not)."""
    found = outside_the_wrapper(ctx)
    return [entry.call for entry in found if entry.through is None and _a_method(ctx, entry.call)]


def _a_method(ctx: Context, call: cst.Call) -> bool:
    func = call.func
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, (cst.Name, cst.Attribute)):
        return False
    member = func.attr.value
    for class_name in ctx.model.module_classes:
        methods = methods_of(ctx.model, class_name)
        init = methods.get("__init__")
        if member in methods and (init is None or member not in member_values(init)):
            return True
    return False


def run(ctx: Context) -> None:
    if not ctx.through_forward:
        return
    helper = _free_name(ctx.model.module)
    for call in ctx.through_forward:
        acc = ctx.acc
        owner = dotted(call.func.value)  # type: ignore[attr-defined]
        member = call.func.attr.value  # type: ignore[attr-defined]
        planned = ctx.plan.add(
            rewrites.through_forward(call, helper, acc),
            line=ctx.line(call),
            text=(
                f'{owner}.{member}(...) -> {helper}({acc}, {owner}, "{member}", ...): the method '
                f"runs as the prepared {owner}'s forward, where DDP averages the gradients (called "
                "on the model, the DDP wrapper has no such method; through unwrap_model no "
                "gradient would be averaged)"
            ),
        )
        ctx.need(call, when=planned.in_effect)
    body = list(ctx.model.module.body)
    first = next(
        (i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), None
    )
    if first is None:
        return
    # after the statement above the file's first definition (its imports), two blank lines
    # apart from both, as black lays out top-level definitions
    definition = rewrites.through_forward_helper(helper)
    if first == 0:
        ctx.plan.add(InsertBefore(body[0], definition), anywhere=True)
        return
    spaced = definition.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    ctx.plan.add(InsertAfter(body[first - 1], spaced), anywhere=True)


def _free_name(module: cst.Module) -> str:
    """`HELPER`, or with underscores after it while the file already uses that name."""
    used = {node.value for node in walk(module) if isinstance(node, cst.Name)}
    name = HELPER
    while name in used:
        name += "_"
    return name
