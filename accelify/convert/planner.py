"""A conversion is the ordered list of its steps, each a function of the script's analysis and
a small `Context`; every step records its edits (and the places it would not touch, as review
notes) in the context's `Plan`. The Accelerator is placed last: by then every edit that needs
it, and every constructor argument, is known."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import made_for
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind, Scope, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.convert.steps import (
    accelerator,
    accumulation,
    amp,
    backward,
    clipping,
    collective_stops,
    data_notes,
    dead_branches,
    devices,
    evaluation,
    handwritten_ddp,
    host_copies,
    host_inputs,
    logging_once,
    loop_tensors,
    metric_schedulers,
    output,
    prepare,
    saving,
    scheduler_pace,
    seeding,
    self_training,
    shared_files,
    side_effects,
    tracker_runs,
    unused_outputs,
    unwrap,
)
from accelify.convert.steps.context import Context, Options, import_lines
from accelify.edits.plan import Plan

__all__ = ["STEPS", "Options", "plan_conversion"]

#: In order. No step reads another's edits: how they compose (nested, stacked, giving way, in
#: conflict) is the plan's (`accelify.edits.plan`).
STEPS: tuple[Callable[[Context], None], ...] = (
    backward.run,
    self_training.run,
    handwritten_ddp.run,
    devices.run_model_moves,
    devices.run_batch_moves,
    host_inputs.run,
    loop_tensors.run,
    host_copies.run,
    devices.run_devices,
    amp.run,
    clipping.run,
    unwrap.run,
    unused_outputs.run,
    saving.run,
    side_effects.run,
    shared_files.run,
    output.run,
    logging_once.run,
    tracker_runs.run,
    evaluation.run,
    metric_schedulers.run,
    scheduler_pace.run,
    accumulation.run,
    collective_stops.run,
    data_notes.run,
    seeding.run,
    dead_branches.run,
)


def plan_conversion(model: ScriptModel, options: Options) -> Plan:
    ctx = Context(model, options)
    if _trains_itself(ctx) or handwritten_ddp.replaces_the_inner_model(ctx):
        return ctx.plan
    prepare_scope = facts_of(model).placement.prepare_scope()
    if prepare_scope is None:
        ctx.plan.review(
            model.line(model.backward_calls[0]), "no model or optimizer found: nothing to prepare"
        )
        return ctx.plan
    placement = facts_of(model).placement
    if placement.is_method(prepare_scope) and _without_instance(model, prepare_scope):
        ctx.plan.review(
            model.line(prepare_scope),
            f"{prepare_scope.name.value}() makes the model and optimizer and is a "  # type: ignore[union-attr]
            "static or class method: no instance there can hold the accelerator, and the "
            "methods that train cannot reach one made there; left as it is: hand what it makes "
            "to the constructor (cls(model, optimizer, ...)), or create the Accelerator where "
            "the training runs",
        )
        return ctx.plan
    shared = _handed_to_several_instances(ctx, prepare_scope)
    if shared is not None:
        ctx.plan.review(model.line(prepare_scope), shared)
        return ctx.plan
    if placement.is_method(prepare_scope) and not _static(prepare_scope):
        ctx.acc = "self.accelerator"
        ctx.confine_to_class(model.parent(model.parent(prepare_scope)))  # type: ignore[arg-type]
    ctx.plan.accelerator = ctx.acc
    ctx.scope = prepare_scope
    prepare.run(ctx, prepare_scope)
    _prepare_other_training_functions(ctx, prepare_scope)
    prepare.prepare_loaders_made_where_trained(ctx, prepare_scope)
    outside = unwrap.forwards_outside_the_wrapper(ctx)
    if outside:  # the script is left as it is: a plan of these review lines only
        left = Context(model, options).plan
        for line, text in outside:
            left.review(line, text)
        return left
    for step in STEPS:
        step(ctx)
    if options.mixed_precision:
        ctx.constructor.setdefault("mixed_precision", repr(options.mixed_precision))
    accelerator.run(ctx, prepare_scope)
    ctx.plan.imports = import_lines(options.target, ["Accelerator", *ctx.uses])
    return ctx.plan


def _without_instance(model: ScriptModel, scope: cst.CSTNode) -> bool:
    """A static or class method makes what trains, and training also runs outside it: no
    ``self`` there to hold the accelerator for the methods that train. One that trains all by
    itself gets a local ``accelerator``, as a function would."""
    if not _static(scope):
        return False
    placement = facts_of(model).placement
    return any(not placement.inside(call, scope) for call in model.backward_calls)


def _handed_to_several_instances(ctx: Context, scope: Scope) -> str | None:
    """Why a constructor that would prepare what it receives cannot: two of its calls hand it
    the same model (ArjanCodes' ``Runner(test_loader, model)`` beside ``Runner(train_loader,
    model, optimizer)``). Preparing in each instance wraps that model once per instance (DDP
    fails at the first backward: two allreduce hooks on each parameter), makes one Accelerator
    per instance, and shards the test instance's loader with no gather. None when no model is
    handed twice."""
    if not isinstance(scope, cst.FunctionDef) or scope.name.value != "__init__":
        return None
    flow = ctx.facts.flow
    models = {n for n, kind in flow.params.get(scope, {}).items() if kind is Kind.MODEL}
    handed: dict[str, list[int]] = {}
    for call, implicit in flow.calls_of(scope):
        for parameter, argument in bound_arguments(scope, call, implicit):
            name = dotted(argument.value)
            if parameter in models and name is not None:
                handed.setdefault(name, []).append(ctx.line(call))
    twice = {name: lines for name, lines in handed.items() if len(lines) > 1}
    if not twice:
        return None
    name, lines = next(iter(twice.items()))
    owner = ctx.facts.placement.class_of(scope)
    cls = owner.name.value if owner is not None else "the class"
    return (
        f"{cls}() is built {len(lines)} times with the same {name} (lines "
        f"{', '.join(map(str, lines))}), and its constructor is where the conversion would "
        f"prepare what it receives: {name} would be wrapped once per instance (DDP fails at "
        "the first backward) and each instance would make its own Accelerator; left as it is: "
        "create one Accelerator where the model, optimizer and loaders are made, prepare them "
        "there once, and hand the prepared objects (and the accelerator) to the instances"
    )


def _static(scope: cst.CSTNode) -> bool:
    decorators = {dotted(d.decorator) for d in getattr(scope, "decorators", ())}
    return bool(decorators & {"staticmethod", "classmethod"})


def _prepare_other_training_functions(ctx: Context, prepare_scope: Scope) -> None:
    """A script with several training functions, each building its own optimizer for the model
    it receives (``train(model, ...)``, then ``train_knowledge_distillation(teacher, student,
    ...)``): each prepares what it trains with, as the first does. Left alone, the others'
    models would train unsynchronised on every rank while their device moves are removed."""
    if ctx.acc.startswith("self."):
        return
    placement = ctx.facts.placement
    first_anchor = ctx.prepare_anchor
    done: list[Scope] = [prepare_scope]
    for binding in ctx.model.of_kind(Kind.OPTIMIZER):
        scope = binding.scope
        if binding.received or not isinstance(scope, cst.FunctionDef) or scope in done:
            continue
        if _returned_by(ctx, binding.value, done):
            continue  # ``model, opt, ... = setup(cfg)``: prepared in setup(), where it is made
        if placement.is_method(scope) or any(placement.inside(scope, d) for d in done):
            continue
        if not any(placement.inside(call, scope) for call in ctx.model.backward_calls):
            continue
        done.append(scope)
        reason = _why_not_prepare_in(ctx, scope, parameter_owners(binding))
        if reason is None:
            prepare.run(ctx, scope)
            continue
        ctx.plan.review(
            binding.line,
            f"{scope.name.value}() builds {binding.name} and trains with it, but nothing is "
            f"prepared there: {reason}; it trains what it is handed as it is, on every rank "
            "(not data-parallel); prepare its model, optimizer and loader once, where they "
            "are made, and hand the prepared ones in",
        )
    ctx.prepare_anchor = first_anchor


def _returned_by(ctx: Context, value: cst.BaseExpression | None, done: list[Scope]) -> bool:
    """``value`` is what a call of a function that already prepares returns: the objects it
    hands back are the prepared ones, and preparing them again would wrap the model twice."""
    made = callee(ctx.model, value) if isinstance(value, cst.Call) else None
    return made is not None and made[0] in done


def _why_not_prepare_in(ctx: Context, scope: cst.FunctionDef, trained: set[str]) -> str | None:
    """None when ``scope`` may prepare what it trains: every call of it in the file is reached
    by every rank (``prepare`` is a collective), none runs in a loop, and each hands it a model
    nobody prepared yet and no other call hands (a model prepared twice is wrapped twice);
    else why not."""
    placement, flow = ctx.facts.placement, ctx.facts.flow
    calls = [call for call, _ in flow.calls_of(scope)]
    if not calls:
        return "nothing in this file calls it"
    handed: list[tuple[str | None, int]] = []
    for call in calls:
        caller = placement.enclosing_function(call)
        if ctx.facts.ranks.divergent_branch(call, caller) is not None:
            return f"line {ctx.line(call)} calls it under a condition the ranks may disagree on"
        if any(isinstance(a, (cst.For, cst.While)) for a in _ancestors_within(ctx, call, caller)):
            return f"line {ctx.line(call)} calls it in a loop (its model would be wrapped again)"
        for parameter, argument in bound_arguments(scope, call):
            if parameter not in trained:
                continue
            name = dotted(argument.value)
            made = made_for(ctx.model, name, call) if name is not None else None
            if any(
                seen == name and (made is None or made_at in (0, id(made)))
                for seen, made_at in handed
            ):
                return f"{name} is handed to it more than once (it would be wrapped twice)"
            handed.append((name, id(made) if made is not None else 0))
            anchor = ctx.prepared_after.get(name) if name in ctx.plan.prepared else None
            where = placement.enclosing_function(anchor) if anchor is not None else None
            if name in ctx.plan.prepared and (anchor is None or where is caller):
                return f"line {ctx.line(call)} hands it {name}, prepared already"
    return None


def _ancestors_within(
    ctx: Context, node: cst.CSTNode, scope: cst.CSTNode | None
) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for ancestor in ctx.model.ancestors(node):
        if ancestor is scope:
            break
        found.append(ancestor)
    return found


def _trains_itself(ctx: Context) -> bool:
    """A model whose own method runs the backward (``layer.train(x_pos, x_neg)`` of a
    forward-forward layer) and whose gradients cannot be averaged by hand
    (`accelify.analysis.self_training`): wrapped by ``prepare`` it loses that method, and
    unwrapped its gradients are never synchronised. Left as it is, with the reason."""
    blocked = [entry for entry in ctx.facts.self_training if entry.blocker is not None]
    for entry in blocked:
        ctx.plan.review(
            ctx.line(entry.backward_calls[0]),
            f"{entry.name} trains itself in its own method, and its gradients cannot be "
            f"averaged by hand here: {entry.blocker}. Left as it is: once prepared, the DDP "
            "wrapper has no such method, and called unwrapped its gradients are never "
            "synchronised across ranks; move the training step out of the model class "
            "(forward through the prepared model), then convert",
        )
    return bool(blocked)
