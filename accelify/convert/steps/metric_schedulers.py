"""A scheduler stepped on a metric (``scheduler.step(mean_loss)``: ReduceLROnPlateau) that a
training loop accumulates from its batches (``losses.append(loss.item())``, ``total +=
loss.item()``, or the value a helper that trains returns). After conversion each rank computes
that metric over its own shard, so each decides its own learning rate and the ranks'
parameters drift apart while every loss still looks fine. The step is left as it is, with a
review line (an evaluation left per rank is `evaluation`'s; a gathered one is the same on every
rank and needs nothing).

The same holds for an optimizer built with a setting such a value decides (``lr =
lr_finder(model, train_loader)`` then ``SGD(..., lr=lr)``: the LR finder picks the learning rate
with the lowest loss on this rank's batches): each rank would train with its own rate."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.own_values import OwnValues
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.evaluation import (
    fed_by,
    reads,
    steps_scheduler_on_a_value,
    stored,
    written,
)


def run(ctx: Context) -> None:
    _optimizers_set_from_training(ctx)
    for call in ctx.model.calls:
        if not steps_scheduler_on_a_value(ctx, call):
            continue
        scope = ctx.model.scope_of(call)
        fed = fed_by(ctx, scope, _accumulated_in_training(ctx, scope))
        read = {name for a in call.args for name in reads(a.value)}
        if read & fed:
            ctx.plan.review(
                ctx.line(call),
                f"{ctx.code(call.func)}(...) reads {', '.join(sorted(read & fed))}, "
                "accumulated from this rank's training batches: each rank would change its "
                "learning rate on its own shard's loss and the ranks' parameters drift apart; "
                f"average it over the ranks first ({ctx.a('reduce')}) or step on a gathered "
                "evaluation metric",
            )
            continue
        _folded_elsewhere(ctx, call)


def _folded_elsewhere(ctx: Context, call: cst.Call) -> None:
    """The metric followed through the file (`own_values`, ACC409's analysis) to a value this
    rank folds from its shard of a loader the conversion prepares: a trainer's
    ``self.lr_scheduler.step(self.loss["train"][-1])`` in ``train()``, the entry its
    ``_train_epoch()`` appends the mean of its batches to."""
    view = ctx.shard_view()
    for argument in call.args:
        origin = OwnValues(ctx.facts, view).origin(argument.value, call, {})
        if origin is None or not _in_training_loop(ctx, origin):
            continue  # an evaluation's total is `evaluation`'s: gathered, or its own review
        metric = ctx.code(argument.value)
        ctx.plan.review(
            ctx.line(call),
            f"{ctx.code(call.func)}({metric}) steps on {metric}, folded from this rank's "
            f"batches only (line {ctx.line(origin)}): each rank would change its learning rate "
            "on its own shard's value and the ranks' parameters drift apart; step on the value "
            f"averaged over the ranks: {ctx.a_at(call, 'reduce')}(torch.tensor({metric}, "
            f"device={ctx.advised_accelerator(call) or 'accelerator'}.device), 'mean').item()",
        )
        return


def _in_training_loop(ctx: Context, node: cst.CSTNode) -> bool:
    """``node`` folds batch values in a loop that trains (itself or through the calls it
    makes)."""
    loop = ctx.model.index.enclosing_loop(node)
    return loop is not None and any(
        entry.node is loop and (entry.trains or ctx.facts.calls.trains_through_calls(loop))
        for entry in ctx.model.loops
    )


def _optimizers_set_from_training(ctx: Context) -> None:
    """An optimizer whose settings (every argument but the parameters) read a value a training
    loop of its scope accumulated, or a function that trains returned."""
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        value = binding.value
        if binding.received or not isinstance(value, cst.Call) or len(value.args) < 2:
            continue
        scope = ctx.model.scope_of(value)
        fed = fed_by(ctx, scope, _accumulated_in_training(ctx, scope))
        read = {name for argument in value.args[1:] for name in reads(argument.value)}
        if read & fed:
            ctx.plan.review(
                ctx.line(value),
                f"{binding.name} is set from {', '.join(sorted(read & fed))}, computed from "
                "this rank's training batches: each rank would train with its own settings and "
                "the ranks' parameters drift apart; average it over the ranks first "
                f"({ctx.a('reduce')}) or decide it on the main process and broadcast it",
            )


def _accumulated_in_training(ctx: Context, scope: cst.CSTNode) -> set[str]:
    """Names of ``scope`` that a training loop in it folds batch values into, and names bound
    to what a function of the file that trains returns (``train_loss = train_epoch(...)``)."""
    found: set[str] = set()
    for loop in ctx.model.loops:
        if loop.trains and loop.scope is scope:
            for statement in walk(loop.node.body):
                if _folds_batch_values(statement):
                    found |= written(statement)
    for node in walk(scope):
        if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)):
            continue
        if ctx.model.scope_of(node) is not scope:
            continue
        if _evaluates_a_whole_loader(ctx, node.value):
            continue
        if any(_trains(ctx, f) for f in ctx.facts.calls.targets(node.value)):
            for target in node.targets:
                found |= stored(target.target)
    return found


#: what a loop folds a batch's value into: ``losses.append(...)``, ``meter.update(...)``
_FOLDING_METHODS = {"append", "extend", "update", "add"}


def _folds_batch_values(node: cst.CSTNode) -> bool:
    """``total += loss.item()`` or ``losses.append(loss.item())``; not a counter (``step +=
    1``), not ``optimizer.step()``."""
    if isinstance(node, cst.AugAssign):
        return not isinstance(node.value, cst.Integer | cst.Float)
    if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
        func = node.value.func
        return isinstance(func, cst.Attribute) and func.attr.value in _FOLDING_METHODS
    return False


def _evaluates_a_whole_loader(ctx: Context, call: cst.Call) -> bool:
    """``val_loss, val_acc = run_epoch(model, val_loader, criterion, device)``: a function
    that trains when handed an optimizer, here handed a loader it only evaluates, left
    unprepared (`shared_loop_evaluations`): every rank evaluates all of it, so what it returns
    is the same on every rank."""
    shared = ctx.facts.shared_loop_evaluations
    return any(
        name in shared and name not in ctx.plan.prepared
        for name in (dotted(argument.value) for argument in call.args)
    )


def _trains(ctx: Context, function: cst.FunctionDef) -> bool:
    return any(loop.trains and loop.scope is function for loop in ctx.model.loops)
