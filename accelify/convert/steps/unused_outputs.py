"""A model whose outputs some steps do not use (``validity, _, _ = discriminator(x)``: a GAN's
auxiliary heads) leaves parameters without gradients in those steps, and DDP stops with
"Expected to have finished reduction in the prior iteration". So does a model class whose
forward never computes with some of its parameters (``self.dummy_param`` read for its
``.device``, a layer built and never called) or uses them only under ``torch.no_grad()`` (a
frozen backbone). The Accelerator gets the DDP option that lets
such parameters go: ``find_unused_parameters=True``."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.idle_members import idle_members
from accelify.analysis.objects import instance_class
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context

HANDLER = "DistributedDataParallelKwargs"


def run(ctx: Context) -> None:
    if not _dropped_outputs(ctx):
        _idle_members(ctx)


def _expect_unused(ctx: Context) -> None:
    ctx.constructor.setdefault("kwargs_handlers", f"[{HANDLER}(find_unused_parameters=True)]")
    if HANDLER not in ctx.uses:
        ctx.uses.append(HANDLER)


def _idle_members(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.MODEL):
        if binding.name not in ctx.plan.prepared:
            continue
        made_by = instance_class(ctx.model, binding.name, binding.assign)
        idle = idle_members(ctx.model, made_by) if made_by is not None else []
        if not idle:
            continue
        _expect_unused(ctx)
        members = ", ".join(f"self.{name} (line {ctx.line(node)})" for name, node in idle)
        ctx.plan.change(
            ctx.line(binding.assign),
            f"{made_by}'s forward computes no gradient for {members}: DDP told to expect "
            "parameters without gradients (find_unused_parameters=True)",
        )
        return


def _dropped_outputs(ctx: Context) -> bool:
    for call in ctx.model.calls:
        if not ctx.facts.flow.is_forward(call):
            continue
        model = dotted(call.func)
        if (
            model not in ctx.plan.prepared
            and ctx.facts.flow.outer_name(model, call) not in ctx.plan.prepared
        ):
            continue
        if not _drops_outputs(ctx, call):
            continue
        _expect_unused(ctx)
        ctx.plan.change(
            ctx.line(call),
            f"{model}'s outputs are partly dropped here: DDP told to expect parameters "
            "without gradients (find_unused_parameters=True)",
        )
        return True
    return False


def _drops_outputs(ctx: Context, call: cst.Call) -> bool:
    """``a, _, _ = model(x)`` or ``a, *_ = model(x)`` where a backward follows (in the same
    function): the dropped heads get no gradient in that step."""
    parent = ctx.model.parent(call)
    if not isinstance(parent, cst.Assign) or parent.value is not call:
        return False
    scope = ctx.model.scope_of(call)
    if not any(ctx.model.scope_of(backward) is scope for backward in ctx.model.backward_calls):
        return False
    for target in parent.targets:
        if isinstance(target.target, (cst.Tuple, cst.List)):
            for element in target.target.elements:
                value = element.value  # ``_`` of an Element, ``*_`` of a StarredElement
                if isinstance(value, cst.Name) and value.value.startswith("_"):
                    return True
    return False
